"""How much code a sample runs: the functions the agent's sampling thread enters per sample, against the
minimal sampler's (issue 46), on :mod:`benchmarks.hostcost`'s cluster.

``hostcost``'s CPU figures move between runs of the same code by more than one change saves on this VM
(whole runs by ~0.1x); what a sample executes does not. A ``sitecustomize`` written first on the replay's
``PYTHONPATH`` (``tests/nvml_shim.py``) installs, in the agent process and in the minimal sampler only
(``sys.orig_argv``), a profile function on their sampling thread (the agent's ``influx-metrics-agent``, the
minimal's main thread) that counts, between one ``time.sleep`` (a sample's end) and the next, over
:data:`SAMPLES` samples after :data:`SKIP`: each Python function entered (a generator resumed counts too), each C
function called, the distinct Python functions, and each bytecode executed (``sys.settrace``'s opcode events:
how much Python a sample runs, which a function count hides in loops). The replay's own code (``tests/fake_nvml.py``, the
``pynvml`` shim) is left out: a GPU host runs the real ``pynvml``'s, which is counted. Idle workers, every
metric @100 ms, UDP into a bound loopback socket nobody reads; 1 GPU + 1 worker and 1 GPU + 4 workers; the
difference between them is the cost of each worker beyond the first. ``python -m benchmarks.hostcalls``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import tempfile
import time

from benchmarks import common, hostcost

NAME = "hostcalls"
SETUPS = ((1, 1), (1, 4))
SKIP, SAMPLES = 30, 100  # samples before counting (start-up, the first looks), samples counted
FILE_WAIT_S = 60.0

# Runs in every process started with the replay's environment; it counts only where HOSTCALLS_DIR is set and
# the process is the agent or the minimal sampler.
SITECUSTOMIZE = '''"""benchmarks/hostcalls.py: counts the calls of a sampling thread per sample."""
import collections, json, os, sys, threading, time

_out = os.environ.get("HOSTCALLS_DIR")
_argv = " ".join(getattr(sys, "orig_argv", ()))
_role = "agent" if "dask_influx_metrics.agent" in _argv else "minimal" if "benchmarks.minimal" in _argv else None


def _counter(role, skip, samples):
    sleep, seen, state = time.sleep, set(), {"n": -skip, "py": 0, "c": 0, "ops": 0}
    modules, ops = collections.Counter(), collections.Counter()

    def profile(frame, event, arg):
        if event == "c_call" and arg is sleep:
            state["n"] += 1
            if state["n"] == samples:
                sys.setprofile(None)
                sys.settrace(None)
                n = state["n"]
                out = {"role": role, "samples": n, "python": state["py"] / n, "c": state["c"] / n,
                       "distinct": len(seen), "modules": {k: v / n for k, v in modules.most_common()},
                       "bytecodes": state["ops"] / n, "bytecodes_by": {k: v / n for k, v in ops.most_common()}}
                with open(os.path.join(_out, f"{role}.{os.getpid()}.json"), "w") as f:
                    json.dump(out, f)
            return
        if state["n"] < 0 or event not in ("call", "c_call"):
            return
        code = frame.f_code
        path = code.co_filename
        if "fake_nvml" in path or path.endswith("shim/pynvml.py"):  # the replay's own: no GPU host runs it
            return
        if event == "c_call":
            state["c"] += 1
        else:
            state["py"] += 1
            seen.add(code)
            modules["/".join(path.split("/")[-2:])] += 1

    def trace(frame, event, arg):  # each bytecode a sample executes, by function (the replay's left out)
        code = frame.f_code
        if "fake_nvml" in code.co_filename or code.co_filename.endswith("shim/pynvml.py"):
            return None
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        name = code.co_filename.split("/")[-1] + ":" + code.co_qualname

        def opcode(frame, event, arg):
            if event == "opcode" and state["n"] >= 0:
                state["ops"] += 1
                ops[name] += 1
            return opcode

        return opcode

    return profile, trace


def _install(role, skip, samples):
    profile, trace = _counter(role, skip, samples)
    sys.setprofile(profile)
    sys.settrace(trace)


if _out and _role == "minimal":
    _install(_role, %(skip)d, %(samples)d)
elif _out and _role == "agent":
    def _first(frame, event, arg):  # each new thread: only the sampling thread keeps a counter
        if threading.current_thread().name == "influx-metrics-agent":
            _install(_role, %(skip)d, %(samples)d)
        else:
            sys.setprofile(None)
    threading.setprofile(_first)
'''


def _wait_for(folder: str, role: str) -> dict:
    deadline = time.monotonic() + FILE_WAIT_S
    while time.monotonic() < deadline:
        for path in glob.glob(os.path.join(folder, f"{role}.*.json")):
            with open(path) as f:
                return json.load(f)
        time.sleep(0.2)
    raise RuntimeError(f"no count from the {role} within {FILE_WAIT_S:.0f} s")


def measure(gpus: int, n: int, address: str) -> dict:
    """``{"agent": counts, "minimal": counts}`` of one setup (see the module docstring)."""
    from dask_influx_metrics import Monitor

    ledgers, out = tempfile.mkdtemp(prefix="hostcalls-"), tempfile.mkdtemp(prefix="hostcalls-out-")
    saved = os.environ.get("HOSTCALLS_DIR")
    os.environ["HOSTCALLS_DIR"] = out
    try:
        with hostcost._cluster(gpus, n, ledgers) as client:
            with open(os.path.join(ledgers, "shim", "sitecustomize.py"), "w") as f:  # the agent starts after this
                f.write(SITECUSTOMIZE % {"skip": SKIP, "samples": SAMPLES})
            m = Monitor(client, sink="udp", telegraf_address=address, gpu_source="nvml")
            m.attach(polling_interval=hostcost.INTERVAL_MS)
            m.start()
            try:
                agent = _wait_for(out, "agent")
            finally:
                m.shutdown()
            host, port = address.split(":")
            with hostcost._minimal(client, ledgers, (host, int(port))):
                minimal = _wait_for(out, "minimal")
        return {"agent": agent, "minimal": minimal}
    finally:
        os.environ.pop("HOSTCALLS_DIR") if saved is None else os.environ.__setitem__("HOSTCALLS_DIR", saved)
        for folder in (ledgers, out):
            shutil.rmtree(folder, ignore_errors=True)


def _top(modules: dict, k: int = 6) -> str:
    return ", ".join(f"{m} {v:.1f}" for m, v in list(modules.items())[:k])


KINDS = {  # what a row counts (its key in the counts): its words, its unit
    "python": ("Python functions entered per sample", "calls"),
    "bytecodes": ("bytecodes executed per sample (our Python and the libraries', the replay's left out)", "ops"),
}


def _row(kind: str, what: str, agent: float, minimal: float, notes: str, details=None) -> dict:
    words, unit = KINDS[kind]
    what += f": {words}, the agent's sampling thread vs the minimal sampler"
    return common.row(NAME, what, round(agent, 1), unit, round(minimal, 1), notes=notes, details=details)


def run(quick: bool) -> list[dict]:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    address = "%s:%d" % receiver.getsockname()
    try:
        counted = {setup: measure(*setup, address) for setup in SETUPS}
    finally:
        receiver.close()
    rows = []
    for (gpus, n), c in counted.items():
        a, b = c["agent"], c["minimal"]
        what = f"{gpus} GPU{'s' * (gpus != 1)} + {n} idle worker{'s' * (n != 1)}, H200 cost mode, every metric @100 ms"
        notes = (
            f"C functions {a['c']:.0f} vs {b['c']:.0f}; distinct Python functions {a['distinct']} vs {b['distinct']}; "
            f"the agent's by module: {_top(a['modules'])}"
        )
        # by module and function: in the JSON
        rows.append(_row("python", what, a["python"], b["python"], notes, details=c))
        notes = f"the agent's by function: {_top(a['bytecodes_by'])}"
        rows.append(_row("bytecodes", what, a["bytecodes"], b["bytecodes"], notes))
    (g1, n1), (g4, n4) = SETUPS
    one, four = counted[g1, n1], counted[g4, n4]
    keys = ("python", "c", "bytecodes")
    per = {(k, f): (four[k][f] - one[k][f]) / (n4 - n1) for k in ("agent", "minimal") for f in keys}
    what = "each idle worker beyond the first (1 GPU)"
    notes = f"C functions {per['agent', 'c']:.0f} vs {per['minimal', 'c']:.0f}"
    rows.append(_row("python", what, per["agent", "python"], per["minimal", "python"], notes))
    rows.append(_row("bytecodes", what, per["agent", "bytecodes"], per["minimal", "bytecodes"], ""))
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
