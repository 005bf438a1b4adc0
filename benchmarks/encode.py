"""Points per second through our encoder + UDP sink vs pytelegraf's TelegrafClient.

The same points (full samples of a simulated worker: 8 GPU lines, host,
worker; timestamps varied) go through
  * ours: ``lineprotocol.encode_many`` per sample, then ``UdpSink.send``
    (many lines per datagram, up to 1472 bytes, the default
    ``telegraf.max-datagram``; a last row with 65507), as the sampler does;
  * pytelegraf 0.3.3: ``TelegrafClient.metric(...)`` per point (one datagram
    per point), the baseline;
each into its own loopback UDP socket drained and counted by a separate
process. Runs alternate; medians of points/s (wall clock). Target: >= 5x.

Run: ``.venv/bin/python -m benchmarks.encode [--quick]``.
"""

from __future__ import annotations

import time

from benchmarks import common

NAME = "encode"
TARGET = 5.0


def make_samples(n_points: int, tracking=None) -> list:
    """Lists of points (one list per sample) with distinct timestamps, ``n_points`` in all.

    Each point has its own tag and field dicts, as the sampler's points do, so
    neither side can profit from seeing the same dict objects again.
    """
    sampler, _ = common.simulated_worker(None, tracking=tracking)
    template = sampler.sample()
    t0 = time.time_ns()
    n_samples = max(1, n_points // len(template))
    return [[p._replace(tags=dict(p.tags), fields=dict(p.fields), time_ns=t0 + i * 1000) for p in template]
            for i in range(n_samples)]


def ours(samples, address, max_datagram: int = 1472) -> tuple[float, object]:
    from dask_influx_metrics import lineprotocol
    from dask_influx_metrics.worker.sinks.udp import UdpSink

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

    from dask_influx_metrics import lineprotocol

    bad = 0
    for p in points:
        text = Line(p.measurement, p.fields, p.tags, p.time_ns).to_line_protocol()
        try:
            parsed = lineprotocol.parse(text.encode())
            bad += parsed.fields != p.fields
        except Exception:
            bad += 1
    return bad


def compare(samples, rounds: int, max_datagram: int = 1472) -> dict:
    """Alternated runs of both clients over ``samples``; rates, counters, what arrived."""
    n = sum(map(len, samples))
    with common.Drain() as ours_rx, common.Drain() as tele_rx:
        runs = common.alternate({
            "ours": lambda: ours(samples, ours_rx.address, max_datagram),
            "pytelegraf": lambda: pytelegraf(samples, tele_rx.address),
        }, rounds)
        got_ours, got_tele = ours_rx.counts(), tele_rx.counts()
    sinks = [s for _, s in runs["ours"]]
    return {"n": n, "ours": [n / t for t, _ in runs["ours"]], "pytelegraf": [n / t for t in runs["pytelegraf"]],
            "dropped": sum(s.points_dropped for s in sinks),
            "datagrams_per_point": sum(s.datagrams_sent for s in sinks) / rounds / n,
            "received": {"ours": got_ours["lines"], "pytelegraf": got_tele["lines"]}, "sent_per_impl": n * rounds}


def run(quick: bool = False) -> list[dict]:
    n_points, rounds = (20_000, 2) if quick else (100_000, 7)
    # (shape, tracking, max_datagram): the default telegraf.max-datagram, then the largest UDP payload,
    # which a node-local Telegraf on loopback (MTU 65536) receives unfragmented
    shapes = [("every metric", None, 1472), ("compute-util only", ["compute-util"], 1472),
              ("every metric", None, 65507)]
    rows = []
    for shape, tracking, max_datagram in shapes:
        samples = make_samples(n_points, tracking)
        r = compare(samples, rounds, max_datagram)
        ours_rate, tele_rate = common.median(r["ours"]), common.median(r["pytelegraf"])
        fields = sum(len(p.fields) for p in samples[0]) / len(samples[0])
        bad = pytelegraf_unparsable(samples[0])
        main = not rows
        rows.append(common.row(
            NAME, f"points/s, encode + UDP send, ours vs pytelegraf 0.3.3 ({shape}: {fields:.1f} fields/point"
            + (f", max-datagram {max_datagram})" if max_datagram != 1472 else ")"),
            ours_rate, "points/s", baseline=tele_rate,
            target=f">= {TARGET:.0f}x" if main else None, met=(ours_rate / tele_rate >= TARGET) if main else None,
            notes=(f"median of {rounds} alternated runs of {r['n']:,} points ({len(samples[0])}-line samples); "
                   f"ours {r['datagrams_per_point']:.3f} datagrams/point, {r['dropped']} dropped by the sink; "
                   f"received: ours {r['received']['ours']:,}/{r['sent_per_impl']:,} lines, "
                   f"pytelegraf {r['received']['pytelegraf']:,}/{r['sent_per_impl']:,}"
                   + (f"; pytelegraf writes {bad} of every {len(samples[0])} lines unparsable or changed "
                      "(it does not escape '\"' in string fields)" if bad else "")),
            details=r))
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
