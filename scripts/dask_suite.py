"""Distributed's own tests with the monitor on every scheduler, and what it changed (run by dask-suite.sh).

``python scripts/dask_suite.py --python V/bin/python --src SRC [--plain] [--all] [FILE ...]`` runs pytest in
``SRC`` (a checkout of dask/distributed) with that interpreter, on :data:`SUBSET` (``--all``: the ten files of
issue 48; or the files given), with ``distributed.scheduler.preload: [dask_influx_metrics.preload]`` from the
environment (simulated GPUs, the spool sink into a temporary folder), so every scheduler a test builds is
monitored from boot. The suite itself turns warnings into errors.

It fails (exit 1) on a test that passes without the monitor: each test that failed monitored is run again
plain, and one that passes plain is run monitored once more; failing again there, it is the monitor's doing.
A test that fails plain too is reported, not counted (the suite's own flakiness or this machine's). The
differences the data contract documents (:data:`DOCUMENTED`: the task annotation) are expected, and must
fail for that reason only. It also fails when a scheduler was not monitored: a second preload
(``dask_suite_count.py``) counts the schedulers, and the spool must hold one session per scheduler.
``--plain`` runs the files without the monitor (counts and wall time only).

Why rerun failures rather than compare with a plain run of everything, or a committed list of its failures:
a plain run of everything doubles the time for a handful of tests; a committed list goes stale with the
machine and flakes either way. Only the failures are run twice more.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
TEN = (  # issue 48: the files distributed's plugins, spans, workers and nannies are tested in
    "distributed/tests/test_spans.py",
    "distributed/tests/test_cancelled_state.py",
    "distributed/tests/test_resources.py",
    "distributed/tests/test_worker_metrics.py",
    "distributed/diagnostics/tests/test_worker_plugin.py",
    "distributed/diagnostics/tests/test_scheduler_plugin.py",
    "distributed/diagnostics/tests/test_task_stream.py",
    "distributed/tests/test_steal.py",
    "distributed/tests/test_nanny.py",
    "distributed/tests/test_active_memory_manager.py",
)
# What CI runs (~2 of the ~4 minutes of the ten on 2 cores): every file but test_steal.py and
# test_nanny.py whole (half the time: work stealing and the nanny's process handling, which the
# monitor does not touch), and of test_nanny.py the tests of a scheduler stopped without close(),
# of nanny restarts (a worker process, and its agent, replaced), of worker plugins on nannies and of
# what a worker process imports.
SUBSET = tuple(f for f in TEN if not f.endswith(("test_steal.py", "test_nanny.py"))) + (
    "distributed/tests/test_nanny.py::test_scheduler_file",
    "distributed/tests/test_nanny.py::test_nanny_restart",
    "distributed/tests/test_nanny.py::test_nanny_restart_timeout",
    "distributed/tests/test_nanny.py::test_nanny_process_failure",
    "distributed/tests/test_nanny.py::test_nanny_plugin_simple",
    "distributed/tests/test_nanny.py::test_worker_start_exception",
    "distributed/tests/test_nanny.py::test_no_unnecessary_imports_on_worker",
)
# Differences the data contract documents: test id -> its failure message must match this, whole.
DOCUMENTED = {
    # every task carries the influx_metrics annotation (job, DAG, session: docs/data-contract.md); the test
    # compares a task's annotations exactly: the one item more, and nothing else, is ours
    "distributed/tests/test_spans.py::test_spans": (
        r"(?s)AssertionError: assert \{'influx_metr.* == .*Left contains 1 more item:"
        r"\s*\{'influx_metrics': \{'(dag|job|session)': [^{}]*\}\}\s*(Use -v to get more diff)?\s*"
        # under CI=true (or -vv) pytest adds the full diff: the same one item, nothing else
        r"(Full diff: \(-: missing in left side, \+: extra in left side\)\s*- \{\}\s*"
        r"\+ \{\s*\+\s*'influx_metrics': \{[^{}]*\},\s*\+ \}\s*)?"
    ),
}
PYTEST = ["-p", "no:cacheprovider", "--timeout=120", "--timeout-method=signal", "-q", "--color=no"]


def monitored_env(spool: str, schedulers: str) -> dict:
    """The environment of a monitored run: our preload, then the counting one, on every scheduler."""
    preloads = ["dask_influx_metrics.preload", os.path.join(HERE, "dask_suite_count.py")]
    return {
        "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": json.dumps(preloads),
        "DASK_INFLUX_METRICS__GPU__SOURCE": "simulated",
        "DASK_INFLUX_METRICS__SINK": "spool",
        "DASK_INFLUX_METRICS__SPOOL__DIRECTORY": spool,
        "DASK_SUITE_SCHEDULERS": schedulers,
    }


def run_pytest(python: str, src: str, tests: list[str], junit: str, env: dict | None) -> float:
    """Run ``tests`` in ``src``; the wall time in s. ``env``: added to this environment (None: plain)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_INFLUX_METRICS__", "DASK_DISTRIBUTED__"))}
    started = time.monotonic()
    subprocess.run(
        [python, "-m", "pytest", *PYTEST, f"--junitxml={junit}", *tests], cwd=src, env={**clean, **(env or {})}
    )
    return time.monotonic() - started


