"""``python -m benchmarks [--quick] [--only NAME[,NAME]]``: run the benchmarks, print one table,
write ``benchmarks/results/latest.json``. Exit status 1 if a benchmark crashed (unmet targets
do not fail the run unless ``--strict``)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
import traceback

from benchmarks import MODULES, common


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="short durations: a smoke test (< 2 min)")
    p.add_argument("--only", metavar="NAME", help=f"comma-separated subset of {', '.join(MODULES)}")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is not met, too")
    p.add_argument(
        "--gpu-source",
        choices=("simulated", "nvml"),
        default="simulated",
        help="GPUs of the sampler, gaps and workload benchmarks: 8 simulated (default) or this node's "
        "real ones through NVML (those benchmarks skip cleanly where NVML sees no GPU)",
    )
    p.add_argument("--output", default=os.path.join(common.RESULTS_DIR, "latest.json"), help="JSON path")
    args = p.parse_args(argv)
    os.environ["BENCH_GPU_SOURCE"] = args.gpu_source  # read by benchmarks.common.gpu_source()
    names = list(MODULES)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - set(MODULES))
        if unknown:
            p.error(f"unknown benchmark(s) {unknown}; known: {', '.join(MODULES)}")
    env_start = common.environment()
    rows, seconds, skipped, crashed = [], {}, [], []
    t_all = time.monotonic()
    for name in names:
        if importlib.util.find_spec(f"benchmarks.{name}") is None:
            skipped.append(name)
            print(f"== {name}: skipped (benchmarks/{name}.py not present)", flush=True)
            continue
        print(f"== {name}{' (quick)' if args.quick else ''} ...", flush=True)
        t0 = time.monotonic()
        try:
            got = importlib.import_module(f"benchmarks.{name}").run(args.quick)
        except Exception as e:  # one broken benchmark must not hide the others
            traceback.print_exc()
            got = [common.failed_row(name, e)]
            crashed.append(name)
        seconds[name] = round(time.monotonic() - t0, 1)
        rows.extend(got)
        print(f"== {name}: {seconds[name]:.1f} s", flush=True)
    total = time.monotonic() - t_all
    print()
    print(common.format_table(rows))
    path = common.write_json(
        args.output,
        {
            "quick": args.quick,
            "started_env": env_start,
            "ended_env": common.environment(),
            "seconds": seconds,
            "total_seconds": round(total, 1),
            "skipped": skipped,
            "crashed": crashed,
            "rows": rows,
        },
    )
    unmet = [f"{r['name']}: {r['what']}" for r in rows if r["met"] is False]
    print(
        f"\n{len(rows)} rows, {len(unmet)} target(s) not met, {len(crashed)} crashed; "
        f"total {total:.1f} s ({', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())}); "
        f"load average {env_start['loadavg'][0]:.2f} at start; wrote {path}"
    )
    return 1 if crashed or (args.strict and unmet) else 0


if __name__ == "__main__":
    sys.exit(main())
