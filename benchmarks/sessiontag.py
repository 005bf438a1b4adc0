"""What the ``session`` tag costs a sender: bytes per line, and CPU per sample to encode them.

The same full samples of a simulated worker (8 GPU lines, host, worker; every metric; values and
timestamps varied per sample, each point with its own dicts, as ``benchmarks.encode`` makes them)
encoded with ``lineprotocol.encode_many`` and joined into one payload, as the agent's sink does,
with and without the session tag (``,session=<29-character id>``); rounds alternate, each
``samples`` samples, thread CPU per sample; median per variant and per-round ratio median with its
95 % interval. Targets (issue 45): <= 40 bytes more per line, and nothing measurable per sample
(ratio <= 1.05, what two rounds of the same variant differ by on a shared machine).

Run: ``.venv/bin/python -m benchmarks.sessiontag [--quick]``.
"""

from __future__ import annotations

import time

from benchmarks import common
from benchmarks.encode import make_samples

NAME = "sessiontag"
BYTES_TARGET = 40
RATIO_TARGET = 1.05


def _without(samples: list) -> list:
    return [[p._replace(tags={k: v for k, v in p.tags.items() if k != "session"}) for p in s] for s in samples]


def _cpu_per_sample(samples: list) -> float:
    """Thread-CPU microseconds per sample to encode and join every sample once."""
    from dask_influx_metrics import lineprotocol

    t = time.thread_time_ns()
    for sample in samples:
        b"\n".join(lineprotocol.encode_many(sample))
    return (time.thread_time_ns() - t) / 1000 / len(samples)


def run(quick: bool) -> list[dict]:
    from dask_influx_metrics import lineprotocol

    points, rounds = (20_000, 5) if quick else (100_000, 15)
    tagged = make_samples(points)
    assert all("session" in p.tags for s in tagged for p in s), "the benchmark's writer must tag sessions"
    plain = _without(tagged)
    lines = {name: [line for s in samples for line in lineprotocol.encode_many(s)] for name, samples in
             (("tagged", tagged), ("plain", plain))}  # fmt: skip
    per_line = {name: sum(map(len, ls)) / len(ls) for name, ls in lines.items()}
    extra = per_line["tagged"] - per_line["plain"]
    _cpu_per_sample(tagged), _cpu_per_sample(plain)  # warm the encoder's caches alike
    got = common.alternate({"tagged": lambda: _cpu_per_sample(tagged), "plain": lambda: _cpu_per_sample(plain)}, rounds)
    ratios = [a / b for a, b in zip(got["tagged"], got["plain"])]
    tagged_us, plain_us = common.median(got["tagged"]), common.median(got["plain"])
    interval = common.median_interval(ratios)
    shown = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "n/a"
    samples = len(tagged)
    return [
        common.row(
            NAME,
            "bytes per line with the session tag vs without (every metric, 8 simulated GPUs)",
            round(per_line["tagged"], 1),
            "bytes/line",
            baseline=round(per_line["plain"], 1),
            target=f"<= +{BYTES_TARGET} bytes",
            met=extra <= BYTES_TARGET,
            notes=f"+{extra:.1f} bytes a line ({len(lines['tagged'])} lines)",
        ),
        common.row(
            NAME,
            "CPU per sample to encode + join a full sample, with the session tag vs without",
            round(tagged_us, 1),
            "us/sample",
            baseline=round(plain_us, 1),
            target=f"<= {RATIO_TARGET}x",
            met=tagged_us / plain_us <= RATIO_TARGET,
            notes=f"median of {rounds} alternated rounds of {samples} samples; per-round ratio median "
            f"{common.median(ratios):.3f}, 95 % interval {shown}",
        ),
    ]


if __name__ == "__main__":
    common.standalone(NAME, run)
