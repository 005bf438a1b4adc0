"""The package layout: public import paths users write, and a docs/architecture.md tree that names every module."""

import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "dask_influx_metrics")


@pytest.mark.parametrize(
    "path, names",
    [
        ("dask_influx_metrics", ["Monitor", "custom_metric"]),
        ("dask_influx_metrics.query", ["connect", "Store", "QueryError"]),
        ("dask_influx_metrics.visualize", ["lines", "boxes"]),
        ("dask_influx_metrics.preload", ["dask_setup"]),
        ("dask_influx_metrics.__main__", ["main"]),
    ],
)
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


def test_no_module_over_500_lines():
    long = []
    for folder, _, files in os.walk(PKG):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    n = sum(1 for _ in f)
                if n > 500:
                    long.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, long


def import_graph() -> dict:
    """``{module: the package's modules it imports}``, read from the source (lazy imports too)."""
    import ast
    import pathlib

    graph = {}
    for path in pathlib.Path(PKG).rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                deps |= ({target} if node.module else set()) | {f"{target}.{a.name}" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dask_influx_metrics"):
                deps |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[module] = deps
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_no_import_circle_and_no_back_arrow():
    """The package's modules import each other without a cycle. Arrows point from the user towards the
    samplers (client -> scheduler -> worker -> agent -> the sampling library -> the shared top level), never
    back; the worker never imports the agent process (both use the sampling library); the shared modules
    import no process folder (only the public entry points re-export them)."""
    graph = import_graph()
    order = ["client", "scheduler", "worker", "agent", "sampling"]  # who may import whom: later ones only
    # public paths re-exporting, and the demo
    entry = {"", "__main__", "query", "visualize", "preload", "mlflow", "demo"}

    def kind(m):
        part = (m.split(".") + [""])[1]
        return part if part in order or part in entry else "shared"

    back = sorted(
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if kind(d) in order
        and kind(m) not in entry
        and (
            kind(m) == "shared"
            or order.index(kind(d)) < order.index(kind(m))
            or (kind(m), kind(d)) == ("worker", "agent")
        )
    )
    assert not back, back
    seen, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError(f"import circle: {' -> '.join(stack[stack.index(m) :] + [m])}")
        if m in seen:
            return
        stack.append(m)
        for d in graph[m]:
            visit(d)
        stack.pop()
        seen.add(m)

    for m in sorted(graph):
        visit(m)
    # the Store reads; the analyses take it and import it, never the reverse (issue 46)
    served = sorted(
        (m, d)
        for m, deps in graph.items()
        if m.startswith("dask_influx_metrics.client.query")
        for d in deps
        if d.startswith("dask_influx_metrics.client.") and not d.startswith("dask_influx_metrics.client.query")
    )
    assert not served, served


def test_the_worker_builds_no_sampler_sink_gpu_source_or_collector():
    """Thread mode builds the host-sampling core (``sampling.host``), as the agent does: nothing under
    ``worker/`` imports what it assembles."""
    built = ("sampling.sampler", "sampling.collect", "sampling.gpus", "sampling.sources", "sinks.factory")
    graph = import_graph()
    worker = {m: deps for m, deps in graph.items() if m.startswith("dask_influx_metrics.worker.")}
    assert worker, "the worker modules were found"
    wrong = sorted(
        (m, d) for m, deps in worker.items() for d in deps if d.removeprefix("dask_influx_metrics.").startswith(built)
    )
    assert not wrong, wrong
    assert "dask_influx_metrics.sinks" not in set().union(*worker.values()), "the sinks package imports its factory"
