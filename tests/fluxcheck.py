"""Check Flux with the real Flux language server (``scripts/flux_check.mjs``).

``flux_diagnostics({"name": source})`` returns ``{"name": ["line:col severity: message"]}``
(an empty list: no findings). ``scripts/setup.sh`` installs the pinned npm package
``@influxdata/flux-lsp-node`` into ``.tools/flux``; when node or the package is missing the
calling test is skipped, or fails under ``CI=true``. See the script's header for what the
server checks and what it does not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
SCRIPT = os.path.join(ROOT, "scripts", "flux_check.mjs")
PACKAGE = os.path.join(ROOT, ".tools", "flux", "node_modules", "@influxdata", "flux-lsp-node")
TIMEOUT_S = 60
FENCE = re.compile(r"^```(\w+)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def _unavailable(message: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def flux_diagnostics(sources: dict[str, str]) -> dict[str, list[str]]:
    """Diagnostics of each Flux source, each checked on its own."""
    node = shutil.which("node")
    if not node:
        _unavailable("node not found (the Flux checker runs on Node.js; see scripts/setup.sh)")
    if not os.path.exists(os.path.join(PACKAGE, "package.json")):
        _unavailable(f"{os.path.relpath(PACKAGE, ROOT)} missing: run scripts/setup.sh")
    out = subprocess.run([node, SCRIPT], input=json.dumps(sources), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, f"flux_check.mjs failed ({out.returncode}): {out.stderr}"
    result = json.loads(out.stdout)
    assert set(result) == set(sources), out.stdout
    return result


def fenced_blocks(text: str, language: str) -> list[tuple[int, str]]:
    """(line number, body) of every ```language fenced block in a Markdown text."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == language]