def outcomes(junit: str, src: str) -> dict[str, tuple[str, str]]:
    """``{test id: (outcome, message)}`` from a JUnit XML file; outcome: passed, failed, skipped."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            out[test_id(case, src)] = ("failed", bad.get("message") or "")
        elif skipped is not None:
            out[test_id(case, src)] = ("skipped", skipped.get("message") or "")
        else:
            out[test_id(case, src)] = ("passed", "")
    return out


def test_id(case, src: str) -> str:
    """``path/to/test_x.py::[Class::]name`` of a JUnit test case (classname ``path.to.test_x[.Class]``)."""
    parts = case.get("classname", "").split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if os.path.isfile(os.path.join(src, path)):
            return "::".join([path, *parts[i:], case.get("name", "")])
    return "::".join([*parts, case.get("name", "")])


def counts(results: dict) -> dict:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome, _ in results.values():
        out[outcome] += 1
    return out


def documented(test: str, message: str) -> bool:
    """Whether ``test`` failed only for a difference the data contract documents."""
    pattern = DOCUMENTED.get(test)
    return pattern is not None and re.fullmatch(pattern, message) is not None


def unmonitored(schedulers: str, spool: str) -> tuple[int, list[str]]:
    """How many schedulers started (``dask_suite_count.py``'s lines: address, session id, test), and those
    not monitored: no session started on it, or its session left nothing in the spool."""
    with open(schedulers) if os.path.exists(schedulers) else open(os.devnull) as f:
        lines = [line.split(" ", 2) for line in f.read().splitlines() if line.strip()]
    missing = [
        f"{a} in {t} ({'no session' if s == '-' else f'session {s}: nothing in the spool'})"
        for a, s, t in lines
        if s == "-" or not os.path.isdir(os.path.join(spool, s))
    ]
    return len(lines), missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="the interpreter of the venv distributed's tests run in")
    p.add_argument("--src", required=True, help="the distributed checkout (its tests and pyproject)")
    p.add_argument("--plain", action="store_true", help="without the monitor: counts and wall time only")
    p.add_argument("--all", action="store_true", help="the ten files of issue 48 (default: the CI subset)")
    p.add_argument("tests", nargs="*", help="test files or ids instead")
    p.add_argument("--keep", metavar="DIR", help="keep the spool, the JUnit files and the scheduler list here")
    args = p.parse_args(argv)
    args.python, args.src = os.path.abspath(args.python), os.path.abspath(args.src)  # pytest runs in src
    tests = list(args.tests or (TEN if args.all else SUBSET))
    with tempfile.TemporaryDirectory(prefix="dask-suite-") as tmp:
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            tmp = os.path.abspath(args.keep)
        spool, schedulers = os.path.join(tmp, "spool"), os.path.join(tmp, "schedulers")
        env = None if args.plain else monitored_env(spool, schedulers)
        wall = run_pytest(args.python, args.src, tests, os.path.join(tmp, "run.xml"), env)
        results = outcomes(os.path.join(tmp, "run.xml"), args.src)
        print(f"\ndask-suite: {'plain' if args.plain else 'monitored'}: {counts(results)} in {wall:.1f} s")
        if args.plain:
            return 0
        failed = {t: m for t, (o, m) in results.items() if o == "failed"}
        expected = sorted(t for t, m in failed.items() if documented(t, m))
        suspects = sorted(set(failed) - set(expected))
        ours, not_ours = [], []
        if suspects:
            print(f"dask-suite: {len(suspects)} failed monitored; each again, plain")
            run_pytest(args.python, args.src, suspects, os.path.join(tmp, "plain.xml"), None)
            plain = outcomes(os.path.join(tmp, "plain.xml"), args.src)
            not_ours = [t for t in suspects if plain.get(t, ("failed",))[0] == "failed"]
            again = [t for t in suspects if t not in not_ours]
            if again:
                print(f"dask-suite: {len(again)} passed plain; each again, monitored")
                run_pytest(args.python, args.src, again, os.path.join(tmp, "again.xml"), env)
                second = outcomes(os.path.join(tmp, "again.xml"), args.src)
                ours = [t for t in again if second.get(t, ("failed",))[0] == "failed"]
        built, missing = unmonitored(schedulers, spool)
        for t in expected:
            print(f"dask-suite: expected (documented in docs/data-contract.md): {t}")
        for t in not_ours:
            print(f"dask-suite: fails without the monitor too (not counted): {t}")
        for t in ours:
            print(f"dask-suite: FAILS ONLY WITH THE MONITOR: {t}: {failed[t][:300]}")
        print(f"dask-suite: {built} schedulers started, {built - len(missing)} with their session in the spool")
        for m in missing:
            print(f"dask-suite: NOT MONITORED: scheduler {m}")
        if built == 0 or missing:
            return 1
        return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
