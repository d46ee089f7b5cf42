"""The demo's server: the bundled ``durastream-server`` as a child process, or an external one.

The bundled server is the separate distribution ``durastream-server`` (``server/`` in the repository):
``make demo`` installs it; ``pip install durastream-server`` (or ``pip install ./server`` from a checkout)
does it by hand. It listens on 127.0.0.1 on a port the OS picks (``--port 0``), so nothing can race us for
the port, and announces its URL on stdout, which goes to a log file next to its data.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)

STREAM_ROOT = "/v1/stream"
_ANNOUNCE = re.compile(r"listening on (https?://[^\s)]+)")


class DemoError(Exception):
    """The demo cannot run (missing server, unreachable URL, a failed query); the message says why."""


class BundledServer:
    """``python -m durastream_server`` on a free loopback port, data in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / "server.log"
        self.base_url: str | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def stream_root(self) -> str:
        assert self.base_url is not None
        return self.base_url + STREAM_ROOT

    def start(self, timeout: float = 60.0) -> str:
        """Start the server and wait until ``/healthz`` answers. Returns the stream root URL."""
        if importlib.util.find_spec("durastream_server") is None:
            raise DemoError(
                "the bundled server is not installed in this Python environment. Install it with "
                "'pip install durastream-server' (from a checkout of the repository: "
                "'pip install ./server', or run 'make demo'), or point the demo at a running server "
                "with --url http://HOST:4437/v1/stream"
            )
        command = [
            sys.executable,
            "-m",
            "durastream_server",
            "--data-dir",
            str(self.workdir / "server-data"),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--long-poll-timeout",
            "1",
            "--log-level",
            "WARNING",
        ]
        log.info("starting the bundled server: %s", " ".join(command))
        with open(self.log_path, "wb") as out:
            self._process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise DemoError(
                    f"the bundled server exited with code {self._process.returncode} during "
                    f"startup:\n{self.log_tail()}"
                )
            if self.base_url is None:
                match = _ANNOUNCE.search(self.log_path.read_text(errors="replace"))
                if match:
                    self.base_url = match.group(1).rstrip("/")
            if self.base_url is not None and healthy(self.base_url):
                return self.stream_root
            time.sleep(0.05)
        self.stop()
        raise DemoError(f"the bundled server did not start within {timeout:g}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it does not exit within 15 s."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            log.warning("the bundled server did not stop within 15 s; killing it")
            process.kill()
            process.wait(timeout=15)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


def healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/healthz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
