"""scripts/dask_suite.py: what it counts as the monitor's doing in a run of distributed's own tests.

Its pytest runs are replaced by JUnit files written here; the script itself runs in CI (scripts/dask-suite.sh).
"""

import importlib.util
import os
import pathlib
from xml.sax.saxutils import quoteattr

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPANS = "distributed/tests/test_spans.py::test_spans"
ANNOTATED = (  # the failure message of test_spans with the monitor on, as pytest writes it in JUnit XML
    "AssertionError: assert {'influx_metr... 1, 'dag': 1}} == {}\n  \n  Left contains 1 more item:\n"
    "  {'influx_metrics': {'dag': 1, 'job': 1, 'session': '20261128T160157-188013'}}\n  Use -v to get more diff"
)
FULL_DIFF = (  # the same under CI=true: pytest shows the full diff
    "AssertionError: assert {'influx_metr... 1, 'dag': 1}} == {}\n  \n  Left contains 1 more item:\n"
    "  {'influx_metrics': {'dag': 1,\n                      'job': 1,\n"
    "                      'session': '20261128T204233-518573-502144'}}\n  \n"
    "  Full diff: (-: missing in left side, +: extra in left side)\n  - {}\n  + {\n"
    "  +     'influx_metrics': {\n  +         'session': '20261128T204233-518573-502144',\n"
    "  +         'job': 1,\n  +         'dag': 1,\n  +     },\n  + }"
)


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("dask_suite", os.path.join(ROOT, "scripts", "dask_suite.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def src(tmp_path):
    """A stand-in for distributed's checkout: the test files the JUnit class names point at."""
    for path in ("distributed/tests/test_spans.py", "distributed/tests/test_steal.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    return tmp_path


def junit(path, cases) -> None:
    """``cases``: (classname, name, outcome, message)."""
    body = {"passed": "", "failed": '<failure message="{}"/>', "skipped": '<skipped message="{}"/>'}
    rows = [
        f'<testcase classname="{c}" name="{n}">{body[o].format(quoteattr(m)[1:-1])}</testcase>' for c, n, o, m in cases
    ]
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(rows)}</testsuite></testsuites>')


def test_outcomes_name_tests_as_pytest_does(suite, src, tmp_path):
    junit(
        tmp_path / "run.xml",
        [
            ("distributed.tests.test_spans", "test_spans", "failed", ANNOTATED),
            ("distributed.tests.test_steal", "test_x[1-2]", "passed", ""),
            ("distributed.tests.test_steal.TestClass", "test_y", "skipped", "need --runslow"),
        ],
    )
    got = suite.outcomes(str(tmp_path / "run.xml"), str(src))
    assert got == {
        SPANS: ("failed", ANNOTATED),
        "distributed/tests/test_steal.py::test_x[1-2]": ("passed", ""),
        "distributed/tests/test_steal.py::TestClass::test_y": ("skipped", "need --runslow"),
    }
    assert suite.counts(got) == {"passed": 1, "failed": 1, "skipped": 1}


def test_the_documented_annotation_is_the_one_difference_allowed(suite):
    assert suite.documented(SPANS, ANNOTATED)
    other = ANNOTATED.replace("Use -v", "Right contains 1 more item:\n  {'span': {}}\n  Use -v")
    assert not suite.documented(SPANS, other), "anything beside our annotation is a failure"
    assert not suite.documented("distributed/tests/test_spans.py::test_other", ANNOTATED)
    assert suite.documented(SPANS, FULL_DIFF), "as pytest writes it under CI=true: with the full diff"
    assert not suite.documented(SPANS, FULL_DIFF.replace("+     },", "+     },\n  +     'span': {},")), "nor there"


def test_every_scheduler_needs_its_session_in_the_spool(suite, tmp_path):
    (tmp_path / "spool" / "s1").mkdir(parents=True)
    (tmp_path / "schedulers").write_text(
        "tcp://a:1 s1 distributed/tests/test_x.py::test_a (call)\n"
        "tcp://a:2 - distributed/tests/test_x.py::test_b (call)\n"
        "tcp://a:3 s3 distributed/tests/test_x.py::test_c (setup)\n"
    )
    built, missing = suite.unmonitored(str(tmp_path / "schedulers"), str(tmp_path / "spool"))
    assert built == 3
    assert missing == [
        "tcp://a:2 in distributed/tests/test_x.py::test_b (call) (no session)",
        "tcp://a:3 in distributed/tests/test_x.py::test_c (setup) (session s3: nothing in the spool)",
    ]


@pytest.mark.parametrize(
    "plain, again, code",
    [
        ("passed", "failed", 1),  # fails twice monitored, passes plain: the monitor's doing
        ("passed", "passed", 0),  # flaky: passed when run again monitored
        ("failed", None, 0),  # fails plain too: not ours
    ],
)
def test_a_failure_counts_only_when_it_fails_again_monitored_and_passes_plain(
    suite, src, monkeypatch, plain, again, code
):
    steal = ("distributed.tests.test_steal", "test_x", "failed", "AssertionError")
    runs = []

    def run_pytest(python, where, tests, path, env):
        runs.append(("monitored" if env else "plain", list(tests)))
        if env is None:
            junit_cases = [(*steal[:2], plain, "")]
        elif len(runs) == 1:
            junit_cases = [steal, ("distributed.tests.test_spans", "test_spans", "failed", ANNOTATED)]
            spool, schedulers = env["DASK_INFLUX_METRICS__SPOOL__DIRECTORY"], env["DASK_SUITE_SCHEDULERS"]
            os.makedirs(os.path.join(spool, "s1"))
            with open(schedulers, "w") as f:
                f.write("tcp://a:1 s1 t (call)\n")
        else:
            junit_cases = [(*steal[:2], again, "")]
        junit(pathlib.Path(path), junit_cases)
        return 1.0

    monkeypatch.setattr(suite, "run_pytest", run_pytest)
    assert suite.main(["--python", "p", "--src", str(src)]) == code
    assert runs[1] == ("plain", ["distributed/tests/test_steal.py::test_x"]), "only the suspect again, plain"
    assert len(runs) == (3 if plain == "passed" else 2)


def test_without_the_archive_it_says_why_and_passes(tmp_path):
    """CI machines without ../shared/data/ skip it, saying so."""
    import shutil
    import subprocess

    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "dask-suite.sh"), tmp_path / "repo" / "scripts")
    proc = subprocess.run(["bash", "scripts/dask-suite.sh"], cwd=tmp_path / "repo", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "dask-suite: skipped: ../shared/data/distributed-src-40fcd99a8.tar.gz is not there" in proc.stdout
    assert not (tmp_path / "repo" / ".venv-dask-suite").exists()
