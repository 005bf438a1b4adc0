"""Issue 10's H100 scenario on a real GPU: two workers share it, per-job figures stay each job's own.

Runs only where NVML sees a GPU and torch (or cupy) can allocate on it; skipped
elsewhere. Job 1 (worker 0) holds 4 GiB and runs matmuls, job 2 (worker 1) holds
16 GiB and runs matmuls, job 3 (worker 0) sleeps; each job is its own client.
"""

import time

import pytest

pytestmark = pytest.mark.gpu
GIB = 2**30


def _gpu_ready():
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return "no GPU"
    except Exception as e:
        return f"NVML unavailable ({e})"
    for module in ("torch", "cupy"):
        try:
            __import__(module)
            return None
        except ImportError:
            continue
    return "neither torch nor cupy is installed"


_WHY = _gpu_ready()
if _WHY:
    pytest.skip(f"needs a real GPU: {_WHY}", allow_module_level=True)


def hold_and_multiply(gib, seconds):
    """Allocate ``gib`` GiB on the GPU and run matmuls for ``seconds``; returns bytes allocated."""
    try:
        import torch

        block = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        end = time.time() + seconds
        while time.time() < end:
            a @ a
        torch.cuda.synchronize()
        size = block.numel()
        del block, a
        torch.cuda.empty_cache()
    except ImportError:
        import cupy

        block = cupy.empty(int(gib * GIB), dtype=cupy.uint8)
        a = cupy.random.rand(4096, 4096, dtype=cupy.float32)
        end = time.time() + seconds
        while time.time() < end:
            a @ a
        cupy.cuda.Device().synchronize()
        size = block.size
        del block, a
        cupy.get_default_memory_pool().free_all_blocks()
    return size


def test_two_workers_sharing_one_gpu_keep_their_own_numbers(tmp_path):
    from distributed import Client, LocalCluster

    from dask_influx_metrics import Monitor

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as admin,
    ):
        w0, w1 = sorted(admin.scheduler_info()["workers"])
        monitor = Monitor(admin, gpu_source="nvml", sink="spool", spool_directory=str(tmp_path))
        monitor.attach(tracking=["total-mem", "worker-gpu-mem", "compute-util", "tasks"], polling_interval=100)
        monitor.start()
        for worker, gib, seconds in ((w0, 4, 3), (w1, 16, 3)):
            with Client(cluster) as job:
                job.submit(hold_and_multiply, gib, seconds, workers=[worker], pure=False).result()
        with Client(cluster) as job:
            job.submit(time.sleep, 2, workers=[w0], pure=False).result()
        monitor.stop()
        own = monitor.get_peaks("worker-gpu-mem")  # [{job: [bytes per GPU]}, ...] per worker, address order
        device = monitor.get_peaks("total-mem")
        print("worker-gpu-mem", own, "total-mem", device)
        assert 4 * GIB <= own[0][1][0] < 6 * GIB, "job 1: its 4 GiB plus one CUDA context"
        assert 16 * GIB <= own[1][2][0] < 18 * GIB, "job 2: its 16 GiB plus one CUDA context"
        peaks_job1 = [d[1][0] for d in device if 1 in d]
        assert peaks_job1 and max(peaks_job1) < 10 * GIB, "job 1 is never charged job 2's 16 GiB"
        monitor.shutdown()
