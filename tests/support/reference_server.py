"""The Node reference server (``@durable-streams/server`` from npm, file-backed) as a test subprocess.

The connector must also work against it (it advertises no durastream extensions), so compatibility tests
run the same bodies against this server. ``make test`` installs it into ``bench/node_modules``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.support.external_server import ExternalServer

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


class ReferenceServer(ExternalServer):
    """``node bench/reference_server.mjs <port> <data-dir> <long-poll-ms>``; ready when it prints READY."""

    def __init__(self, data_dir: Path, *, long_poll_timeout: float = 0.5) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.long_poll_ms = int(long_poll_timeout * 1000)

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
