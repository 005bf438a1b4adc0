"""``import pynvml`` in a child process replays the recorded H100 shared by two processes.

:func:`replay_env` writes a ``pynvml.py`` shim and returns the environment that
puts it first on ``PYTHONPATH``: a sampling agent, a worker or a benchmark started with
it reads ``tests/data/nvml_h100_shared.json`` through ``tests/fake_nvml.py``,
with the recorded 'matmul' process (pid 425, 4682 MiB) standing for
``worker_pid``.
"""

import os
import pathlib
import sys

TESTS = pathlib.Path(__file__).parent

SHIM = '''"""Test shim: ``import pynvml`` replays a recording through tests/fake_nvml.py."""
import importlib.machinery, importlib.util, os, sys

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.machinery.PathFinder.find_spec("pynvml", [p for p in sys.path if os.path.abspath(p or ".") != here])
real = importlib.util.module_from_spec(spec)
sys.modules["pynvml"] = real  # what fake_nvml imports for NVML's constants and error classes
spec.loader.exec_module(real)
sys.path.insert(0, os.environ["FAKE_NVML_TESTS"])
from fake_nvml import FakeNvml

fake = FakeNvml("nvml_h100_shared.json")
for procs in fake.devices[0]["compute_processes"]:
    for p in procs:
        if p["pid"] == 425:
            p["pid"] = int(os.environ["FAKE_NVML_WORKER_PID"])
sys.modules["pynvml"] = fake  # what `import pynvml` returns to the agent
'''


def replay_env(tmp_path, worker_pid: int) -> dict:
    """Environment variables under which ``import pynvml`` replays the recording (see the module doc)."""
    shim = pathlib.Path(tmp_path) / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "pynvml.py").write_text(SHIM)
    return {
        "PYTHONPATH": os.pathsep.join([str(shim), *sys.path]),
        "FAKE_NVML_TESTS": str(TESTS),
        "FAKE_NVML_WORKER_PID": str(worker_pid),
    }
