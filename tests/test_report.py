"""The one-file HTML report (client/report.py, reportfigs.py): its content on contract-shaped points,
and, as a person would see it, the demo session's report rendered in headless Chromium.

How the browser check works (Chromium prints every console message, log or error alike, as an
``INFO:CONSOLE`` line on stderr, so the level cannot be told from there):

1. A copy of the report gets a probe script as the first thing in ``<head>``, before BokehJS:
   it records ``console.error``/``console.warn`` calls, uncaught exceptions (``error`` events)
   and unhandled promise rejections, and after the page settled writes them into
   ``<pre id="probe-errors">`` and the number of rendered Bokeh roots into ``<pre id="probe-roots">``.
2. ``chromium --headless --dump-dom --virtual-time-budget=10000`` loads the copy from disk with
   the network off (``--proxy-server`` pointing nowhere), runs its scripts and prints the DOM.
3. The test asserts: the probe ran and recorded nothing; every Bokeh root div
   (``data-root-id``) got its rendered ``bk-Figure`` child; no ``Uncaught`` console line on
   stderr; each job's section is there. Then ``--screenshot`` saves a PNG of the unmodified
   report (path printed; a copy at /tmp/gpu-report.png).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest
import task_points as P

from dask_influx_metrics import demo, query

pytest.importorskip("bokeh")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROBE = """<script>(function () {
  var errors = [];
  ["error", "warn"].forEach(function (level) {
    var original = console[level];
    console[level] = function () { errors.push(level + ": " + Array.from(arguments).join(" ")); original.apply(console, arguments); };
  });
  window.addEventListener("error", function (e) { errors.push("uncaught: " + e.message); });
  window.addEventListener("unhandledrejection", function (e) { errors.push("unhandled rejection: " + e.reason); });
  window.addEventListener("load", function () { setTimeout(function () {
    var roots = document.querySelectorAll("[data-root-id]"), rendered = 0;
    roots.forEach(function (r) { if (r.querySelector(".bk-Figure")) rendered++; });
    document.body.insertAdjacentHTML("beforeend", '<pre id="probe-roots">' + rendered + "/" + roots.length + "</pre>");
    var pre = document.createElement("pre"); pre.id = "probe-errors"; pre.textContent = errors.join("\\n");
    document.body.appendChild(pre);
  }, 2000); });
})();</script>"""


def _chromium(*args, timeout=120) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--proxy-server=127.0.0.1:9",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)


@pytest.fixture(scope="module")
def spool_store(tmp_path_factory):
    with query.connect(P.write_spool(tmp_path_factory.mktemp("spool"))) as db:
        yield db


def test_report_content(spool_store, tmp_path):
    path = query.report(spool_store, tmp_path / "sub" / "r.html", title="Nightly <run>")
    text = pathlib.Path(path).read_text(encoding="utf-8")
    assert "<title>Nightly &lt;run&gt;</title>" in text
    body = text.split("</head>\n<body>\n", 1)[1].split("<script")[0]  # the report's own HTML, up to the figures' script
    assert "http://" not in body and "https://" not in body  # nothing to fetch: no links out
    assert "<script src=" not in text and "<link" not in text
    for job in (1, 2):
        assert f'id="job-{job}"' in text and f"Job {job}: GPU utilization (%)" in text
    assert text.count('data-root-id="') == 6  # per job: utilization, memory, activity bars
    for needle in (
        "Session overview",
        "held-but-idle GPU-hours",
        "thread-noncpu",
        "Slowest task prefixes",
        "matmul",
        "disk-read",
    ):
        assert needle in text
    assert "{{" not in body  # every figure placeholder was filled
    # "was the GPU busy" per task prefix, below the per-job table: job 1's matmul ran 14 of its 20
    # sample windows on a busy GPU (80 %), load all (tests/test_tasks.py)
    job1 = body.split('id="job-1"')[1].split('id="job-2"')[0]
    busy = job1.split("Per task prefix")[1].split("</table>")[0].replace("<wbr>", "")  # headers wrap at "_"
    assert "<th>mean_memory_delta</th>" in busy and job1.index("Per task prefix") > job1.index("Was the GPU busy")
    assert re.findall(r"<td>(matmul|load)</td>\s*<td>(\d+)</td>\s*<td>[^<]*</td>\s*<td>([^<]*)</td>", busy) == [
        ("matmul", "4", "56"),
        ("load", "6", "80"),
    ]


def test_sections_without_data_say_why(influxd, tmp_path):
    from dask_influx_metrics import lineprotocol

    database = influxd.create_database("report_no_tasks")
    points = [p for p in P.all_points() if p.measurement not in ("task", "activity")]
    influxd.write(lineprotocol.encode_many(points), db=database).raise_for_status()
    with query.connect(influxd.url, database=database) as db:
        text = pathlib.Path(query.report(db, tmp_path / "r.html")).read_text(encoding="utf-8")
    assert "no task stream recorded: add `task-stream` to tracking" in text
    assert "no fine performance metrics recorded: add `fine-metrics` to tracking" in text
    busy = text.split("Per task prefix")[1].split("</h4>")[1]
    assert busy.lstrip().startswith('<p class="why">no task stream recorded')


def test_missing_bokeh_names_the_extra(spool_store, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "bokeh.plotting", None)
    with pytest.raises(ImportError, match=r"pip install dask-influx-metrics\[report\]"):
        query.report(spool_store, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


@pytest.fixture(scope="module")
def demo_report(influxd, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    rc = demo.main(
        [
            "--influxdb-url",
            influxd.url,
            "--telegraf-address",
            "%s:%d" % influxd.udp_address,
            "--workers",
            "2",
            "--gpus",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    return out / "gpu-report.html"


def test_demo_report_in_headless_chromium(demo_report, tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs Debian's chromium)")
    probed = tmp_path / "probed.html"
    probed.write_text(
        demo_report.read_text(encoding="utf-8").replace("<head>", "<head>\n" + PROBE, 1), encoding="utf-8"
    )
    run = _chromium("--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    dom = run.stdout
    assert 'id="probe-errors"' in dom, "the probe did not run: " + run.stderr[-2000:]
    assert re.search(r'<pre id="probe-errors"></pre>', dom), re.search(r'<pre id="probe-errors">.*?</pre>', dom, re.S)[
        0
    ]
    rendered, roots = map(int, re.search(r'<pre id="probe-roots">(\d+)/(\d+)</pre>', dom).groups())
    assert roots == 9 and rendered == roots  # 3 jobs x (utilization, memory, activity): BokehJS drew every figure
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
    for job in (1, 2, 3):
        assert f'<h2 id="job-{job}">Job {job}</h2>' in dom
    assert "no task stream recorded" not in dom  # the demo's workers write task points

    shot = tmp_path / "gpu-report.png"
    _chromium(
        "--virtual-time-budget=10000",
        "--hide-scrollbars",
        "--window-size=1400,2400",
        f"--screenshot={shot}",
        demo_report.as_uri(),
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    shutil.copyfile(shot, "/tmp/gpu-report.png")
    print(f"\nscreenshot of the demo report: {shot} (copy: /tmp/gpu-report.png); report: {demo_report}")
    assert os.path.getsize(demo_report) > 1_000_000  # BokehJS inline


WIDTH_PROBE = """<script>window.addEventListener("load", function () { setTimeout(function () {
  var page = document.body.getBoundingClientRect().right - parseFloat(getComputedStyle(document.body).paddingRight);
  var wide = Array.from(document.querySelectorAll("table.data")).filter(function (t) {
    return t.getBoundingClientRect().right > page + 0.5; }).map(function (t) { return t.previousElementSibling ?
    t.previousElementSibling.textContent.slice(0, 60) : "?"; });
  document.body.insertAdjacentHTML("beforeend", '<pre id="probe-width">' + document.documentElement.scrollWidth +
    " " + window.innerWidth + " " + JSON.stringify(wide) + "</pre>");
}, 2000); });</script>"""


def test_demo_report_fits_1400_px_without_a_horizontal_scrollbar(demo_report, tmp_path):
    """Issue 45: every table fits the page's column in a 1400 px window (headers wrap at their underscores)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs Debian's chromium)")
    probed = tmp_path / "width.html"
    probed.write_text(
        demo_report.read_text(encoding="utf-8").replace("</body>", WIDTH_PROBE + "</body>", 1), encoding="utf-8"
    )
    dom = _chromium("--virtual-time-budget=10000", "--window-size=1400,2400", "--dump-dom", probed.as_uri()).stdout
    scroll, inner, wide = re.search(r'<pre id="probe-width">(\d+) (\d+) (.*?)</pre>', dom).groups()
    assert int(scroll) <= int(inner) == 1400 and wide == "[]", (scroll, inner, wide)
    assert "<details><summary>" in dom  # a job's smaller activities are folded below its top ones


