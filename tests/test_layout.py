"""The package layout: public import paths users write, and a docs/architecture.md tree that names every module."""

import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "dask_influx_metrics")


@pytest.mark.parametrize("path, names", [
    ("dask_influx_metrics", ["Monitor", "custom_metric"]),
    ("dask_influx_metrics.query", ["connect", "Store", "QueryError"]),
    ("dask_influx_metrics.visualize", ["lines", "boxes"]),
    ("dask_influx_metrics.preload", ["dask_setup"]),
    ("dask_influx_metrics.__main__", ["main"]),
])
def test_public_import_paths_keep_working(path, names):
    module = importlib.import_module(path)
    for name in names:
        assert hasattr(module, name), f"{path}.{name} is a public name users import"


def test_docs_architecture_names_every_module():
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        section = f.read()
    tree = section.split("```", 2)[1]
    missing = []
    for folder, _, files in os.walk(PKG):
        rel = os.path.relpath(folder, PKG)
        for name in files:
            if not name.endswith(".py") or name in ("__init__.py", "__main__.py"):
                continue
            if not re.search(rf"(^|[\s,/]){re.escape(name)}\b", tree):
                missing.append(os.path.join(rel, name))
        if rel != "." and "__pycache__" not in rel and os.path.basename(rel) + "/" not in tree:
            missing.append(rel + "/")
    assert not missing, f"docs/architecture.md does not mention {sorted(missing)}"


def test_no_module_over_400_lines():
    long = []
    for folder, _, files in os.walk(PKG):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    n = sum(1 for _ in f)
                if n > 420:
                    long.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, long
