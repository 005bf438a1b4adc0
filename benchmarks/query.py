"""Query: rebuild per-worker tables from influxd, ours vs a naive JSON ``/query`` + pandas.

1,000,000 GPU points (16 workers x 8 GPUs x 7,813 samples at 200 ms, three
fields each) are written to a fresh influxd over HTTP. Then, alternated:

- **ours**: ``query.worker_tables(query.connect(url), metrics=[...])`` (CSV responses,
  one worker at a time, server-side filters, paged);
- **naive**: one ``SELECT * FROM gpu`` as JSON, ``pandas.DataFrame`` from the
  values, then per worker the same pivot to one column per metric per GPU.

Both must give the same numbers. Then peaks of ``total-mem`` per worker, GPU
and job: server-side (InfluxQL ``MAX ... GROUP BY``) vs client-side (from
the tables), equal by assertion. ``--quick`` writes 100,000 points.

**20 sessions**: one database holds 20 sessions a day apart (4 workers x 4
GPUs each, GPU and host points), a second only the newest of them, on an
influxd that snapshots its write cache after 1 s: the sessions are on disk
(TSM files), as weeks-old sessions are, not in the write cache of a server that
has just taken them all. Asking for the newest session (its time range, as
``Monitor.query()`` does: workers, jobs, metrics, per-worker tables,
server-side peaks) is timed on both, alternated; the answers must be equal and
the many-session database cost at most 1.2x.
"""

from __future__ import annotations

import glob
import os
import time

import pandas as pd
import requests

from benchmarks import common, receivers

WORKERS, GPUS, INTERVAL_NS = 16, 8, 200_000_000
METRICS = ["compute-util", "mem-util", "total-mem"]


def _write(server, db: str, samples: int) -> int:
    t0 = 1_700_000_000_000_000_000
    n = 0
    for w in range(WORKERS):
        worker = f"tcp://10.0.{w // 8}.{w % 8 + 1}:40000"
        lines = []
        for s in range(samples):
            job = 1 + s * 4 // samples
            t = t0 + s * INTERVAL_NS + w * 1000
            for g in range(GPUS):
                lines.append(
                    f"gpu,host=node{w // 8},worker={worker},job={job},dag={job * 2},index={g},"
                    f"uuid=SIM-{w}-{g},name=Sim utilization_gpu={(s * 7 + g * 13) % 101},"
                    f"memory_used={1000 + (s * 31 + g) % 40000}.5,"
                    f"memory_used_percent={(s + g) % 100}.25 {t}"
                )
            if len(lines) >= 40_000 or s == samples - 1:
                server.write("\n".join(lines).encode(), db=db)
                n += len(lines)
                lines = []
    return n


SESSIONS, SESSION_WORKERS, SESSION_GPUS, DAY_NS = 20, 4, 4, 86_400 * 10**9


def _write_session(server, db: str, k: int, samples: int) -> tuple[int, int]:
    """Session ``k`` (a day after session k-1) into ``db``; returns its (start, stop) in ns."""
    t0 = 1_700_000_000_000_000_000 + k * DAY_NS
    lines = []
    for w in range(SESSION_WORKERS):
        worker = f"tcp://10.1.0.{w + 1}:40000"
        for s in range(samples):
            job = 1 + s * 3 // samples
            t = t0 + s * INTERVAL_NS + w * 1000
            tags = f"host=node{w},worker={worker},job={job},dag={job}"
            lines += [
                f"gpu,{tags},index={g} utilization_gpu={(s * 7 + g * 13 + k) % 101},"
                f"memory_used={1000 + (s * 31 + g) % 40000}.5 {t}"
                for g in range(SESSION_GPUS)
            ]
            lines.append(f"host,{tags} cpu_percent={(s * 3 + w) % 100}.5 {t}")
    for i in range(0, len(lines), 40_000):
        server.write("\n".join(lines[i : i + 40_000]).encode(), db=db)
    return t0, t0 + samples * INTERVAL_NS + SESSION_WORKERS * 1000


