"""A short-task workload as NVML reads it: the samples that the agent's wakes at task starts put where
tasks start, each reading the busy share of the window since the previous one (issues 23 and 33).

20 s of samples every 0.1 s plus, each second from 1 s on, the burst a 10 ms task (at 30 ms past the
second) causes: five wake samples 2 ms apart at its start and one at its end. The GPU is busy exactly
during the tasks, so the time-weighted truth is 19 x 10 ms in 20 s: 0.95 %.
"""

import numpy as np

TRUTH = 0.95  # % busy


def samples() -> tuple[np.ndarray, np.ndarray]:
    """``(times, utilization)``: sample times (s, sorted) and each one's busy share (%) since the previous
    sample (0 at the first)."""
    ticks = np.arange(200) * 0.1
    starts = np.arange(1, 20) + 0.03
    wakes = (starts[:, None] + np.arange(5) * 0.002).ravel()
    times = np.sort(np.concatenate([ticks, wakes, starts + 0.01]))
    busy = np.clip(times[:, None] - starts[None, :], 0, 0.01).sum(axis=1)  # busy seconds up to each sample
    return times, np.append(0.0, (100 * np.diff(busy) / np.diff(times)).round(9))
