"""Points per second through our encoder + UDP sink vs pytelegraf's TelegrafClient.

The same points (full samples of a simulated worker: 8 GPU lines, host,
worker; values and timestamps varied per sample) go through
  * ours: ``lineprotocol.encode_many`` per sample, then ``UdpSink.send``
    (many lines per datagram, up to the default ``telegraf.max-datagram``:
    ``auto``, 65507 bytes to a loopback Telegraf; a row with 1472, the size for
    a Telegraf on another host), as the samplers (the host's agent, or a
    worker's own thread) do;
  * pytelegraf 0.3.3: ``TelegrafClient.metric(...)`` per point (one datagram
    per point), the baseline;
each into its own loopback UDP socket drained and counted by a separate
process. Runs alternate; medians of points/s (wall clock). Target: >= 5x.

Run: ``.venv/bin/python -m benchmarks.encode [--quick]``.
"""

from __future__ import annotations

import random
import time

from benchmarks import common, receivers

NAME = "encode"
TARGET = 5.0


def vary(value, rng: random.Random):
    """A value like ``value`` (same type, magnitude and precision), as the next sample would read."""
    if type(value) is float:
        return round(value * rng.uniform(0.5, 1.5), rng.choice([0, 1, 2, 3, 6]))
    if type(value) is int:
        return value + rng.randint(0, 1 << 20)
    return value


def make_samples(n_points: int, tracking=None) -> list:
    """Lists of points (one list per sample) with distinct values and timestamps, ``n_points`` in all.

    Each point has its own tag and field dicts, as the sampler's points do, so
    neither side can profit from seeing the same dict objects or values again.
    """
    sampler, _ = common.simulated_worker(None, tracking=tracking)
    template = sampler.sample()
    t0, rng = time.time_ns(), random.Random(0)
    n_samples = max(1, n_points // len(template))
    return [
        [
            p._replace(tags=dict(p.tags), fields={k: vary(v, rng) for k, v in p.fields.items()}, time_ns=t0 + i * 1000)
            for p in template
        ]
        for i in range(n_samples)
    ]


def ours(samples, address, max_datagram=None) -> tuple[float, object]:
    from dask_influx_metrics import lineprotocol
    from dask_influx_metrics.sinks.udp import UdpSink

    sink = UdpSink(address, max_datagram=max_datagram)
    t0 = time.perf_counter()
    for points in samples:
        sink.send(lineprotocol.encode_many(points))
    took = time.perf_counter() - t0
    sink.close()
    return took, sink


def pytelegraf(samples, address) -> float:
    from telegraf.client import TelegrafClient

    client = TelegrafClient(host=address[0], port=address[1])
    t0 = time.perf_counter()
    for points in samples:
        for p in points:
            client.metric(p.measurement, p.fields, tags=p.tags, timestamp=p.time_ns)
    took = time.perf_counter() - t0
    client.socket.close()
    return took


def pytelegraf_unparsable(points) -> int:
    """How many of pytelegraf's lines for ``points`` our parser (and so influxd) cannot read."""
    from telegraf.protocol import Line

    from dask_influx_metrics import lineparse

    bad = 0
    for p in points:
        text = Line(p.measurement, p.fields, p.tags, p.time_ns).to_line_protocol()
        try:
            parsed = lineparse.parse(text.encode())
            bad += parsed.fields != p.fields
        except Exception:
            bad += 1
    return bad


def compare(samples, rounds: int, max_datagram=None) -> dict:
    """Alternated runs of both clients over ``samples``; rates, counters, what arrived."""
    n = sum(map(len, samples))
    with receivers.Drain() as ours_rx, receivers.Drain() as tele_rx:
        runs = common.alternate(
            {
                "ours": lambda: ours(samples, ours_rx.address, max_datagram),
                "pytelegraf": lambda: pytelegraf(samples, tele_rx.address),
            },
            rounds,
        )
        got_ours, got_tele = ours_rx.counts(), tele_rx.counts()
    sinks = [s for _, s in runs["ours"]]
    return {
        "n": n,
        "ours": [n / t for t, _ in runs["ours"]],
        "pytelegraf": [n / t for t in runs["pytelegraf"]],
        "dropped": sum(s.points_dropped for s in sinks),
        "datagrams_per_point": sum(s.datagrams_sent for s in sinks) / rounds / n,
        "received": {"ours": got_ours["lines"], "pytelegraf": got_tele["lines"]},
        "sent_per_impl": n * rounds,
    }


def run(quick: bool = False) -> list[dict]:
    n_points, rounds = (20_000, 2) if quick else (50_000, 15)
    # (shape, tracking, max_datagram): the default telegraf.max-datagram (auto: 65507 on loopback, where
    # a node-local Telegraf listens); then 1472, what auto picks for a Telegraf on another host
    shapes = [("every metric", None, None), ("compute-util only", ["compute-util"], None), ("every metric", None, 1472)]
    rows = []
    for shape, tracking, max_datagram in shapes:
        samples = make_samples(n_points, tracking)
        r = compare(samples, rounds, max_datagram)
        ours_rate, tele_rate = common.median(r["ours"]), common.median(r["pytelegraf"])
        paired = common.median([a / b for a, b in zip(r["ours"], r["pytelegraf"])])
        fields = sum(len(p.fields) for p in samples[0]) / len(samples[0])
        bad = pytelegraf_unparsable(samples[0])
        main = not rows
        rows.append(
            common.row(
                NAME,
                f"points/s, encode + UDP send, ours vs pytelegraf 0.3.3 ({shape}: {fields:.1f} fields/point"
                + (f", max-datagram {max_datagram})" if max_datagram else ", max-datagram auto = 65507)"),
                ours_rate,
                "points/s",
                baseline=tele_rate,
                target=f">= {TARGET:.0f}x" if main else None,
                met=(ours_rate / tele_rate >= TARGET) if main else None,
                notes=(
                    f"median of {rounds} alternated runs of {r['n']:,} points ({len(samples[0])}-line samples), "
                    f"per-round ratio median {paired:.3f}x; "
                    f"ours {r['datagrams_per_point']:.3f} datagrams/point, {r['dropped']} dropped by the sink; "
                    f"received: ours {r['received']['ours']:,}/{r['sent_per_impl']:,} lines, "
                    f"pytelegraf {r['received']['pytelegraf']:,}/{r['sent_per_impl']:,}"
                    + (
                        f"; pytelegraf writes {bad} of every {len(samples[0])} lines unparsable or changed "
                        "(it does not escape '\"' in string fields)"
                        if bad
                        else ""
                    )
                ),
                details=r,
            )
        )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
