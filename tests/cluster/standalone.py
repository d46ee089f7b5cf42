"""A Spark standalone cluster (one master, N workers) from the pyspark distribution, for tests.

pyspark ships ``bin/spark-class`` and the jars, but not ``sbin/start-master.sh``; so the master and the
workers are started directly as ``spark-class org.apache.spark.deploy.master.Master`` and
``...worker.Worker``, in the foreground, each in its own session, with ``SPARK_HOME`` set to the pyspark
package. Every process binds 127.0.0.1 on ports the OS picked a moment before (``free_port``), keeps its
logs and work directory under the given root, and is torn down in ``stop()``: SIGTERM to each process
group, then SIGKILL to every descendant that is still there (executor JVMs, Python daemons and workers),
found by walking ``/proc`` from the pids this class started, and never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyspark

from tests.support.server_process import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def descendants(pids: list[int]) -> dict[int, str]:
    """Every live process below ``pids`` (and ``pids`` themselves), with its start time.

    The start time identifies a process: a pid seen earlier is only signalled if it still has the same
    start time, so a pid the kernel reused for someone else's process is never touched.
    """
    tree = _children()
    found: dict[int, str] = {}
    todo = list(pids)
    while todo:
        pid = todo.pop()
        fields = _stat(pid)
        if pid in found or fields is None:
            continue
        found[pid] = fields[19]  # field 22 of stat: start time in clock ticks since boot
        todo += tree.get(pid, [])
    return found


def _same_live_process(pid: int, started: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == started


class StandaloneCluster:
    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.seen: dict[int, str] = {}  # every process of the cluster seen so far -> its start time

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(SPARK_HOME),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_WORKER_DIR=str(self.root / "work"),
            SPARK_PID_DIR=str(self.root / "pids"),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            # Keep the daemons small: two of them plus two executors share a small test machine.
            SPARK_DAEMON_MEMORY="256m",
        )
        return env

    def _launch(self, name: str, *args: str) -> None:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs.append(log)
        command = [str(SPARK_HOME / "bin" / "spark-class"), *args]
        with open(log, "wb") as out:
            self.processes.append(
                subprocess.Popen(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env(),
                    cwd=self.root,
                    start_new_session=True,
                )
            )

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        (self.root / "work").mkdir(parents=True, exist_ok=True)
        self._launch(
            "master",
            MASTER_CLASS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for index in range(self.workers):
            work = self.root / "work" / f"worker-{index}"
            work.mkdir(parents=True, exist_ok=True)
            self._launch(
                f"worker-{index}",
                WORKER_CLASS,
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.master_url,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{log.stem} exited with {process.returncode}:\n{self.log_tail(log)}"
                    )
            if self.alive_workers() >= self.workers:
                self.seen.update(descendants([p.pid for p in self.processes]))
                return self
            time.sleep(0.5)
        raise RuntimeError(
            f"{self.workers} workers did not register within {timeout:g}s:\n"
            + "\n".join(self.log_tail(log) for log in self.logs)
        )

    def state(self) -> dict:
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        try:
            workers = self.state().get("workers", [])
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            return 0
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def executor_logs(self) -> str:
        """stderr of every executor the workers ran (their Python tracebacks end up there)."""
        texts = []
        for path in sorted((self.root / "work").glob("worker-*/app-*/*/stderr")):
            texts.append(f"--- {path.relative_to(self.root)}\n{self.log_tail(path, 80)}")
        return "\n".join(texts)

    @staticmethod
    def log_tail(path: Path, lines: int = 30) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {path})"

    def stop(self) -> list[int]:
        """Stop everything this cluster started. Returns the pids that had to be SIGKILLed."""
        started = [p.pid for p in self.processes]
        self.seen.update(descendants(started))
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        killed = []
        for pid, started_at in {**self.seen, **descendants(started)}.items():
            if _same_live_process(pid, started_at):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        return killed

    def leftovers(self, wait: float = 5.0) -> list[int]:
        """Processes of this cluster (seen at start or at stop) still alive after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            left = [pid for pid, started in self.seen.items() if _same_live_process(pid, started)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)
