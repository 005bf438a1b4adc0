"""The steadied clock offset: Dask's jumpy estimate never moves timestamps by more than 1 % of their spacing."""

import random

import pytest

from dask_influx_metrics import clock
from dask_influx_metrics.clock import SteadyOffset


class Fake:
    """A monotonic clock and a scheduler_delay we set by hand."""

    def __init__(self, estimate=0.0):
        self.now, self.estimate = 0.0, estimate

    def offset(self):
        return SteadyOffset(lambda: self.estimate, clock=lambda: self.now)


def timestamps(fake, offset, estimates, interval):
    """Sample every ``interval`` s while the estimate follows ``estimates`` (one per heartbeat, 1 s)."""
    out = []
    for i in range(int(len(estimates) / interval)):
        fake.now = i * interval
        fake.estimate = estimates[int(fake.now)]
        out.append(fake.now + offset())
    return out


@pytest.mark.parametrize("interval", [0.05, 0.2])
def test_heartbeat_noise_moves_gaps_by_at_most_one_percent(interval):
    # measured with two GIL-holding threads: estimates wander +-25 ms and step by up to 47 ms
    rng = random.Random(7)
    estimates = [0.002 + rng.uniform(-0.025, 0.025) for _ in range(60)]
    fake = Fake()
    ts = timestamps(fake, fake.offset(), estimates, interval)
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert max(gaps) <= interval * (1 + clock.SLEW) + 1e-12
    assert min(gaps) >= interval * (1 - clock.SLEW) - 1e-12
    raw = [i * interval + estimates[int(i * interval)] for i in range(len(ts))]
    raw_gaps = [b - a for a, b in zip(raw, raw[1:])]
    assert max(raw_gaps) > interval + 0.02  # the raw estimate would have shown a 20+ ms gap


def test_first_estimate_is_used_as_is_and_a_lasting_change_is_reached():
    fake = Fake(estimate=0.5)
    offset = fake.offset()
    assert offset() == 0.5
    fake.estimate = 0.6  # 100 ms later for good: reached at 10 ms per second once the median moves
    for second in range(1, 30):
        fake.now = float(second)
        value = offset()
    assert value == pytest.approx(0.6)


def test_a_step_beyond_one_second_is_taken_at_once():
    fake = Fake(estimate=0.0)
    offset = fake.offset()
    offset()
    fake.estimate = 5.0  # the host's clock was stepped
    for second in range(1, 1 + clock.WINDOW // 2 + 1):  # once the median has moved
        fake.now = float(second)
        value = offset()
    assert value == 5.0


def test_an_estimate_that_cannot_be_read_yet_is_skipped():
    state = {"fail": True}

    def estimate():
        if state["fail"]:
            raise AttributeError("no heartbeat yet")
        return 0.25

    now = [0.0]
    offset = SteadyOffset(estimate, clock=lambda: now[0])
    assert offset() == 0.0
    state["fail"], now[0] = False, 1.0
    assert offset() == 0.25  # the first known estimate, as is
