"""Run the real ``durastream-server`` as a child process, for tests that need the whole stack.

Every test that talks HTTP goes through this: it starts ``python -m durastream_server`` on a free port,
waits for ``/healthz`` with a deadline (never a fixed sleep), and can SIGKILL and restart the server on
the same data directory and port, which is what crash-recovery tests need.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from threading import Event

from tests.support.http import poll_until

STARTUP_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 30.0
# Flags for a server that forgets idle producers after a second (docs/server.md, "Producer state").
FORGET_PRODUCERS_FAST = (
    "--producer-quiet-seconds",
    "1",
    "--producer-expiry-seconds",
    "1",
    "--producer-group-expiry-seconds",
    "3600",
)


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The next line of ``process``'s stdout (a text pipe), failing after ``timeout`` seconds of silence."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no output from the server within {timeout} s")
    return process.stdout.readline()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """One server process (and its restarts) on one data directory and port."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        long_poll_timeout: float = 0.5,
        max_body_bytes: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.long_poll_timeout = long_poll_timeout
        self.max_body_bytes = max_body_bytes
        self.extra_args = tuple(extra_args)
        self.log_path = log_path or self.data_dir.parent / f"{self.data_dir.name}-server.log"
        self._process: subprocess.Popen[bytes] | None = None

    # -- addresses ------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stream_url(self, path: str) -> str:
        """URL of a stream; ``path`` is root-relative and used as given (callers quote what they need)."""
        return f"{self.base_url}/v1/stream/{path.lstrip('/')}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the server is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle ------------------------------------------------------------------------------------

    def command(self, *, port: int | None = None) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "durastream_server",
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
            "--port",
            str(self.port if port is None else port),
            "--long-poll-timeout",
            str(self.long_poll_timeout),
        ]
        if self.max_body_bytes is not None:
            args += ["--max-body-bytes", str(self.max_body_bytes)]
        return args + list(self.extra_args)

    def start(self, *, recovered: bool = True) -> ServerProcess:
        """Start and wait for ``/healthz``; with ``recovered``, also until it reports every stream
        recovered (streams recover after the server listens: engine/recovery.py), so that a test
        of something else sees the same server whatever the recovery's pace."""
        if self.running:
            raise RuntimeError("the server is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {' '.join(self.command())}\n".encode())
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._wait_healthy(recovered)
        return self

    def _wait_healthy(self, recovered: bool) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self._process.returncode} during startup:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=1) as response:
                    if response.status == 200 and not (
                        recovered and json.loads(response.read()).get("recovering")
                    ):
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.02)
        raise RuntimeError(
            f"server not healthy within {STARTUP_TIMEOUT_SECONDS}s:\n{self.log_tail()}"
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self._process is None:
            return
        self._process.kill()
        self._process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self._process = None

    def terminate(self) -> int:
        """SIGTERM and wait: a graceful shutdown. Returns the exit code."""
        if self._process is None:
            raise RuntimeError("the server is not running")
        self._process.send_signal(signal.SIGTERM)
        code = self._process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self._process = None
        return code

    def restart(self, *, recovered: bool = True) -> ServerProcess:
        """Start again on the same data directory and port (after ``kill`` or ``terminate``)."""
        if self.running:
            self.kill()
        self._process = None
        return self.start(recovered=recovered)

    def stop(self) -> None:
        """Best-effort teardown: SIGTERM, then SIGKILL if it does not go."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self._process = None

    # -- inspection -----------------------------------------------------------------------------------

    def health(self) -> dict:
        with urllib.request.urlopen(self.base_url + "/healthz", timeout=5) as response:
            return json.loads(response.read())

    def waiters(self) -> int:
        """Readers currently parked in a long-poll or SSE wait (reported by ``/healthz``)."""
        return int(self.health()["waiters"])

    def start_second_on_same_data_dir(
        self, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run another server on this data directory (other port) to completion; it must refuse."""
        return subprocess.run(
            self.command(port=free_port(self.host)),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ),
        )

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kill_under_load(
    server: ServerProcess,
    clients: Sequence[Future[None]],
    stop: Event,
    acknowledged: Callable[[], int],
    enough: int,
    what: str,
) -> None:
    """SIGKILL ``server`` while ``clients`` are still busy, once ``enough`` of their requests were
    acknowledged (``acknowledged()`` counts them); then stop the clients and raise what any of them raised."""
    poll_until(
        lambda: acknowledged() >= enough or all(c.done() for c in clients),
        f"acknowledged {what}",
        timeout=120,
    )
    assert not any(c.done() for c in clients), "a client stopped before the kill"
    server.kill()
    stop.set()
    for client in clients:
        client.result()
