"""benchmarks/hostcalls: its counter counts a sampling thread's calls and bytecodes per sample, from one sleep to the
next."""

import json
import sys
import threading
import time

from benchmarks import hostcalls


def test_the_counter_counts_functions_entered_and_bytecodes_between_sleeps(tmp_path, monkeypatch):
    monkeypatch.setenv("HOSTCALLS_DIR", str(tmp_path))
    namespace: dict = {}
    exec(compile(hostcalls.SITECUSTOMIZE % {"skip": 1, "samples": 3}, "sitecustomize", "exec"), namespace)

    def one():  # a sample: two Python functions entered, one C function (len) called
        def two():
            return len("x")

        return two()

    def sampler():
        namespace["_install"]("test", 1, 3)
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
    # each bytecode of the two functions, the same in every sample; none of the sampling loop's own frame
    by = counts["bytecodes_by"]
    assert sorted(k.rsplit(".", 1)[-1] for k in by) == ["one", "two"]
    assert counts["bytecodes"] == sum(by.values()) and all(v == int(v) > 0 for v in by.values())
    assert sys.getprofile() is None and sys.gettrace() is None  # only the sampling thread was counted
