"""names.key_prefix: Dask's prefix rule, held to Dask's own function, without importing Dask in the agent."""

import os
import subprocess
import sys

import pytest
from dask.utils import key_split

from dask_influx_metrics import config
from dask_influx_metrics.names import key_prefix

# dask.utils.key_split's own examples, what collections name their tasks, and odd ones
WORDS = (
    "x x-1 x-1-2-3 ('x-2',_1) ('x',_1) hello-world-1 ae05086432ca935f6eba409a8ecd4896 x-abcdefab _(x) "
    "<module.submodule.myclass_object_at_0xdaf372> finalize-9f0e8d7c inc-deadbeef read-parquet-xyz1 small_task-3 "
    "_slow-77 0abc-x - lambda-<locals> ÿ-ü-1 TAG-Word-ABCDEFAB a-abcdefab a-abcdefaa-b a-ABCDEFAB-b"
)
KEYS = [w.replace("_", " ") if w[0] in "(<" else w for w in WORDS.split()] + [
    b"hello-world-1",
    None,
    "",
    42,
    3.5,
    ("x",),
    ("",),
    ("(", 1),
    "x" * 32,
    "f" * 32,
    "0" * 32 + "-x",
    ("random_sample-3b1f0c9e2d5a4b6c8e7f9a0b1c2d3e4f", 0, 1),
    ("sum-aggregate-1c0d", 2),
    ("getitem-abcdefab-cafe", 1),
]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_key_prefix_is_dasks_rule(key):
    assert key_prefix(key) == key_split(key)


def test_live_figures_name_prefixes_without_importing_dask():
    """The agent's live entries name the prefixes its workers execute; Dask stays out of the agent."""
    code = (
        "import sys, dask_influx_metrics.agent.process\n"
        "from dask_influx_metrics.sampling.live import LiveFigures\n"
        "from dask_influx_metrics.link.snapshot import Snapshot\n"
        "class View:\n"
        "    id, address, uuids = '7', 'tcp://w:1', []\n"
        "    snapshot = staticmethod(lambda: Snapshot(((('inc-1f2e', 0), 2, 5), ('sum-3', 2, 5)), 2, 0, 2))\n"
        "live = LiveFigures(); live.update([View()], [], now=0.0)\n"
        "print(live.entries['7']['prefixes'], sorted(m for m in sys.modules if m.split('.')[0] == 'dask'))"
    )
    env = {**os.environ, config.AGENT_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['inc', 'sum'] []"
