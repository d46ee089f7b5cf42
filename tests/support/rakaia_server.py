"""rakaia (``rakaia-streams`` on PyPI), a third Durable Streams server that no one here wrote, as a test
subprocess: its ASGI app on its JSONL-file store, served by uvicorn on loopback.

Its own defaults, read from its source before running it: the standalone entry point binds 127.0.0.1:4437
with an *in-memory* store; ``JsonlStreamStore(root)`` keeps one directory per stream with ``fsync=True``
by default; the long-poll window comes from ``LONG_POLL_TIMEOUT`` (3 s); its fault-injection endpoint is
off unless ``RAKAIA_ENABLE_FAULT_INJECTION`` is set (we never set it). We bind a free loopback port, use the
file store in a temporary directory (so a kill and restart keeps the data), and shorten the long-poll
window as for the other servers. It advertises no durastream extensions and has no forks and no §6
subscriptions (what that means for the connector: docs/compatibility.md).

Run as ``python -m tests.support.rakaia_server <port> <data-dir>``; prints ``READY`` once it listens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.support.external_server import ExternalServer

ROOT = Path(__file__).resolve().parents[2]


class RakaiaServer(ExternalServer):
    """A rakaia process serving the streams of ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.data_dir = data_dir

    def start(self, timeout: float = 30.0) -> RakaiaServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "RAKAIA_ENABLE_FAULT_INJECTION"}
        env["LONG_POLL_TIMEOUT"] = "0.5"
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.rakaia_server",
                str(self.port),
                str(self.data_dir),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                requests.head(self.stream_url("__ready__"), timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rakaia did not start within {timeout} s")


def main() -> None:
    import uvicorn
    from rakaia import JsonlStreamStore, ServerOptions, create_app

    port, data_dir = int(sys.argv[1]), sys.argv[2]
    app = create_app(store=JsonlStreamStore(data_dir), options=ServerOptions())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
