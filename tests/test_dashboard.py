"""The scheduler dashboard's GPU Jobs page (scheduler/dashboard.py) in a real browser: a LocalCluster with its
dashboard on a free port, two jobs (two clients) on simulated GPUs, the page loaded in headless Chromium
(tests/browser.py: the DevTools protocol; a Bokeh server page renders over its websocket). The screenshot is
kept with the test's output (path printed; a copy at /tmp/gpu-jobs-page.png)."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request

import pytest
from browser import CHROMIUM, Chromium
from distributed import Client, LocalCluster
from polling import wait_until

from dask_influx_metrics import Monitor
from dask_influx_metrics.names import DASHBOARD_PAGE, JOBS_PLUGIN

pytest.importorskip("bokeh")
# the text of the page as drawn, Bokeh's shadow roots included
TEXT = "(function deep(n) { if (n.nodeName === 'STYLE' || n.nodeName === 'SCRIPT') return ''; let t = ''; if (n.shadowRoot) t += deep(n.shadowRoot); for (const c of n.childNodes) t += c.nodeType === 3 ? c.textContent + ' ' : deep(c); return t; })(document.body)"
CANVASES = "(function deep(n) { let k = n.nodeName === 'CANVAS' ? 1 : 0; if (n.shadowRoot) k += deep(n.shadowRoot); for (const c of n.children || []) k += deep(c); return k; })(document.body)"
# the HTML tables as drawn: [[cell text, ...] per row] per table
TABLES = "(function deep(n, out) { if (n.nodeName === 'TABLE') out.push([...n.rows].map(r => [...r.cells].map(c => c.textContent))); if (n.shadowRoot) deep(n.shadowRoot, out); for (const c of n.children || []) deep(c, out); return out; })(document.body, [])"
DATA = "Bokeh.documents[0].get_model_by_name('{}').data"


def jobs_table(browser) -> list[list[str]]:
    """The jobs table as drawn: its header row, then one row per job."""
    return next((t for t in browser.evaluate(TABLES) or () if t and t[0][:2] == ["Job", "Label"]), [])


def busy(browser, job: int) -> bool:
    """Whether the drawn jobs table shows ``job`` using a GPU now (its own utilization above 0)."""
    rows = jobs_table(browser)
    column = rows[0].index("GPU util now") if rows else 0
    return any(r[0] == str(job) and r[column] not in ("0 %", "-") for r in rows[1:])


def _slow(x, delay=1.0):
    time.sleep(delay)
    return x


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address="127.0.0.1:0") as c:
        yield c


@pytest.fixture
def monitored(cluster):
    """``(client, monitor, dashboard base URL)``: attached, not started."""
    with Client(cluster) as client:
        monitor = Monitor(client, gpu_source="simulated", gpu_count=2)
        monitor.attach(polling_interval=100)
        try:
            yield client, monitor, f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        finally:
            monitor.shutdown()


def test_the_page_is_listed_for_jupyterlab_and_in_the_more_menu(monitored):
    _, _, base = monitored
    with urllib.request.urlopen(base + "/individual-plots.json", timeout=30) as r:
        assert json.load(r)["Individual Gpu Jobs"] == DASHBOARD_PAGE
    with urllib.request.urlopen(base + "/status", timeout=30) as r:
        assert f'<a href="{DASHBOARD_PAGE.strip("/")}">GPU Jobs</a>' in r.read().decode()


def test_two_jobs_live_in_a_browser(monitored, cluster, tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs Debian's chromium)")
    one, monitor, base = monitored
    with Client(cluster) as two, Chromium(height=900) as browser:
        browser.open(base + DASHBOARD_PAGE)
        browser.wait_for(f"{TEXT}.includes('No monitoring session has run yet')", what="the empty page's word")
        monitor.start()
        futures = [one.map(_slow, range(8)), two.map(_slow, range(100, 108))]  # 16 x 1 s on 4 threads
        for job in (1, 2):  # each busy now in the jobs table as drawn, and its bars in the strips
            wait_until(lambda: busy(browser, job), 30, f"job {job} busy in the jobs table")
            browser.wait_for(f"{DATA.format('strips')}.job.includes('job {job}')", 10, f"job {job} in the strips")
        wait_until(lambda: len(jobs_table(browser)) == 3, 10, "both jobs' rows")
        time.sleep(1.0)  # a few more bars
        text = browser.evaluate(TEXT)
        assert one.id in text and two.id in text, text  # the table as drawn, both labels
        assert "Sampling health per host" in text and "Points delivered" in text
        assert browser.evaluate(CANVASES) >= 2  # the two strips, drawn
        shot = tmp_path / "gpu-jobs-page.png"
        shot.write_bytes(browser.screenshot())
        shutil.copyfile(shot, "/tmp/gpu-jobs-page.png")
        print(f"\nscreenshot of the GPU Jobs page: {shot} (copy: /tmp/gpu-jobs-page.png)")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        assert browser.errors == []
        browser.errors.clear()  # leaving a Bokeh page may log its websocket's close
        # Dask's own GPU chart, blank without NVML on this machine, reads the figures our workers send. A GPU is
        # busy only while tasks run, and the 16 above may be done by now on a loaded machine: more run meanwhile
        # (up to 20 s on the 4 threads), the rest cancelled once the chart is fed.
        meanwhile = one.map(_slow, range(200, 280))
        browser.open(base + "/individual-gpu-utilization")
        browser.wait_for(
            "Bokeh.documents.length && Bokeh.documents[0].roots().length && [...Bokeh.documents[0].all_models]"
            ".some(m => m.data && m.data.utilization && m.data.worker.length == 2 && m.data.utilization.some(u => u > 0))",
            60,  # fed by heartbeats and the page's periodic update: a fresh CI clone once took over 20 s
            "Dask's GPU utilization chart fed",
        )
        one.cancel(meanwhile)
        assert not [e for e in browser.errors if e.startswith("uncaught")], browser.errors
        one.gather(futures[0])
        two.gather(futures[1])
        view = monitor._repr_html_()  # a notebook's view
        assert one.id in view and two.id in view and DASHBOARD_PAGE in view, view
        page = settled_totals(monitor)  # the page's busy GPU-seconds once a sample after the last task reached it
        monitor.stop()
    # the same counters, read back from the spool (the default sink) after the run
    table = monitor.accounting()
    totals = table[table["host"].isna() & table["job"].notna()].set_index("job")["busy_seconds"]
    print(f"\nbusy GPU-seconds per job: page {page}, query.accounting(db) {totals.to_dict()}")
    for job in (1, 2):
        assert page[job] == pytest.approx(totals[job], rel=0.05), (page, totals.to_dict())


def settled_totals(monitor, timeout: float = 30.0) -> dict:
    """``{job: busy GPU-seconds}`` the page shows once every task has ended on the workers (a cancelled task
    runs on) and a sample taken a second after that has reached the page (the host's latest beat, as the
    page's health row dates it)."""
    client = monitor.client
    wait_until(lambda: not any(client.run(_executing).values()), timeout, "the workers' tasks ended")
    ended = time.time()
    wait_until(lambda: client.run_on_scheduler(_page)[1] > ended + 1.0, timeout, "a sample after the tasks")
    return client.run_on_scheduler(_page)[0]


def _executing(dask_worker=None) -> int:
    return dask_worker.state.executing_count


def _page(dask_scheduler=None) -> tuple[dict, float]:
    """The page's busy GPU-seconds per job, and the time of the oldest host's latest sample."""
    live, now = dask_scheduler.plugins[JOBS_PLUGIN].live, time.time()
    sampled = min((now - h["age"] for h in live.health(now)), default=0.0)
    return {r["job"]: r["busy_s"] for r in live.jobs(now)}, sampled


def _hold(seconds):
    time.sleep(seconds)


def _set_env(values):
    import os

    os.environ.update(values)


def test_a_shared_gpu_gives_each_job_its_own_share_live(tmp_path, monkeypatch):
    """The replayed H200 shared by two worker processes (tests/data/nvml_h200_shared.json: a bf16 matmul,
    pid 666, and a process only holding memory, pid 668): the page's "now" figures give the matmul's job
    nearly all of the device's utilization and SM active, the holder's job ~0, and together at most the
    device's; memory held is each job's own process's. The page as a browser draws it then is the screenshot
    in docs/dashboard.md (path printed; a copy at /tmp/gpu-jobs-shared-h200.png)."""
    from nvml_shim import replay_env

    for key, value in replay_env(tmp_path, recording="nvml_h200_shared.json").items():
        monkeypatch.setenv(key, value)  # the workers' agent imports the replay (the workers inherit this)
    monkeypatch.setenv("DASK_DISTRIBUTED__DIAGNOSTICS__NVML", "False")
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        holder, matmul = sorted(pids)
        client.run(_set_env, {"FAKE_NVML_PIDS": f"668={pids[holder]},666={pids[matmul]}"})
        monitor = Monitor(client, gpu_source="nvml", spool_directory=str(tmp_path / "spool"))
        monitor.attach(polling_interval=200, job_type="manual")
        monitor.start()
        try:
            monitor.new_job(label="holder")
            hold = client.submit(_hold, 8, key="hold-1", workers=[holder])
            monitor.new_job(label="matmul")
            work = client.submit(_hold, 8, key="matmul-1", workers=[matmul])

            def both_known():
                rows = {r["label"]: r for r in monitor.live()}
                return len(rows) == 2 and all(r["util"] is not None and r["gpus"] for r in rows.values()) and rows

            rows = None
            deadline = time.monotonic() + 20
            while not (rows := both_known()) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert rows, monitor.live()
            if CHROMIUM is not None:
                _screenshot(f"http://127.0.0.1:{cluster.scheduler.http_server.port}", tmp_path)
            client.gather([hold, work])
        finally:
            monitor.stop()
        busy, idle = rows["matmul"], rows["holder"]
        assert busy["util"] >= 80 and busy["sm"] >= 80 and idle["util"] <= 2 and idle["sm"] <= 2, rows
        assert busy["util"] + idle["util"] <= 100.0 + 1e-9, rows
        assert idle["mem"] > 10_000 and busy["mem"] > 1_000, rows  # MiB each job's own process holds
        monitor.shutdown()


def _screenshot(base: str, tmp_path) -> None:
    with Chromium(height=700) as browser:
        browser.open(base + DASHBOARD_PAGE)
        wait_until(lambda: busy(browser, 2), 20, "the matmul's job busy in the jobs table")
        time.sleep(2.5)  # a few more bars
        shot = tmp_path / "gpu-jobs-shared-h200.png"
        shot.write_bytes(browser.screenshot())
        assert browser.errors == []
    shutil.copyfile(shot, "/tmp/gpu-jobs-shared-h200.png")
    print(f"\nscreenshot of the GPU Jobs page, replayed shared H200: {shot} (copy: /tmp/gpu-jobs-shared-h200.png)")