def test_timelines_start_at_0_and_equal_lines_differ():
    """Utilization on 0-100, memory from 0, and two GPUs with equal readings drawn with different dashes."""
    import math

    import pandas as pd

    from dask_influx_metrics.client import reportfigs

    table = pd.DataFrame(
        {
            "job": ["1"] * 4,
            "dag": ["1"] * 4,
            "timestamp": [0.0, 0.5, 1.0, 1.5],
            "compute-util[0]": [50.0, 51.0, 50.0, 51.0],
            "compute-util[1]": [50.0, 51.0, 50.0, 51.0],
            "total-mem[0]": [3e9] * 4,
        }
    )
    tables = {"w": table}
    data = reportfigs.timeline_data(tables, {"compute-util": 1.0, "total-mem": 2**30})
    util = reportfigs.timeline(tables, data, 1, "compute-util", "GPU utilization (%)")
    assert (util.y_range.start, util.y_range.end) == (0, 100)
    dashes = [r.glyph.line_dash for r in util.renderers if hasattr(r.glyph, "line_dash")]
    assert len(dashes) == 2 and dashes[0] != dashes[1]
    mem = reportfigs.timeline(tables, data, 1, "total-mem", "GPU memory used (GiB)")
    assert mem.y_range.start == 0 and math.isnan(mem.y_range.end)  # the top follows the data


def test_one_node_table_per_node_for_the_session_and_each_job(tmp_path):
    """Issue 47: each node's cpu (with the core spread), memory, disk and network; bytes in MiB
    (tests/node_points.py: node-a runs jobs 1 and 2, node-b job 2)."""
    import node_points as NP

    from dask_influx_metrics.client import report

    with query.connect(NP.write_spool(tmp_path / "nodes")) as db:
        text = pathlib.Path(query.report(db, tmp_path / "r.html")).read_text(encoding="utf-8")
        tables = report.node_tables(query.summary(db), 1)
    assert text.count("<h4>node node-a</h4>") == 3 and text.count("<h4>node node-b</h4>") == 2
    job2 = text.split('id="job-2"')[1]
    assert "Node resources while the job ran" in job2 and job2.index("node node-a") < job2.index("node node-b")
    (a,) = tables.values()
    assert list(tables) == ["node-a"] and list(a["resource"]) == ["cpu", "disk", "memory", "network"]
    cpu, disk = a.iloc[0], a.iloc[1]
    assert (cpu["core_max"], cpu["mean"], cpu["devices"], disk["max"]) == (100, 50, 2, 70)
    assert (disk["read_MiB"], disk["write_MiB"], a.iloc[3]["lo_sent_MiB"]) == (10, 20, 30)
