"""CSV files in the old dask-metrics layout: numbering, round trip, malformed input, the old tool's job rule."""

import glob
import os
import tarfile

import pandas as pd
import pytest

from dask_influx_metrics.client import csvfiles, peaks
from dask_influx_metrics.client.monitor import Monitor

OLD = (
    'job,dag,timestamp,total-mem,mem-util,compute-util\n'
    '0,0,6.27e-05,"30772297728, 30068703232","0, 0","0, 0"\n'
    '1,0,0.5296,"31138250752, 30068703232","3, 0","4, 0"\n'
    '1,2,0.7619,"31215845376, 30068703232","0, 7","4, 60"\n'
    '2,3,0.9836,"31326994432, 30068703232","1, 0","11, 0"\n'
)


def _table(i, values, worker=None):
    t = pd.DataFrame(
        {
            "job": ["1", "1,2", "2"],
            "dag": ["1", "1,2", "2"],
            "timestamp": [0.0, 0.2, 0.4],
            "compute-util[0]": values,
            "compute-util[1]": [1.0, 2.0, 3.0],
            "tasks": [1, 2, 1],
        }
    )
    t.attrs = {"worker": worker or f"tcp://10.0.0.{i}:1", "worker_index": i}
    return t


def test_reads_the_old_tools_own_files(tmp_path):
    (tmp_path / "worker_0.csv").write_text(OLD)
    t = csvfiles.read_worker_csv(tmp_path / "worker_0.csv")
    assert list(t.columns) == [
        "job",
        "dag",
        "timestamp",
        "total-mem[0]",
        "total-mem[1]",
        "mem-util[0]",
        "mem-util[1]",
        "compute-util[0]",
        "compute-util[1]",
    ]
    assert t["total-mem[0]"].max() == 31326994432
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=True) == [{1: [4, 60], 2: [11, 0]}]
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=False) == [[11, 60]]
    # numeric maxima: "4" < "11" as numbers, not as strings
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", workers=[0], per_job=False)[0][0] == 11


# job 1's peak (90 on GPU 0) is in a row whose dag still reads 0, as the old tool's counter lagged
LAGGING = (
    'job,dag,timestamp,compute-util\n'
    '0,0,0.0,"99, 0"\n'
    '1,0,0.5,"90, 5"\n'
    '1,1,1.0,"40, 6"\n'
    '2,0,1.5,"70, 7"\n'
    '2,2,2.0,"20, 8"\n'
)


def test_old_tools_files_count_every_row_of_a_job(tmp_path):
    (tmp_path / "worker_0.csv").write_text(LAGGING)
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=True) == [{1: [90, 6], 2: [70, 8]}]
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=False) == [[99, 8]]


def test_our_files_keep_the_busy_only_rule(tmp_path):
    ours = LAGGING.replace("compute-util\n", "compute-util,worker\n").replace('"\n', '",tcp://h:1\n')
    (tmp_path / "worker_0.csv").write_text(ours)
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=True) == [{1: [40, 6], 2: [20, 8]}]
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=False) == [[99, 8]]


ARCHIVE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "gpubdb-csv.tgz"
)


@pytest.fixture(scope="module")
def gpubdb(tmp_path_factory):
    """The old tool's real GPU-BDB output (16 ``worker_<i>.csv``, 8 GPUs each), unpacked."""
    if not os.path.isfile(ARCHIVE):
        pytest.skip(
            f"{os.path.normpath(ARCHIVE)} is not there (the old tool's real GPU-BDB CSV output, "
            "expected in shared/data/ beside the checkout)"
        )
    directory = tmp_path_factory.mktemp("gpubdb")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(directory, filter="data")
    (first,) = glob.glob(os.path.join(directory, "**", "worker_0.csv"), recursive=True)
    return os.path.dirname(first)


def _old_rule(path, metric):
    """Peaks by the old tool's rule in plain pandas: per job every row of it (job 0 left out), whole run every row."""
    raw = pd.read_csv(path, dtype={"job": str, "dag": str})
    values = raw[metric].str.split(",", expand=True).astype(float)
    jobs = raw["job"].astype(int)
    per_job = values[jobs != 0].groupby(jobs[jobs != 0]).max()
    return {j: row.tolist() for j, row in per_job.iterrows()}, values.max().tolist()


