"""The parent process of ``--workers N``: starts the N workers, restarts one that dies, stops them all.

Each worker is this same program (``python -m durastream_server``) with the parent's arguments plus
``--data-dir <root>/shards/<k> --shard-index k --port <port>``: today's server on its shard, listening on
the port with ``SO_REUSEPORT`` and on a Unix socket for requests the other workers forward to it
(``router.py``). The parent serves no request: it holds the port bound (not listening, so port 0 gets a
real port every worker then shares), watches the workers, and on SIGTERM/SIGINT passes the signal on and
waits for them.

A worker that does not announce itself at start-up (its shard is locked by another server, its data
cannot be opened, ...) stops the start: the others are stopped and the parent exits with that worker's
code. A worker that dies later is restarted (at most once a second per shard): the other workers wait
for its socket while it recovers (``router.OWNER_WAIT_SECONDS``).
"""

from __future__ import annotations

import logging
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Final

from durastream_server.shards.internal import InternalCredential
from durastream_server.shards.layout import shard_dir
from durastream_server.shards.subscriptions import prepare_keys

logger = logging.getLogger(__name__)

STARTUP_SECONDS: Final = 120.0  # a worker recovering a large shard announces once it listens (lazy)
RESTART_INTERVAL_SECONDS: Final = 1.0
EXIT_FAILURE: Final = 1


class WorkerStartFailed(RuntimeError):
    def __init__(self, index: int, code: int | None) -> None:
        what = "did not announce itself in time" if code is None else f"exited with {code}"
        super().__init__(
            f"worker {index} (shard {index}) {what} during start-up; see its errors above"
        )
        self.index = index
        self.code = code


class Worker:
    """One worker process of shard ``index``, and its restarts."""

    def __init__(self, index: int, command: list[str]) -> None:
        self.index = index
        self.command = command
        self.process: subprocess.Popen[str] | None = None
        self.started_at = 0.0
        self.restarts = 0

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl, no locks taken
        )

    def announced(self, deadline: float) -> str | None:
        """The worker's start-up line, or None if it exited or stayed silent until ``deadline``."""
        assert self.process is not None and self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if selector.select(0.1):
                    line = self.process.stdout.readline()
                    return line or None
                if self.process.poll() is not None:
                    return None
        return None

    def pass_output_on(self) -> None:
        """Copy the worker's later stdout to ours (it must never block on a full pipe)."""
        assert self.process is not None and self.process.stdout is not None
        threading.Thread(target=_copy_lines, args=(self.process.stdout,), daemon=True).start()


class Supervisor:
    """Starts, watches and stops the workers (see the module docstring)."""

    def __init__(self, root: Path, count: int, base_command: Sequence[str], port: int) -> None:
        self.root = root
        self.count = count
        self.socket_dir = Path(tempfile.mkdtemp(prefix="durastream-"))
        self.workers = [
            Worker(
                index,
                [
                    *base_command,
                    "--data-dir",
                    str(shard_dir(root, index)),
                    "--port",
                    str(port),
                    "--shard-index",
                    str(index),
                    "--shard-sockets",
                    str(self.socket_dir),
                ],
            )
            for index in range(count)
        ]
        self._stopping = threading.Event()

    def run(self, on_started: Callable[[], None]) -> int:
        """Serve until SIGTERM/SIGINT; the exit code."""
        previous = {
            sig: signal.signal(sig, lambda *_: self._stopping.set())
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            try:
                self._start_all()
            except WorkerStartFailed as exc:
                logger.error("%s", exc)
                self._stop_all()
                return exc.code or EXIT_FAILURE
            on_started()
            while not self._stopping.wait(0.1):
                self._restart_dead()
            self._stop_all()
            return 0
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def _start_all(self) -> None:
        prepare_keys(
            self.root
        )  # the one webhook keyring every worker signs with (subscriptions.py)
        # The workers' own credential (internal.py): a file in the private socket directory, never
        # a command line or the environment, which other users can read in /proc.
        InternalCredential.create(self.socket_dir)
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + STARTUP_SECONDS
        for worker in self.workers:
            if worker.announced(deadline) is None:
                assert worker.process is not None
                raise WorkerStartFailed(worker.index, worker.process.poll())
            worker.pass_output_on()

    def _restart_dead(self) -> None:
        for worker in self.workers:
            process = worker.process
            if process is None or process.poll() is None:
                continue
            if time.monotonic() - worker.started_at < RESTART_INTERVAL_SECONDS:
                continue
            logger.warning(
                "worker %d (pid %d) exited with %s; restarting it",
                worker.index,
                process.pid,
                process.returncode,
            )
            worker.restarts += 1
            worker.start()
            worker.pass_output_on()

    def _stop_all(self) -> None:
        running = [w.process for w in self.workers if w.process is not None]
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _copy_lines(stream: IO[str]) -> None:
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved once in the parent: a ``preexec_fn`` runs between fork and exec, where
    the parent's other threads (the output copiers) may hold the loader's locks, so it must not load
    anything itself."""
    if sys.platform != "linux":
        return None
    import ctypes

    try:
        return ctypes.CDLL(None).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_PRCTL: Final = _prctl()
_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """Linux: the worker gets SIGTERM when the parent dies (even by SIGKILL), so no worker outlives it
    holding its shard's lock and the port."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_base_command(argv: Sequence[str]) -> list[str]:
    """The parent's own command line, run as a worker (the shard flags are appended after it, so they
    win over any given before)."""
    return [sys.executable, "-m", "durastream_server", *argv]
