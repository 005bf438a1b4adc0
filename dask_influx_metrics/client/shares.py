"""A job's own GPU figures on a shared GPU: the device's readings scaled by its worker's share.

A ``gpu`` point carries the device's readings (``utilization_gpu``, GPM's ``sm_active``, ...: the
whole GPU, every process on it) and, on a GPU several workers or other processes share, once per
``gpu.process-interval`` (1 s), the worker's ``worker_gpu_share``: its process tree's share of the
GPU's kernel time over that window. Per job, DAG and task prefix, readers show both:

- ``<field>``: the job's **own** figure: the device's reading x the share of the worker that ran
  the job, for the fields of :data:`~dask_influx_metrics.schema.SHARE_SCALED`. A process that only
  holds memory reads ~0; the shares of one GPU's workers sum to at most 100 %, so their jobs' own
  figures sum to at most the device's.
- ``device_<field>``: the device's reading itself at the samples at which the job ran (the union
  figure: whoever used the GPU then).

Which share a sample gets (:func:`factors`): that of the share point whose window covers it (the
first of its worker and GPU at or after it), else the latest before it, at most
:data:`TOLERANCE_S` away. A worker that never had a share point on that GPU did not share it: its
own figures are the device's. One that had some, but none near a sample (the first window of a
shared GPU, a failed per-process read), has no own figure there: left out, and said.

>>> import pandas as pd
>>> s = pd.DataFrame({"time": [0, 1_000_000_000, 2_000_000_000, 0], "worker": ["a", "a", "a", "b"],
...                   "index": "0", "worker_gpu_share": [None, 25.0, None, None], "sm_active": 80.0})
>>> own(s, ["worker", "index"])[["worker", "sm_active", "device_sm_active"]].values.tolist()
[['a', 20.0, 80.0], ['a', 20.0, 80.0], ['a', 20.0, 80.0], ['b', 80.0, 80.0]]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import schema

SHARE = "worker_gpu_share"
DEVICE = "device_"  # the prefix of the device-wide figures
# A share point covers the samples of its window (gpu.process-interval, 1 s by default; two when the
# agent left an answer that listed nobody yet to the next, procutil.DEFER_READS) and, carried, those up to
# about one more window away.
TOLERANCE_S = 3.5
NOTE = (
    "<field>: the job's own figure (on a shared GPU the device's reading x its worker's share of the GPU's "
    "kernel time, worker_gpu_share; elsewhere the device's); device_<field>: the whole GPU's reading at the "
    "samples at which the job ran (every process on it)"
)


def factors(samples: pd.DataFrame, by: list[str]) -> np.ndarray:
    """Per row of ``samples`` (``time`` in ns, the ``by`` columns naming a worker's GPU, ``worker_gpu_share``
    in %): the share (0-1) its worker had of the GPU then; 1 where the worker never shared that GPU, NaN
    where it did but no share point is near (see the module docstring)."""
    if SHARE not in samples or samples.empty:
        return np.ones(len(samples))
    frame = pd.DataFrame({k: samples[k].astype(str).to_numpy() for k in by})
    frame["_t"] = pd.to_numeric(samples["time"]).astype("int64").to_numpy()
    frame["_row"] = np.arange(len(frame))
    frame = frame.sort_values("_t", kind="stable")
    share = pd.to_numeric(samples[SHARE]).to_numpy(dtype=float)[frame["_row"].to_numpy()]
    points = frame.assign(_share=share / 100).dropna(subset=["_share"])[["_t", *by, "_share"]]
    near = int(TOLERANCE_S * 1e9)
    found = [
        pd.merge_asof(frame, points, on="_t", by=by, direction=d, tolerance=near)["_share"].to_numpy()
        for d in ("forward", "backward")
    ]
    value = np.where(np.isnan(found[0]), found[1], found[0])
    shared = pd.MultiIndex.from_frame(frame[by]).isin(pd.MultiIndex.from_frame(points[by]))
    out = np.empty(len(frame))
    out[frame["_row"].to_numpy()] = np.where(shared, value, 1.0)
    return out


def own(samples: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``samples`` with each field of :data:`~dask_influx_metrics.schema.SHARE_SCALED` it has copied to
    ``device_<field>`` and scaled to the job's own (:func:`factors`; NaN where the share is unknown)."""
    fields = [f for f in schema.SHARE_SCALED if f in samples]
    if not fields:
        return samples
    scale = factors(samples, by)
    return samples.assign(
        **{DEVICE + f: pd.to_numeric(samples[f]) for f in fields},
        **{f: pd.to_numeric(samples[f]) * scale for f in fields},
    )


def unknown(samples: pd.DataFrame) -> int:
    """How many samples of :func:`own` have a device reading but no own figure (an unknown share)."""
    pairs = [(f, DEVICE + f) for f in schema.SHARE_SCALED if DEVICE + f in samples]
    return int(max((samples[d].notna() & samples[f].isna()).sum() for f, d in pairs)) if pairs else 0


def unknown_note(count: int) -> str:
    return (
        f"{count} GPU sample(s) of a shared GPU had no worker_gpu_share within {TOLERANCE_S} s (the first "
        "per-process window, or a failed read): left out of the jobs' own figures, kept in the device_ ones"
    )