@pytest.mark.parametrize("metric", ["total-mem", "compute-util"])
def test_gpubdb_peaks_are_the_old_tools(gpubdb, metric):
    files = csvfiles.csv_files(gpubdb)
    assert list(files) == list(range(16))
    expected = [_old_rule(files[i], metric) for i in files]
    assert Monitor.peaks_from_csv(gpubdb, metric, per_job=True) == [e[0] for e in expected]
    assert Monitor.peaks_from_csv(gpubdb, metric, per_job=False) == [e[1] for e in expected]


def test_gpubdb_job_1_reads_what_the_old_tools_users_saw(gpubdb):
    """Worker 0, job 1: rows at 4.4-5.7 s carry dag 0 while GPU 5 ran at up to 81 %; busy-only read 71."""
    assert Monitor.peaks_from_csv(gpubdb, "compute-util", workers=[0])[0][1][5] == 81


def test_workers_2_means_worker_2_not_worker_10(tmp_path):
    tables = [_table(i, [float(i), 0.0, 0.0]) for i in range(11)]
    csvfiles.write_tables(tables, tmp_path)
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", workers=[2], per_job=False) == [[2, 3]]
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", workers=[10], per_job=False) == [[10, 3]]
    one = Monitor.peaks_from_csv(tmp_path, "compute-util", workers=[2], per_job=True)
    assert isinstance(one, list) and one == [{1: [2, 2], 2: [0, 3]}]
    manifest = pd.read_csv(tmp_path / "workers.csv")
    assert list(manifest["index"]) == list(range(11)) and manifest["worker"][10] == "tcp://10.0.0.10:1"
    with pytest.raises(ValueError, match=r"worker\(s\) \[11\] not in .*present: \[0, 1, 2"):
        Monitor.peaks_from_csv(tmp_path, "compute-util", workers=[11])
    with pytest.raises(
        ValueError, match=r"metric 'mem-util' is not in the CSV files.*present: \['compute-util', 'tasks'\]"
    ):
        Monitor.peaks_from_csv(tmp_path, "mem-util")


def test_round_trip_keeps_values_and_address(tmp_path):
    t = _table(3, [0.1, 1e-7, 123456789.125], worker="tcp://[::1]:8786")
    t["running"] = ['["a, b", 1]', "[]", '["x"]']
    path, manifest = csvfiles.write_tables([t], tmp_path)
    assert manifest == str(tmp_path / "workers.csv")
    back = csvfiles.read_worker_csv(path)
    assert back.attrs == {"worker": "tcp://[::1]:8786", "worker_index": 3, "units": {}, "job_rule": "busy"}
    pd.testing.assert_frame_equal(back[t.columns], t, check_dtype=False)


def test_clear_dir_removes_only_our_files(tmp_path):
    (tmp_path / "worker_7.csv").write_text(OLD)
    (tmp_path / "notes.txt").write_text("keep me")
    csvfiles.write_tables([_table(0, [1.0, 2.0, 3.0])], tmp_path, clear_dir=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "worker_0.csv", "workers.csv"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("job,dag,timestamp,x\n1,1,0.5,3\n1,1,zero,4\n", r"worker_0\.csv, line 3: column 'timestamp'"),
        (
            'job,dag,timestamp,x\n1,1,0.5,"1, 2"\n1,1,0.7,"1, 2, 3"\n',
            r"line 3: column 'x' has 3 values, earlier rows have 2",
        ),
        ('job,dag,timestamp,x\n1,1,0.5,"1, 2"\n1,1,0.7,"1, oops"\n', r"line 3: column 'x': '1, oops' is not a number"),
        ("job,timestamp,x\n1,0.5,3\n", r"line 1: missing column\(s\) \['dag'\]"),
        ("", r"empty file"),
    ],
)
def test_malformed_csv_names_file_and_line(tmp_path, text, message):
    (tmp_path / "worker_0.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        csvfiles.read_worker_csv(tmp_path / "worker_0.csv")


def test_no_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no worker_<n>.csv files"):
        csvfiles.read_tables(tmp_path)


def test_peaks_lists_keep_workers_without_data():
    tidy = peaks.from_tables([_table(0, [5.0, 6.0, 7.0])], "compute-util", per_job=True)
    assert peaks.to_lists(tidy, True, workers=[0, 1]) == [{1: [6, 2], 2: [7, 3]}, {}]
