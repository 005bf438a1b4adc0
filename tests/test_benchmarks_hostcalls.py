"""benchmarks/hostcalls: its counter counts a sampling thread's calls per sample, from one sleep to the next."""

import json
import sys
import threading
import time

from benchmarks import hostcalls


def test_the_counter_counts_functions_entered_between_sleeps(tmp_path, monkeypatch):
    monkeypatch.setenv("HOSTCALLS_DIR", str(tmp_path))
    namespace: dict = {}
    exec(compile(hostcalls.SITECUSTOMIZE % {"skip": 1, "samples": 3}, "sitecustomize", "exec"), namespace)

    def one():  # a sample: two Python functions entered, one C function (len) called
        def two():
            return len("x")

        return two()

    def sampler():
        sys.setprofile(namespace["_counter"]("test", 1, 3))
        for _ in range(6):  # 1 skipped, 3 counted, then the counter writes and stops
            one()
            time.sleep(0)

    thread = threading.Thread(target=sampler)
    thread.start()
    thread.join(10)
    (path,) = tmp_path.glob("test.*.json")
    counts = json.loads(path.read_text())
    assert counts["samples"] == 3
    assert counts["python"] == 2.0 and counts["c"] == 1.0 and counts["distinct"] == 2
    assert sys.getprofile() is None  # only the sampling thread was profiled