def _wait_on_disk(server, dbs, timeout: float = 60.0) -> float:
    """Wait (bounded) until every WAL segment of ``dbs`` is empty: all written points are in TSM files."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        wal = [p for db in dbs for p in glob.glob(os.path.join(server.root, "wal", db, "*", "*", "*.wal"))]
        if wal and all(os.path.getsize(p) == 0 for p in wal):
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(f"influxd did not snapshot {dbs} within {timeout} s")


def _analysis(url: str, db: str, start: int, stop: int):
    from dask_influx_metrics import query

    with query.connect(url, database=db, start=start / 1e9, stop=stop / 1e9) as store:
        tables = query.worker_tables(store, metrics=["compute-util", "total-mem", "host-cpu"])
        return (
            store.workers(),
            store.jobs(),
            store.metrics(),
            query.peaks(store, "compute-util"),
            {w: t.shape for w, t in tables.items()},
        )


def _sessions_row(quick: bool) -> dict:
    with receivers.influxd(data_settings={"cache-snapshot-write-cold-duration": "1s"}) as server:
        return _sessions(server, quick)


def _sessions(server, quick: bool) -> dict:
    samples = 150 if quick else 2_500
    rounds = 3 if quick else 7
    many, alone = server.create_database("bench_sessions"), server.create_database("bench_newest")
    for k in range(SESSIONS):
        start, stop = _write_session(server, many, k, samples)
    _write_session(server, alone, SESSIONS - 1, samples)
    waited = _wait_on_disk(server, [many, alone])
    got: dict = {}
    times = common.alternate(
        {
            name: (
                lambda name=name, db=db: _timed(lambda: got.__setitem__(name, _analysis(server.url, db, start, stop)))
            )
            for name, db in (("many", many), ("alone", alone))
        },
        rounds,
    )
    same = repr(got["many"]) == repr(got["alone"])
    a, b = common.median(times["many"]), common.median(times["alone"])
    points = SESSIONS * SESSION_WORKERS * samples * (SESSION_GPUS + 1)
    return common.row(
        "query",
        f"newest of {SESSIONS} sessions ({points:,} points in the database) vs a database holding only it",
        a,
        "s",
        baseline=b,
        target="<= 1.2x",
        met=a <= 1.2 * b and same,
        notes=f"workers, jobs, metrics, tables, server-side peaks of the session's time range; "
        f"same answers: {same}; on disk (TSM) after {waited:.1f} s; median of {rounds} "
        "alternated runs",
        details={"many_s": times["many"], "alone_s": times["alone"]},
    )


def _naive(url: str, db: str) -> dict:
    r = requests.get(url + "/query", params={"db": db, "q": "SELECT * FROM gpu", "epoch": "ns"}, timeout=600)
    series = r.json()["results"][0]["series"][0]
    frame = pd.DataFrame(series["values"], columns=series["columns"])
    out = {}
    names = {"utilization_gpu": "compute-util", "memory_used_percent": "mem-util", "memory_used": "total-mem"}
    for worker, rows in frame.groupby("worker", sort=True):
        wide = rows.pivot(index="time", columns="index", values=list(names))
        wide.columns = [f"{names[f]}[{i}]" for f, i in wide.columns]
        for c in [c for c in wide.columns if c.startswith("total-mem")]:
            wide[c] = wide[c] * 2**20
        out[worker] = wide
    return out


def _same(ours: dict, naive: dict) -> bool:
    if sorted(ours) != sorted(naive):
        return False
    for worker, table in ours.items():
        cols = [c for c in table.columns if c in naive[worker].columns]
        if len(cols) != len(METRICS) * GPUS:
            return False
        a = table[cols].reset_index(drop=True).astype(float)
        b = naive[worker][cols].reset_index(drop=True).astype(float)
        if not a.equals(b):
            return False
    return True


def run(quick: bool) -> list[dict]:
    from dask_influx_metrics import query

    samples = 100_000 // (WORKERS * GPUS) if quick else 1_000_000 // (WORKERS * GPUS) + 1
    rounds = 1 if quick else 3
    with receivers.influxd() as server:
        db = server.create_database("bench_query")
        t = time.monotonic()
        points = _write(server, db, samples)
        write_s = time.monotonic() - t
        store = query.connect(server.url, database=db)
        results = {}

        def ours():
            t0 = time.monotonic()
            results["ours"] = query.worker_tables(query.connect(server.url, database=db), metrics=METRICS)
            return time.monotonic() - t0

        def naive():
            t0 = time.monotonic()
            results["naive"] = _naive(server.url, db)
            return time.monotonic() - t0

        times = common.alternate({"ours": ours, "naive": naive}, rounds)
        same = _same(results["ours"], results["naive"])
        peak_times = common.alternate(
            {
                "server": lambda: _timed(
                    lambda: results.__setitem__("server", query.peaks(store, "total-mem", server=True))
                ),
                "client": lambda: _timed(
                    lambda: results.__setitem__("client", query.peaks(store, "total-mem", server=False))
                ),
            },
            rounds,
        )
        peaks_equal = results["server"].equals(results["client"])
    ours_s, naive_s = common.median(times["ours"]), common.median(times["naive"])
    server_s, client_s = common.median(peak_times["server"]), common.median(peak_times["client"])
    speedup = naive_s / ours_s
    return [
        common.row(
            "query",
            f"rebuild tables, {points:,} points ({WORKERS} workers x {GPUS} GPUs)",
            ours_s,
            "s",
            baseline=naive_s,
            target=">= 3x faster than naive",
            met=speedup >= 3 and same,
            notes=f"{speedup:.1f}x faster; same numbers as naive: {same}; writing took {write_s:.0f} s; "
            f"median of {rounds}",
            details={"ours_s": times["ours"], "naive_s": times["naive"], "points": points},
        ),
        common.row(
            "query",
            "peaks total-mem per worker/GPU/job: server-side",
            server_s,
            "s",
            baseline=client_s,
            target="== client-side",
            met=peaks_equal,
            notes=f"client-side (tables) {client_s:.2f} s; equal: {peaks_equal}",
            details={"server_s": peak_times["server"], "client_s": peak_times["client"]},
        ),
        _sessions_row(quick),
    ]


def _timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


if __name__ == "__main__":
    common.standalone("query", run)
