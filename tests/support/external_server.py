"""What the test fixtures of servers written elsewhere share: a subprocess on a free loopback port whose
streams live under ``/v1/stream``. Subclasses start it (``reference_server.py``, ``rakaia_server.py``)."""

from __future__ import annotations

import subprocess

from tests.support.server_process import free_port


class ExternalServer:
    def __init__(self) -> None:
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

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
