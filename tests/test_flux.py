"""Flux we ship passes the real Flux language server (flux-lsp 0.8.40, wasm, via node).

What the checker reports is pinned here with broken examples, and so is what it cannot know
(the schema): see ``scripts/flux_check.mjs``.
"""

from __future__ import annotations

import json
import os

import yaml
from fluxcheck import ROOT, fenced_blocks, flux_diagnostics

DOWNSAMPLE = os.path.join(ROOT, "deploy", "influxdb", "downsample.flux")
GRAFANA = os.path.join(ROOT, "grafana")
FLUX_DATASOURCE = "dask-flux"
# flux-lsp warns on any `task` identifier, `option task` included; InfluxDB tasks need exactly that.
TASK_OPTION_LINT = "warning: Avoid using `task` as an identifier name."
# Grafana's Flux datasource defines `v` (time range, window) at run time.
GRAFANA_PRELUDE = "v = {timeRangeStart: -1h, timeRangeStop: now(), windowPeriod: 1m}\n"

BROKEN = {  # source -> the diagnostics flux-lsp 0.8.40 gives for it
    'from(bucket: "b")\n    |> range(start: -1h\n    |> filter(fn: (r) => r._measurement == "gpu")\n': [
        "2:8 error: expected RPAREN, got EOF",
        "3:8 error: expected stream[{A with _measurement: B}] but found duration (argument tables)",
    ],
    'from(bucket: "b")\n    |> range(start: -1h)\n    |> nosuchfunction(n: 3)\n': [
        "3:8 error: undefined identifier nosuchfunction"
    ],
    'from(bucket: "b")\n    |> range(start: -1h)\n    |> filter(fn: (r) => strings.hasPrefix(v: r.job, prefix: "1"))\n': [
        "3:26 error: undefined identifier strings"
    ],
    'import "nosuch/package"\n': ["1:1 error: invalid import path nosuch/package"],
    'from(bucket: "b")\n    |> range()\n': ["2:8 error: missing required argument start"],
    'from(bucket: "b")\n    |> range(start: -1h)\n    |> aggregateWindow(every: 1m, fn: mean, creatEmpty: false)\n': [
        "3:57 error: found unexpected argument creatEmpty (Expected one of `column`, `createEmpty`, `location`, "
        "`offset`, `period`, `timeDst` or `timeSrc`)"
    ],
    'x = 1 + "a"\n': ["1:9 error: expected int but found string"],
    'from(bucket: "b")\n    |> range(start: -1h)\n    |> filter(fn: (r) => r.job =~ /[/)\n': [
        "3:35 error: regex parse error: [ error: unclosed character class"
    ],
}


def _errors(diagnostics: list[str]) -> list[str]:
    return [d for d in diagnostics if " error: " in d]


def test_checker_reports_syntax_and_semantic_errors():
    assert flux_diagnostics({str(i): src for i, src in enumerate(BROKEN)}) == {
        str(i): expected for i, expected in enumerate(BROKEN.values())
    }


def test_checker_checks_each_source_alone_and_accepts_valid_flux():
    result = flux_diagnostics(
        {
            "defines": "x = 1\n",
            "uses": "y = x + 1\n",  # would pass if both were one package
            "valid": 'import "strings"\n\nfrom(bucket: "b")\n    |> range(start: -1h)\n'
            '    |> filter(fn: (r) => strings.containsStr(v: r.job, substr: "1"))\n',
        }
    )
    assert result == {"defines": [], "uses": ["1:5 error: undefined identifier x"], "valid": []}


def test_checker_does_not_know_the_schema():
    """Limits: unknown buckets, measurements and fields, and column types, pass."""
    assert flux_diagnostics(
        {
            "schema": (
                'from(bucket: "no_such_bucket")\n    |> range(start: -1h)\n'
                '    |> filter(fn: (r) => r._measurement == 1 and r._field == "no_such_field")\n'
            )
        }
    ) == {"schema": []}


def test_downsample_task_passes():
    with open(DOWNSAMPLE) as f:
        (diagnostics,) = flux_diagnostics({"downsample.flux": f.read()}).values()
    assert not _errors(diagnostics), diagnostics
    assert all(TASK_OPTION_LINT in d for d in diagnostics), diagnostics


def _grafana_queries() -> list[tuple[str, str, str]]:
    """(where, datasource uid, query) of every query in grafana/ (dashboards and provisioning)."""
    found = []

    def walk(node, where: str, uid: str):
        if isinstance(node, dict):
            ds = node.get("datasource")
            uid = ds.get("uid", uid) if isinstance(ds, dict) else uid
            for key, value in node.items():
                if key in ("query", "rawSql", "expr") and isinstance(value, str):
                    found.append((where, uid, value))
                else:
                    walk(value, where, uid)
        elif isinstance(node, list):
            for item in node:
                walk(item, where, uid)

    for dirpath, _, files in os.walk(GRAFANA):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            if name.endswith(".json"):
                with open(path) as f:
                    walk(json.load(f), os.path.relpath(path, ROOT), "")
            elif name.endswith((".yaml", ".yml")):
                with open(path) as f:
                    walk(yaml.safe_load(f), os.path.relpath(path, ROOT), "")
    return found


def test_grafana_flux_queries_pass():
    queries = _grafana_queries()
    assert queries, "no queries found in grafana/"
    flux = {
        f"{where} #{i}": query
        for i, (where, uid, query) in enumerate(queries)
        if uid == FLUX_DATASOURCE or "|>" in query
    }
    for where, uid, query in queries:  # everything else is InfluxQL on the InfluxQL datasource
        assert uid == FLUX_DATASOURCE or "|>" not in query, (where, query)
    if not flux:
        return  # today every panel uses InfluxQL (grafana/build_dashboard.py)
    result = flux_diagnostics({k: GRAFANA_PRELUDE + q for k, q in flux.items()})
    problems = {k: [d for d in v if not d.startswith("1:")] for k, v in result.items()}
    assert not any(problems.values()), problems


def test_docs_flux_blocks_pass():
    with open(os.path.join(ROOT, "docs", "queries.md")) as f:
        blocks = fenced_blocks(f.read(), "flux")
    assert len(blocks) >= 6, "docs/queries.md has a Flux query per question"
    result = flux_diagnostics({f"docs/queries.md:{line}": body for line, body in blocks})
    assert not any(result.values()), {k: v for k, v in result.items() if v}
