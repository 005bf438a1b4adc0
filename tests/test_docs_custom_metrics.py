"""docs/custom-metrics.md's examples run (in order, in one namespace) and show the real errors."""

import contextlib
import io
import pathlib
import re

import pytest

from dask_influx_metrics import custom_metric

DOCS = pathlib.Path(__file__).parent.parent / "docs"


def blocks(page: str, kind: str = "python") -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```$", (DOCS / page).read_text(), flags=re.S | re.M)


def test_custom_metrics_page_runs(client, tmp_path):
    """On a LocalCluster with simulated GPUs (so the example's NVML metric fails, as on workers without NVML)."""
    settings = dict(gpu_source="simulated", gpu_count=1, sink="spool", spool_directory=str(tmp_path))
    scope, out = {"client": client}, io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            for code in blocks("custom-metrics.md"):
                exec(code.replace("Monitor(client)", f"Monitor(client, **{settings!r})"), scope)
    finally:
        if "monitor" in scope:
            scope["monitor"].shutdown()
    printed = out.getvalue().splitlines()
    assert re.fullmatch(r"\[\[\d+(\.\d+)?\], \[\d+(\.\d+)?\]\]", printed[0]), (
        printed
    )  # ready-queue, one list per worker
    assert printed[1].startswith("custom metric 'gpu-fan' failed: ") and "(first report, on tcp://" in printed[1]
    assert "'gpu-fan' failed" in printed[2]  # the notes


def test_custom_metrics_page_shows_the_real_signature_error():
    (shown,) = blocks("custom-metrics.md", "text")

    def ready_queue(worker):
        return 0

    with pytest.raises(TypeError) as error:
        custom_metric("ready-queue")(ready_queue)
    assert " ".join(shown.split()) == f"TypeError: {error.value}"
