"""deploy/README.md, "Read the results back", checked offline (issue 45 item 4): every shell block
parses, every ``dask-influx-metrics`` line is a command line the CLI takes and runs, and the Python
block runs, each URL's host and port pointed at this test's influxd (InfluxQL) or a fake 2.x (Flux),
whose database holds two sessions."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
from click.testing import CliRunner

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.client.cli import cli

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
FENCE = re.compile(r"^```(\w+)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
URL = re.compile(r"http://(?:[\w-]+(?::[^@\s]*)?@)?[\w.-]+:\d+")
LATEST = "20240503T120000-000001-a1b2c3"
ENV = {"INFLUX_TOKEN": "t0ken", "INFLUX3_TOKEN": "apiv3_t0ken", "INFLUX_PASSWORD": "secret"}


def section() -> str:
    with open(os.path.join(ROOT, "deploy", "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("## Read the results back")
    return text[start : text.index("\n## ", start + 1)]


def blocks(language: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(section()) if m.group(1) == language]


@pytest.fixture(scope="module")
def stack(influxd):
    """What the section reads: a database with two sessions (InfluxQL) and a fake 2.x with the same (Flux)."""
    pytest.importorskip("influxdb_client")
    from fake_influx2 import FakeInflux
    from flux_points import answer_from
    from test_query_sessions import DAY, session_a, session_b

    later = [  # session a's points as the latest session (it has the GPU and host metrics a summary needs)
        p._replace(tags={**p.tags, "session": LATEST}, time_ns=p.time_ns + 2 * DAY) for p in session_a()
    ]
    points = session_b() + later
    database = influxd.create_database("deployed")
    influxd.write(b"\n".join(lineprotocol.encode_many(points)), db=database)
    fake = FakeInflux()
    fake.answer = answer_from(points, buckets=("dask_metrics",))
    yield {"influxql": influxd.url, "flux": fake.url, "database": database}
    fake.stop()


def _pointed(text: str, stack: dict) -> str:
    """A line of the section, pointed at the test's servers: Flux at the fake, the rest at influxd."""
    flux = re.search(r"language[ =]\"?flux", text) is not None
    server = stack["flux" if flux else "influxql"]
    text = URL.sub(lambda m: server, text)
    return text if flux else text.replace("dask_metrics", stack["database"])


def test_the_section_shows_compose_kubernetes_tokens_users_and_the_dbrp_mapping():
    text = section()
    for needed in ("kubectl -n dask-metrics port-forward", "influx v1 dbrp", "--token", "--username", "--session"):
        assert needed in text, needed
    assert {m.group(0) for m in URL.finditer(text)} >= {
        "http://127.0.0.1:8086",
        "http://127.0.0.1:8181",
        "http://influxdb.dask-metrics.svc:8086",
    }


def test_every_shell_block_parses():
    for body in blocks("bash"):
        done = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr + body


def test_every_command_line_runs_against_the_stack(stack, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the report lands here
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    lines = [line for body in blocks("bash") for line in body.splitlines() if line.startswith("dask-influx-metrics")]
    assert len(lines) >= 8
    for line in lines:
        words = shlex.split(os.path.expandvars(_pointed(line, stack)), comments=True)
        result = CliRunner().invoke(cli, words[1:])
        assert result.exit_code == 0, f"{line}\n{result.output}"
        if "sessions" in words:  # the listing: newest first, with what --session takes
            assert result.stdout.splitlines()[1].split()[:2] == ["1", LATEST], result.stdout
        else:
            assert "the latest of 2" in result.stderr or "--session" in line, result.stderr


def test_the_python_block_runs_against_the_stack(stack, monkeypatch, capsys):
    monkeypatch.setenv("INFLUX_TOKEN", ENV["INFLUX_TOKEN"])
    (body,) = blocks("python")
    code = "\n".join(_pointed(line, stack) for line in body.splitlines())
    exec(compile(code, "deploy/README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "the latest of 2" in out and LATEST in out


@pytest.mark.parametrize("form", ["http://reader:secret@127.0.0.1:8086", "http://127.0.0.1:8086/"])
def test_other_url_forms_are_accepted(stack, form):
    url = form.replace("127.0.0.1:8086", stack["influxql"].removeprefix("http://"))
    with query.connect(url, stack["database"]) as db:
        assert db.workers() and "secret" not in repr(db) + db.scope()
