"""A fresh venv that sees this test environment's installed packages (one ``.pth`` line, nothing
downloaded), so a test installs only the package itself into it, as a user would."""

import os
import subprocess
import sys
import sysconfig


def fresh_venv(folder) -> str:
    """Create a venv in ``folder`` (no pip of its own) and return its ``python``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = os.path.join(str(folder), "bin", "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with open(os.path.join(site, "deps.pth"), "w") as f:  # a path line: .pth files there are not run
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return python
