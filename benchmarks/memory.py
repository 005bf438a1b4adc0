"""Worker memory with InfluxDB down: RSS growth over an hour's worth of samples, then what reached the disk.

In a fresh process, a Sampler with 8 simulated GPUs and every metric is
driven as fast as it goes (no sleeping) for the equivalent of 1 h at 10 Hz
(36,000 samples, 10 lines each) into
  * ``spool``: a SpoolSink (default mem-limit 1000 lines), and
  * ``http-dead``: the HTTP sink pointed at a dead loopback port, with its
    fallback SpoolSink (what ``sink=http`` builds),
measuring the process RSS (psutil) after a warm-up and every 1000 samples.
Then every spooled line is written into a fresh influxd (synchronous writes)
and the points stored are counted per measurement. Targets: <= 20 MB
growth, nothing lost.

Run: ``.venv/bin/python -m benchmarks.memory [--quick]``.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import socket
import tempfile

from benchmarks import common, receivers

NAME = "memory"
TARGET_MB = 20.0
WARMUP = 300


def _make_sink(variant: str, directory: str):
    from dask_influx_metrics.sinks.http import HttpSink
    from dask_influx_metrics.sinks.spool import SpoolSink

    if variant == "spool":
        return SpoolSink(directory)
    with socket.socket() as probe:  # a free port nothing listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % probe.getsockname()[1]
    return HttpSink(dead, "dask_metrics", fallback=SpoolSink(os.path.join(directory, "undelivered")))


def _drive(conn, variant: str, directory: str, samples: int) -> None:
    """In a child process: sample ``samples`` times into the sink; report RSS and counters."""
    import logging

    logging.getLogger("dask_influx_metrics").setLevel(logging.ERROR)  # one warning per failed POST run
    sink = _make_sink(variant, directory)
    sampler, _ = common.simulated_worker(sink)
    lines = sum(sampler.sample_and_send() for _ in range(WARMUP))
    gc.collect()
    rss0 = common.rss_bytes()
    trace = []
    for i in range(samples):
        lines += sampler.sample_and_send()
        if (i + 1) % 1000 == 0:
            trace.append(common.rss_bytes() - rss0)
    rss_end = common.rss_bytes() - rss0
    sink.close()
    http = variant == "http-dead"
    spool = sink.fallback if http else sink  # the SpoolSink that holds the samples
    conn.send(
        {
            "lines": lines,
            "growth": rss_end,
            "peak": max(trace + [rss_end]),
            "trace": trace,
            "spool_written": spool.points_written,
            "spool_dropped": spool.points_dropped,
            "http_failed": sink.points_failed if http else None,
        }
    )


def _write_all(directory: str, server, db: str, batch: int = 5000) -> int:
    """Every spooled line under ``directory`` into ``db``, one synchronous POST per batch that must succeed."""
    from dask_influx_metrics.sinks.spool import read_lines

    lines, written = [], 0
    for line in read_lines(directory):
        lines.append(line)
        if len(lines) == batch:
            server.write(lines, db=db)
            written, lines = written + len(lines), []
    if lines:
        server.write(lines, db=db)
    return written + len(lines)


def one_variant(variant: str, samples: int, fields: dict) -> dict:
    from dask_influx_metrics.sinks.spool import spool_files

    directory = tempfile.mkdtemp(prefix=f"bench-memory-{variant}-")
    try:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_drive, args=(child, variant, directory, samples), daemon=True)
        proc.start()
        try:
            if not parent.poll(1800):
                raise RuntimeError(f"memory driver ({variant}) did not finish")
            out = parent.recv()
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
        out["spool_bytes"] = sum(os.path.getsize(p) for p in spool_files(directory))
        with receivers.influxd() as server:
            db = server.create_database(f"memory_{variant.replace('-', '_')}")
            out["written"] = _write_all(directory, server, db)
            stored = receivers.count_points(server, db, fields)
        out["stored"] = sum(stored.values())
        out["lost"] = out["lines"] - out["stored"]
        return out
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run(quick: bool = False) -> list[dict]:
    samples = 3_600 if quick else 36_000
    fields = common.first_fields(common.sample_lines())
    rows = []
    for variant in ("spool", "http-dead"):
        r = one_variant(variant, samples, fields)
        mb = r["growth"] / 2**20
        rows.append(
            common.row(
                NAME,
                f"{variant}: RSS growth over {samples:,} samples (8 GPUs, all metrics)",
                mb,
                "MB",
                target=f"<= {TARGET_MB:.0f} MB",
                met=mb <= TARGET_MB,
                notes=(
                    f"peak {r['peak'] / 2**20:.1f} MB after a {WARMUP}-sample warm-up; "
                    f"trace every 1000 samples (MB): {', '.join(f'{x / 2**20:.1f}' for x in r['trace'][:: max(1, len(r['trace']) // 8)])}; "
                    f"spool {r['spool_bytes'] / 2**20:.0f} MB on disk"
                ),
                details=r,
            )
        )
        rows.append(
            common.row(
                NAME,
                f"{variant}: points lost after writing the spool into influxd",
                r["lost"],
                "points",
                baseline=r["lines"],
                target="0",
                met=r["lost"] == 0,
                notes=(
                    f"sampled {r['lines']:,} lines (incl. warm-up), spooled {r['spool_written']:,}, "
                    f"written to influxd {r['written']:,}, stored {r['stored']:,}; spool drops {r['spool_dropped']}"
                    + (
                        f"; HTTP failures handed to the fallback {r['http_failed']:,}"
                        if r["http_failed"] is not None
                        else ""
                    )
                ),
            )
        )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
