"""The Node reference server (``@durable-streams/server`` from npm, file-backed) as a test subprocess.

The connector must also work against it (it advertises no durastream extensions), so compatibility tests
run the same bodies against this server. ``make test`` installs it into ``bench/node_modules``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.support.server_process import free_port

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


class ReferenceServer:
    """``node bench/reference_server.mjs <port> <data-dir> <long-poll-ms>``; ready when it prints READY."""

    def __init__(self, data_dir: Path, *, long_poll_timeout: float = 0.5) -> None:
        self.data_dir = data_dir
        self.long_poll_ms = int(long_poll_timeout * 1000)
        self.port = free_port()
        self._process: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stream_root(self) -> str:
        return f"{self.base_url}/v1/stream"

    def stream_url(self, path: str) -> str:
        return f"{self.stream_root}/{path}"

    def start(self, timeout: float = 30.0) -> ReferenceServer:
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("node is not on PATH; the reference server needs Node 20")
        if not (BENCH_DIR / "node_modules" / "@durable-streams" / "server").is_dir():
            raise RuntimeError("bench/node_modules is missing: run `make npm` (make test does)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [
                node,
                "reference_server.mjs",
                str(self.port),
                str(self.data_dir),
                str(self.long_poll_ms),
            ],
            cwd=BENCH_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + timeout
        assert self._process.stdout is not None
        while time.monotonic() < deadline:
            line = self._process.stdout.readline()
            if line.startswith("READY"):
                return self
            if not line and self._process.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"reference server did not start within {timeout} s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
