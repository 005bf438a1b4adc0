"""Small tmpfs mounts for fault tests: a full ``/dev/shm`` (issue 43) without touching the machine's own.

A command runs in a mount namespace of its own (``unshare -m``, root or CAP_SYS_ADMIN) where each folder named
in ``mounts`` is a fresh tmpfs of the given size; the mounts vanish with the namespace, whatever happens to the
command. :func:`why_not` says why that cannot be done here (tests skip with it).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import tempfile


@functools.lru_cache(maxsize=1)
def why_not() -> str | None:
    """None when a tmpfs can be mounted in a private mount namespace here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare command (util-linux)"
    with tempfile.TemporaryDirectory() as d:
        try:
            run_in_tmpfs(["true"], {d: "64k"}, timeout=30).check_returncode()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            return f"cannot mount a tmpfs in a private mount namespace (unshare -m needs root or CAP_SYS_ADMIN): {e}"
    return None


def run_in_tmpfs(argv: list[str], mounts: dict, env: dict | None = None, timeout: float = 120.0, **kw):
    """``argv`` with each folder of ``mounts`` (``{folder: size}``, size as mount(8) takes it: ``2m``) a fresh
    tmpfs, seen by it and its children only; the completed process (output captured as text)."""
    setup = " && ".join(
        f"mkdir -p {shlex.quote(str(d))} && mount -t tmpfs -o size={size},mode=0755 tmpfs {shlex.quote(str(d))}"
        for d, size in mounts.items()
    )
    script = f'{setup} && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *map(str, argv)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
