"""``import pynvml`` in a child process replays a recording through ``tests/fake_nvml.py``.

:func:`replay_env` writes a ``pynvml.py`` shim and returns the environment that
puts it first on ``PYTHONPATH``: a sampling agent, a worker or a benchmark
started with it reads the recording (default: the H100 shared by two processes,
``tests/data/nvml_h100_shared.json``) through the fake. Its recorded process
PIDs can stand for real ones (``pids``: ``{recorded: real}``; by default the
H100's 'matmul' process, pid 425, stands for ``worker_pid``); ``gpus`` copies
the device to make a node of that many; ``cost`` and ``ledger`` turn on the
fake's cost mode (each call spends the CPU it cost on the H200) and write what
each process spent into ``<ledger>/nvml-<pid>.json``.
"""

import os
import pathlib
import sys

TESTS = pathlib.Path(__file__).parent

SHIM = '''"""Test shim: ``import pynvml`` replays a recording through tests/fake_nvml.py."""
import atexit, importlib.machinery, importlib.util, os, sys

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.machinery.PathFinder.find_spec("pynvml", [p for p in sys.path if os.path.abspath(p or ".") != here])
real = importlib.util.module_from_spec(spec)
sys.modules["pynvml"] = real  # what fake_nvml imports for NVML's constants and error classes
spec.loader.exec_module(real)
sys.path.insert(0, os.environ["FAKE_NVML_TESTS"])
from fake_nvml import FakeNvml

env = os.environ.get
ledger = env("FAKE_NVML_LEDGER") and os.path.join(env("FAKE_NVML_LEDGER"), f"nvml-{os.getpid()}.json")
fake = FakeNvml(env("FAKE_NVML_RECORDING"), phase=env("FAKE_NVML_PHASE") or None, cost=env("FAKE_NVML_COST") or None,
                ledger=ledger)
if env("FAKE_NVML_GPUS"):
    fake.with_gpus(int(env("FAKE_NVML_GPUS")))
fake.map_pids(dict(tuple(int(x) for x in pair.split("=")) for pair in env("FAKE_NVML_PIDS", "").split(",") if pair))
if ledger:
    atexit.register(fake.write_ledger)
sys.modules["pynvml"] = fake  # what `import pynvml` returns to the agent
'''


def replay_env(
    tmp_path,
    worker_pid: int | None = None,
    *,
    recording: str = "nvml_h100_shared.json",
    phase: str | None = None,
    pids: dict | None = None,
    gpus: int | None = None,
    cost: str | None = None,
    ledger=None,
) -> dict:
    """Environment variables under which ``import pynvml`` replays ``recording`` (see the module doc)."""
    shim = pathlib.Path(tmp_path) / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "pynvml.py").write_text(SHIM)
    pids = dict(pids or {})
    if worker_pid is not None:
        pids.setdefault(425, worker_pid)
    return {
        "PYTHONPATH": os.pathsep.join([str(shim), *sys.path]),
        "FAKE_NVML_TESTS": str(TESTS),
        "FAKE_NVML_RECORDING": recording,
        "FAKE_NVML_PHASE": phase or "",
        "FAKE_NVML_PIDS": ",".join(f"{k}={v}" for k, v in pids.items()),
        "FAKE_NVML_GPUS": str(gpus or ""),
        "FAKE_NVML_COST": cost or "",
        "FAKE_NVML_LEDGER": str(ledger or ""),
    }
