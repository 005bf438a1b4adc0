"""A throw-away Prometheus server for the tests: Debian's ``prometheus`` binary on a free loopback port, its
own config (scraping the given targets every second) and storage in a temporary folder; never the system
service. :func:`start` returns a handle whose ``query`` runs PromQL; ``stop()`` ends the process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

import requests
import yaml

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> bool:
    return os.path.isfile(BINARY) and os.access(BINARY, os.X_OK)


def require() -> None:
    """Skip the test without the binary; under CI=true (scripts/setup.sh installs it) fail instead."""
    import pytest

    if not available():
        message = f"prometheus not found at {BINARY} (Debian package 'prometheus')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


class Prometheus:
    def __init__(self, proc, root, url):
        self.proc, self.root, self.url = proc, root, url

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """The instant vector of ``promql`` (``[{"metric": {...}, "value": [t, "v"]}]``)."""
        params = {"query": promql, **({"time": at} if at is not None else {})}
        answer = requests.get(f"{self.url}/api/v1/query", params=params, timeout=10).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def targets_up(self) -> bool:
        answer = requests.get(f"{self.url}/api/v1/targets", timeout=10).json()
        active = answer["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def log(self) -> str:
        with open(os.path.join(self.root, "prometheus.log"), errors="replace") as f:
            return f.read()[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def start(targets: list[str], timeout: float = 30.0) -> Prometheus:
    """Prometheus scraping ``targets`` (``host:port``) every second; ready when its API answers."""
    root = tempfile.mkdtemp(prefix="prometheus-test-")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "dask-influx-metrics", "static_configs": [{"targets": list(targets)}]}],
    }
    with open(os.path.join(root, "prometheus.yml"), "w") as f:
        yaml.safe_dump(config, f)
    port = free_port()
    with open(os.path.join(root, "prometheus.log"), "wb") as log:
        proc = subprocess.Popen(
            [
                BINARY,
                f"--config.file={os.path.join(root, 'prometheus.yml')}",
                f"--storage.tsdb.path={os.path.join(root, 'data')}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(proc, root, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{server.url}/-/ready", timeout=1).status_code == 200:
                return server
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            text = server.log()
            server.stop()
            raise RuntimeError(f"prometheus did not start: {text}")
        time.sleep(0.2)
