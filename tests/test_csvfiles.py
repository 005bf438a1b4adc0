"""CSV files in the old dask-metrics layout: numbering, round trip, malformed input."""

import pandas as pd
import pytest

from dask_influx_metrics.client import csvfiles
from dask_influx_metrics.client import peaks
from dask_influx_metrics.client.monitor import Monitor

OLD = ('job,dag,timestamp,total-mem,mem-util,compute-util\n'
       '0,0,6.27e-05,"30772297728, 30068703232","0, 0","0, 0"\n'
       '1,0,0.5296,"31138250752, 30068703232","3, 0","4, 0"\n'
       '1,2,0.7619,"31215845376, 30068703232","0, 7","4, 60"\n'
       '2,3,0.9836,"31326994432, 30068703232","1, 0","11, 0"\n')


def _table(i, values, worker=None):
    t = pd.DataFrame({"job": ["1", "1,2", "2"], "dag": ["1", "1,2", "2"], "timestamp": [0.0, 0.2, 0.4],
                      "compute-util[0]": values, "compute-util[1]": [1.0, 2.0, 3.0], "tasks": [1, 2, 1]})
    t.attrs = {"worker": worker or f"tcp://10.0.0.{i}:1", "worker_index": i}
    return t


def test_reads_the_old_tools_own_files(tmp_path):
    (tmp_path / "worker_0.csv").write_text(OLD)
    t = csvfiles.read_worker_csv(tmp_path / "worker_0.csv")
    assert list(t.columns) == ["job", "dag", "timestamp", "total-mem[0]", "total-mem[1]", "mem-util[0]",
                               "mem-util[1]", "compute-util[0]", "compute-util[1]"]
    assert t["total-mem[0]"].max() == 31326994432
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=True) == [{1: [4, 60], 2: [11, 0]}]
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", per_job=False) == [[11, 60]]
    # numeric maxima: "4" < "11" as numbers, not as strings
    assert Monitor.peaks_from_csv(tmp_path, "compute-util", workers=[0], per_job=False)[0][0] == 11


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
    with pytest.raises(ValueError, match=r"metric 'mem-util' is not in the CSV files.*present: \['compute-util', 'tasks'\]"):
        Monitor.peaks_from_csv(tmp_path, "mem-util")


def test_round_trip_keeps_values_and_address(tmp_path):
    t = _table(3, [0.1, 1e-7, 123456789.125], worker="tcp://[::1]:8786")
    t["running"] = ['["a, b", 1]', "[]", '["x"]']
    (path,) = csvfiles.write_tables([t], tmp_path)
    back = csvfiles.read_worker_csv(path)
    assert back.attrs == {"worker": "tcp://[::1]:8786", "worker_index": 3, "units": {}}
    pd.testing.assert_frame_equal(back[t.columns], t, check_dtype=False)


def test_clear_dir_removes_only_our_files(tmp_path):
    (tmp_path / "worker_7.csv").write_text(OLD)
    (tmp_path / "notes.txt").write_text("keep me")
    csvfiles.write_tables([_table(0, [1.0, 2.0, 3.0])], tmp_path, clear_dir=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "worker_0.csv", "workers.csv"]


@pytest.mark.parametrize("text, message", [
    ("job,dag,timestamp,x\n1,1,0.5,3\n1,1,zero,4\n", r"worker_0\.csv, line 3: column 'timestamp'"),
    ('job,dag,timestamp,x\n1,1,0.5,"1, 2"\n1,1,0.7,"1, 2, 3"\n', r"line 3: column 'x' has 3 values, earlier rows have 2"),
    ('job,dag,timestamp,x\n1,1,0.5,"1, 2"\n1,1,0.7,"1, oops"\n', r"line 3: column 'x': '1, oops' is not a number"),
    ("job,timestamp,x\n1,0.5,3\n", r"line 1: missing column\(s\) \['dag'\]"),
    ("", r"empty file"),
])
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
