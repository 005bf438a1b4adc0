"""The seqlock buffer on a full tmpfs (issue 43): reserved whole when created, so no access faults later; a
file system with no room is a clean error at creation, leaving nothing behind."""

from __future__ import annotations

import sys
import textwrap

import pytest
from tmpfs import run_in_tmpfs, why_not

# In a 1 MiB tmpfs: a buffer made, the file system filled to the last byte, then every page of it written and
# read, by the writer and through another mapping; then a second buffer that no longer fits.
FULL = textwrap.dedent(
    """
    import errno, os, sys
    from dask_influx_metrics.link.seqlock import SnapshotBuffer
    d = sys.argv[1]
    size = 256 << 10
    buf = SnapshotBuffer.create(size, path=os.path.join(d, "a.snap"))
    with open(os.path.join(d, "fill"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    for n in (1, size // 2, buf.capacity):
        buf.write(b"y" * n)
        assert SnapshotBuffer.open(os.path.join(d, "a.snap"), size).read() == b"y" * n
    try:
        SnapshotBuffer.create(size, path=os.path.join(d, "b.snap"))
    except OSError as e:
        print("create:", errno.errorcode[e.errno], sorted(os.listdir(d)))
    """
)


def test_a_buffer_never_faults_on_a_full_tmpfs_and_one_that_does_not_fit_is_a_clean_error():
    if why_not():
        pytest.skip(why_not())
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        done = run_in_tmpfs([sys.executable, "-c", FULL, d], {d: "1m"})
    assert done.returncode == 0, f"exit {done.returncode} (-7: SIGBUS): {done.stderr[-2000:]}"
    assert done.stdout.strip() == "create: ENOSPC ['a.snap', 'fill']", "no half-made file left behind"
