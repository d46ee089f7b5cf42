"""Chaos soak of the whole pipeline: nothing lost, nothing duplicated, while faults arrive at random.

    .venv/bin/python bench/soak.py --minutes 2 --seed 7 [--variant plain|shuffle] [--workdir DIR]

The pipeline (all on this machine):

    producers --(idempotent producer: epoch/seq, retried)--> stream A
    job 1 (Spark driver process): A -> durastream source -> [repartition by key] -> durastream sink -> B
    job 2 (Spark driver process): B -> durastream source -> parquet file sink (checkpointed) -> table

Everything talks to the server through a local TCP proxy (``tests/support/proxy.py``); the server runs
through ``tests/support/faulty_server.py`` (slow fsync / injected ENOSPC, driven by a control file) on a
data directory that is a small tmpfs when this process may mount one (root), so that "disk full" is a
real full disk; otherwise ENOSPC is injected.

Faults, at random times from ``random.Random(seed)``, each logged (``<workdir>/faults.log``) with its
time and parameters so a failure can be replayed from its seed. A short run gets each type at least once:

- ``server_kill``: SIGKILL the server, restart it on the same data dir and port after a random downtime;
- ``driver_kill``: SIGKILL a Spark driver's whole process group (JVM, Python workers), restart it from its
  checkpoint (``driver_kill_ab`` / ``driver_kill_table`` in the counts);
- ``task_failure``: for a window, job 1's tagging functions fail attempt 0 of a seeded subset of tasks
  (counted by the marker files the failing tasks leave);
- ``net_stall``: the proxy holds all bytes, both directions, for a few seconds;
- ``net_cut``: the proxy resets every open connection and refuses new ones for a moment;
- ``disk_full``: fill the tmpfs with a ballast file until ENOSPC, hold, delete it (or inject ENOSPC);
- ``slow_fsync``: every fsync of the server sleeps first, for a window.

The fault phase (``--minutes``) starts once both jobs have delivered their first data. After it,
everything is healed, the producers stop (every message they wrote was
acknowledged), and the soak waits (polling, with deadlines) until B and the table hold every message.
Then ``soak_verify.verify`` compares A, B and the table message by message (count, content digest,
order) and one line is printed: messages in, out, lost, duplicated, faults by type. Exit status 0 only
for zero lost and zero duplicated (and no other problem). ``<workdir>/summary.json`` has the details.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH))

from soak_verify import StreamTail, TableTail, digest, verify  # noqa: E402

from durastream_spark.options import ConnectionOptions  # noqa: E402
from durastream_spark.protocol.client import StreamClient  # noqa: E402
from tests.support.faulty_server import FaultyServerProcess, write_control  # noqa: E402
from tests.support.proxy import ChaosProxy  # noqa: E402
from tests.support.server_process import free_port  # noqa: E402

STREAM_A = "soak/a"
STREAM_B = "soak/b"
FAULT_TYPES = (
    "server_kill",
    "driver_kill_ab",
    "driver_kill_table",
    "task_failure",
    "net_stall",
    "net_cut",
    "disk_full",
    "slow_fsync",
)
PRODUCERS = 2
MESSAGES_PER_REQUEST = 10
TMPFS_MB = 256
SERVER_START_DEADLINE = 90.0
MAKEUP_TASK_FAILURE_SECONDS = 120.0
WARM_DEADLINE = 300.0  # for the first data in B and in the table, before faults start


class Log:
    """Timestamped lines to stdout and ``<workdir>/faults.log`` (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.t0 = time.monotonic()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, kind: str, text: str = "", **fields: object) -> None:
        wall = time.strftime("%H:%M:%S", time.gmtime())
        extra = " ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items()
        )
        line = f"[t=+{self.now():7.2f}s {wall}Z] {kind:<18} {text} {extra}".rstrip()
        with self._lock:
            print(line, flush=True)
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------------- disk


class Disk:
    """The server's data dir: a tmpfs we can fill (``mode='tmpfs'``), or a plain dir (``'injected'``)."""

    def __init__(self, path: Path, size_mb: int, *, allow_mount: bool, log: Log) -> None:
        self.path = path
        self.log = log
        self.mode = "injected"
        path.mkdir(parents=True, exist_ok=True)
        if allow_mount:
            result = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                capture_output=True,
                text=True,
            )
            if result.returncode == 0:
                self.mode = "tmpfs"
            else:
                log("disk", f"cannot mount a tmpfs ({result.stderr.strip()}); injecting ENOSPC")
        self.ballast = path / "ballast"

    def fill(self) -> int:
        """Write the ballast until the filesystem is full; returns its size."""
        written = 0
        chunk = b"\0" * (1 << 20)
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 20, 1 << 12, 1):
                while True:
                    try:
                        written += os.write(fd, chunk[:size])
                    except OSError:
                        break
        finally:
            os.close(fd)
        return written

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    def unmount(self) -> None:
        self.release()
        if self.mode == "tmpfs":
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


# ------------------------------------------------------------------------------------------ producer


def make_message(seed: int, producer: str, n: int) -> bytes:
    h = hashlib.sha256(f"{seed}|{producer}|{n}".encode()).hexdigest()
    key = f"k{int(h[:4], 16) % 16}"
    pad = (h * 4)[: 16 + int(h[4:8], 16) % 144]
    message = {"p": producer, "n": n, "k": key, "pad": pad, "d": digest(producer, n, key, pad)}
    return json.dumps(message, separators=(",", ":"), sort_keys=True).encode()


class Producer(threading.Thread):
    """An idempotent producer: requests of MESSAGES_PER_REQUEST messages under (id, epoch 0, seq),
    one in flight; a failed request is re-sent with the same tuple and bytes until it is acknowledged
    (200, or 204 = already written). ``acked`` messages are exactly those the server acknowledged."""

    def __init__(self, name: str, url: str, seed: int, rate: float, log: Log) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.producer_id = name
        self.seed = seed
        self.interval = MESSAGES_PER_REQUEST / rate
        self.log = log
        self.client = StreamClient(
            ConnectionOptions.parse(
                {"url": url, "requestTimeoutMs": "10000", "retry.maxElapsedMs": "15000"}
            )
        )
        self.stop_event = threading.Event()
        self.give_up_at = float("inf")  # monotonic
        self.acked = 0
        self.requests = 0
        self.duplicates = 0
        self.errors: Counter[str] = Counter()
        self.failed: str | None = None

    def run(self) -> None:
        seq = 0
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            n0 = self.acked
            body = (
                b"["
                + b",".join(
                    make_message(self.seed, self.producer_id, n)
                    for n in range(n0, n0 + MESSAGES_PER_REQUEST)
                )
                + b"]"
            )
            if not self._send(body, seq):
                return
            seq += 1
            self.acked += MESSAGES_PER_REQUEST
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
            else:
                next_at = time.monotonic()

    def _send(self, body: bytes, seq: int) -> bool:
        attempt = 0
        while True:
            attempt += 1
            try:
                result = self.client.append(
                    STREAM_A, body, "application/json", producer=(self.producer_id, 0, seq)
                )
                self.requests += 1
                if result.duplicate:
                    self.duplicates += 1
                return True
            except Exception as error:  # retried with the same tuple and bytes, whatever it was
                status = getattr(error, "status", None)
                kind = f"{type(error).__name__}{'/' + str(status) if status else ''}"
                self.errors[kind] += 1
                if self.errors[kind] <= 3:
                    self.log("producer_error", self.producer_id, seq=seq, error=kind)
                if status in (400, 403, 409):  # a protocol problem, not a fault: report it
                    self.failed = f"seq {seq}: {error}"
                    self.log("producer_fatal", self.producer_id, seq=seq, error=str(error)[:200])
                    return False
                if time.monotonic() > self.give_up_at:
                    self.failed = f"gave up on seq {seq} after {attempt} attempts: {error}"
                    return False
                time.sleep(min(2.0, 0.1 * attempt))


# -------------------------------------------------------------------------------------------- driver


class Driver:
    """One Spark driver process (``soak_driver.py``), in its own process group so a SIGKILL takes the
    JVM and its Python workers with it; restarted from the same checkpoint with a new run number."""

    def __init__(self, job: str, config: dict, workdir: Path, log: Log) -> None:
        self.job = job
        self.config = config
        self.log = log
        self.log_path = workdir / f"driver-{job}.log"
        self.run = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.lock = threading.RLock()
        self.exits = 0  # exits we did not cause (query failures), restarted by the supervisor

    def start(self) -> None:
        with self.lock:
            self.run += 1
            config = dict(self.config, run=self.run)
            env = dict(os.environ)
            env.setdefault("PYSPARK_PYTHON", sys.executable)
            env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
            with open(self.log_path, "ab") as out:
                out.write(f"\n=== run {self.run}\n".encode())
                self.process = subprocess.Popen(
                    [sys.executable, str(BENCH / "soak_driver.py"), json.dumps(config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=env,
                    cwd=str(REPO),
                )

    def kill(self) -> None:
        with self.lock:
            process = self.process
            if process is None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            self.process = None

    def check(self) -> int | None:
        """The exit code if the driver died on its own (it is then restarted), else None."""
        with self.lock:
            if self.process is None or self.process.poll() is None:
                return None
            code = self.process.returncode
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # leftovers of its group
            self.process = None
            self.exits += 1
            self.start()
            return code


# --------------------------------------------------------------------------------------------- soak


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed = args.seed
        self.rng = random.Random(args.seed)
        self.duration = args.minutes * 60.0
        self.workdir = Path(args.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = Log(self.workdir / "faults.log")
        self.control_dir = self.workdir / "control"
        (self.control_dir / "taskfail-markers").mkdir(parents=True, exist_ok=True)
        self.server_control = self.control_dir / "server.json"
        self.server_faults = {"fsync_delay": 0.0, "enospc": False}
        self.faults: Counter[str] = Counter()
        self.fault_lock = threading.Lock()
        self.server_lock = threading.Lock()
        self.disk_lock = threading.Lock()
        self.stop_supervisor = threading.Event()
        self.fault_threads: list[threading.Thread] = []

    # -- setup ---------------------------------------------------------------------------------------

    def setup(self) -> None:
        a = self.args
        self.log(
            "soak",
            "start",
            seed=self.seed,
            minutes=a.minutes,
            variant=a.variant,
            rate=a.rate,
            workdir=str(self.workdir),
        )
        size_mb = TMPFS_MB + int(16 * a.minutes)  # A and B grow ~10 MiB per soak minute
        self.disk = Disk(self.workdir / "data", size_mb, allow_mount=not a.no_tmpfs, log=self.log)
        self.log("disk", f"mode={self.disk.mode}")
        write_control(self.server_control, **self.server_faults)
        self.server = FaultyServerProcess(
            self.disk.path,
            self.server_control,
            port=free_port(),
            long_poll_timeout=2.0,
            log_path=self.workdir / "server.log",
        )
        self.server.start()
        self.proxy = ChaosProxy(self.server.port).start()
        self.log("server", f"port={self.server.port} proxy={self.proxy.port}")
        direct = StreamClient(ConnectionOptions.parse({"url": self.server.base_url + "/v1/stream"}))
        direct.create(STREAM_A, "application/json")
        direct.create(STREAM_B, "application/json")
        url = self.proxy.url + "/v1/stream"
        common = {
            "url": url,
            "stream_a": STREAM_A,
            "stream_b": STREAM_B,
            "variant": a.variant,
            "seed": self.seed,
            "control_dir": str(self.control_dir),
            "reducers": 3,
            "trigger": "2 seconds",
        }
        self.drivers = {
            "ab": Driver(
                "ab",
                dict(
                    common,
                    job="ab",
                    checkpoint=str(self.workdir / "checkpoint-ab"),
                    max_per_trigger=4000,
                    max_per_partition=1000,
                ),
                self.workdir,
                self.log,
            ),
            "table": Driver(
                "table",
                dict(
                    common,
                    job="table",
                    checkpoint=str(self.workdir / "checkpoint-table"),
                    table=str(self.workdir / "table"),
                    max_per_trigger=20000,
                    trigger="3 seconds",
                ),
                self.workdir,
                self.log,
            ),
        }
        for driver in self.drivers.values():
            driver.start()
        self.producers = [
            Producer(f"prod-{i}", url, self.seed, a.rate / PRODUCERS, self.log)
            for i in range(PRODUCERS)
        ]
        for producer in self.producers:
            producer.start()
        self.supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self.supervisor.start()

    def _supervise(self) -> None:
        while not self.stop_supervisor.wait(0.5):
            for driver in self.drivers.values():
                code = driver.check()
                if code is not None:
                    self.log("driver_exit", driver.job, code=code, restarted_as_run=driver.run)

    # -- faults --------------------------------------------------------------------------------------

    def wait_warm(self) -> None:
        """Wait (bounded) until both jobs have delivered data, so that the faults hit a running
        pipeline rather than JVMs starting up."""
        b, table = StreamTail(self.server.base_url, STREAM_B), TableTail(self.workdir / "table")
        deadline = time.monotonic() + WARM_DEADLINE
        while time.monotonic() < deadline:
            b.poll()
            if b.messages:
                table.poll()
                if table.rows:
                    break
            time.sleep(1.0)
        self.log("warm", b_messages=len(b.messages), table_rows=len(table.rows))

    def schedule(self) -> list[tuple[float, str]]:
        """Fault times, relative to the start of the fault phase."""
        start = min(10.0, 0.1 * self.duration)
        end = max(start + 1.0, self.duration - 8.0)
        kinds = list(FAULT_TYPES)
        extra = max(0, int((end - start) / 12.0) - len(kinds))
        kinds += [self.rng.choice(FAULT_TYPES) for _ in range(extra)]
        self.rng.shuffle(kinds)
        times = sorted(self.rng.uniform(start, end) for _ in kinds)
        plan = list(zip(times, kinds, strict=True))
        for at, kind in plan:
            self.log("plan", kind, at=at)
        return plan

    def inject(self, kind: str) -> None:
        """Run one fault in its own thread (faults may overlap)."""
        params = {
            "server_kill": lambda: {"downtime": self.rng.uniform(0.2, 3.0)},
            "driver_kill_ab": lambda: {"restart_after": self.rng.uniform(0.0, 2.0)},
            "driver_kill_table": lambda: {"restart_after": self.rng.uniform(0.0, 2.0)},
            "task_failure": lambda: {"window": self.rng.uniform(5.0, 10.0), "rate": 0.6},
            "net_stall": lambda: {"stall": self.rng.uniform(1.0, 6.0)},
            "net_cut": lambda: {"refuse_for": self.rng.uniform(0.0, 2.0)},
            "disk_full": lambda: {"hold": self.rng.uniform(2.0, 6.0)},
            "slow_fsync": lambda: {
                "delay": self.rng.uniform(0.05, 0.4),
                "window": self.rng.uniform(4.0, 10.0),
            },
        }[kind]()
        thread = threading.Thread(target=self._run_fault, args=(kind, params), daemon=True)
        self.fault_threads.append(thread)
        thread.start()

    def _count(self, kind: str) -> None:
        with self.fault_lock:
            self.faults[kind] += 1

    def _run_fault(self, kind: str, p: dict) -> None:
        self.log("fault", kind, **p)
        try:
            if kind == "server_kill":
                with self.server_lock:
                    self.server.kill()
                    self._count(kind)
                    time.sleep(p["downtime"])
                    self._start_server()
                self.log("fault_end", kind)
            elif kind.startswith("driver_kill"):
                driver = self.drivers[kind.rsplit("_", 1)[1]]
                with driver.lock:
                    driver.kill()
                    self._count(kind)
                    time.sleep(p["restart_after"])
                    driver.start()
                self.log("fault_end", kind, restarted_as_run=driver.run)
            elif kind == "task_failure":
                control = {"until": time.time() + p["window"], "rate": p["rate"]}
                (self.control_dir / "taskfail.json").write_text(json.dumps(control))
                time.sleep(p["window"])
                self.log("fault_end", kind, failed_tasks_so_far=self.task_failures())
            elif kind == "net_stall":
                self.proxy.stall(p["stall"])
                self._count(kind)
                time.sleep(p["stall"])
                self.log("fault_end", kind)
            elif kind == "net_cut":
                cut = self.proxy.cut(p["refuse_for"])
                self._count(kind)
                self.log("fault_cut", kind, connections=cut)
            elif kind == "disk_full":
                with self.disk_lock:
                    if self.disk.mode == "tmpfs":
                        try:
                            filled = self.disk.fill()
                            self._count(kind)
                            self.log("fault_fill", kind, ballast_mb=filled / 2**20)
                            time.sleep(p["hold"])
                        finally:
                            self.disk.release()
                    else:
                        self._server_fault(enospc=True)
                        self._count(kind)
                        time.sleep(p["hold"])
                        self._server_fault(enospc=False)
                self.log("fault_end", kind)
            elif kind == "slow_fsync":
                self._server_fault(fsync_delay=p["delay"])
                self._count(kind)
                time.sleep(p["window"])
                self._server_fault(fsync_delay=0.0)
                self.log("fault_end", kind)
        except Exception as error:  # a fault that could not be applied must not end the soak
            self.log("fault_error", kind, error=repr(error)[:300])

    def _server_fault(self, **changes: object) -> None:
        with self.fault_lock:
            self.server_faults.update(changes)
            write_control(self.server_control, **self.server_faults)

    def _start_server(self) -> None:
        deadline = time.monotonic() + SERVER_START_DEADLINE
        while True:
            try:
                self.server.start()
                return
            except RuntimeError as error:
                self.log("server_start_failed", error=str(error).splitlines()[0][:200])
                self.server.kill()
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def task_failures(self) -> int:
        return len(os.listdir(self.control_dir / "taskfail-markers"))

    def heal_everything(self) -> None:
        for thread in self.fault_threads:
            thread.join(timeout=120)
        with contextlib.suppress(FileNotFoundError):
            (self.control_dir / "taskfail.json").unlink()
        self.proxy.heal()
        self.disk.release()
        self._server_fault(fsync_delay=0.0, enospc=False)
        with self.server_lock:
            if not self.server.running:
                self._start_server()

    # -- run -----------------------------------------------------------------------------------------

    def run(self) -> int:
        self.setup()
        plan = self.schedule()
        self.wait_warm()
        began = self.log.now()
        self.log("fault_phase", f"{self.duration:.0f}s from now")
        for at, kind in plan:
            wait = began + at - self.log.now()
            if wait > 0:
                time.sleep(wait)
            self.inject(kind)
        remaining = began + self.duration - self.log.now()
        if remaining > 0:
            time.sleep(remaining)
        self.heal_everything()
        # A task-failure window can fall where job 1 ran no task (e.g. it was restarting): then open
        # one more, until a task failed (bounded), while the producers still feed job 1.
        if not self.task_failures():
            self.log("makeup", "task_failure (no task failed yet)")
            until = time.time() + MAKEUP_TASK_FAILURE_SECONDS
            control = {"until": until, "rate": 1.0}
            (self.control_dir / "taskfail.json").write_text(json.dumps(control))
            while not self.task_failures() and time.time() < until:
                time.sleep(0.5)
            self.log("fault_end", "task_failure", failed_tasks_so_far=self.task_failures())
        self.heal_everything()
        self.faults["task_failure"] = self.task_failures()
        self.log("faults_done", **dict(sorted(self.faults.items())))
        return self.drain_and_verify()

    def drain_and_verify(self) -> int:
        for producer in self.producers:
            producer.give_up_at = time.monotonic() + 120
            producer.stop_event.set()
        for producer in self.producers:
            producer.join(timeout=180)
        acked = {p.producer_id: p.acked for p in self.producers}
        expected = {(p, n) for p, count in acked.items() for n in range(count)}
        self.log("producers_stopped", **acked)
        tails = (
            StreamTail(self.server.base_url, STREAM_A),
            StreamTail(self.server.base_url, STREAM_B),
            TableTail(self.workdir / "table"),
        )
        deadline = time.monotonic() + self.args.drain_timeout
        b_seen: set[tuple[str, int]] = set()
        t_seen: set[tuple[str, int]] = set()
        b_read = t_read = 0
        drained = False
        while time.monotonic() < deadline:
            try:
                tails[1].poll()
                tails[2].poll()
            except Exception as error:  # e.g. a parquet file being written: look again
                self.log("drain_poll_error", error=repr(error)[:200])
            b_seen.update(_key(v) for _, v in tails[1].messages[b_read:])
            b_read = len(tails[1].messages)
            t_seen.update(_key(v) for _, v in tails[2].rows[t_read:])
            t_read = len(tails[2].rows)
            if expected <= b_seen and expected <= t_seen:
                drained = True
                break
            time.sleep(1.0)
        self.log(
            "drain",
            "complete" if drained else "DEADLINE PASSED",
            b_has=len(b_seen & expected),
            table_has=len(t_seen & expected),
            expected=len(expected),
        )
        # A last look after the drivers stopped: anything written after the drain shows up now.
        self.stop_supervisor.set()
        self.supervisor.join(timeout=5)
        for driver in self.drivers.values():
            driver.kill()
        report = verify(
            self.server.base_url,
            STREAM_A,
            STREAM_B,
            self.workdir / "table",
            self.workdir / "checkpoint-ab",
            acked,
            self.args.variant,
            tails=tails,
        )
        faults = {kind: self.faults.get(kind, 0) for kind in FAULT_TYPES}
        faults["driver_kill"] = faults["driver_kill_ab"] + faults["driver_kill_table"]
        line = (
            f"SOAK {'PASS' if report.passed else 'FAIL'} seed={self.seed} "
            f"variant={self.args.variant} minutes={self.args.minutes:g} disk={self.disk.mode} "
            f"in={report.messages_in} out={report.out} lost={report.lost} "
            f"duplicated={report.duplicated} faults: "
            + " ".join(f"{k}={v}" for k, v in faults.items())
        )
        summary = {
            "passed": report.passed,
            "seed": self.seed,
            "variant": self.args.variant,
            "minutes": self.args.minutes,
            "disk": self.disk.mode,
            "messages_in": report.messages_in,
            "messages_out": report.out,
            "lost": report.lost,
            "duplicated": report.duplicated,
            "faults": faults,
            "detail": report.detail,
            "problems": report.problems,
            "producers": {
                p.producer_id: {
                    "acked": p.acked,
                    "requests": p.requests,
                    "duplicate_acks": p.duplicates,
                    "errors": dict(p.errors),
                    "failed": p.failed,
                }
                for p in self.producers
            },
            "driver_exits": {job: d.exits for job, d in self.drivers.items()},
            "driver_runs": {job: d.run for job, d in self.drivers.items()},
            "proxy": vars(self.proxy.stats),
            "drained": drained,
            "wall_seconds": round(self.log.now(), 1),
        }
        for producer in self.producers:
            if producer.failed:
                report.problems.append(f"producer {producer.producer_id}: {producer.failed}")
                summary["passed"] = False
        (self.workdir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        for problem in report.problems:
            self.log("PROBLEM", problem)
        self.log("detail", json.dumps(report.detail, sort_keys=True))
        print(line, flush=True)
        return 0 if summary["passed"] else 1

    def cleanup(self) -> None:
        self.stop_supervisor.set()
        for driver in getattr(self, "drivers", {}).values():
            with contextlib.suppress(Exception):
                driver.kill()
        for producer in getattr(self, "producers", []):
            producer.give_up_at = 0
            producer.stop_event.set()
        if hasattr(self, "proxy"):
            self.proxy.stop()
        if hasattr(self, "server"):
            self.server.stop()
        if hasattr(self, "disk"):
            self.disk.unmount()
        self.log.close()


def _key(value: bytes) -> tuple[str, int]:
    try:
        message = json.loads(value)
        return (message["p"], message["n"])
    except (ValueError, KeyError, TypeError):
        return ("?", -1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="length of the fault phase")
    parser.add_argument("--seed", type=int, default=None, help="replays a run (default: random)")
    parser.add_argument("--variant", choices=("plain", "shuffle"), default="shuffle")
    parser.add_argument("--workdir", default=None, help="default: a new temporary directory")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="messages per second, all producers"
    )
    parser.add_argument("--drain-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--no-tmpfs", action="store_true", help="inject ENOSPC instead of a tmpfs")
    parser.add_argument("--keep", action="store_true", help="keep a temporary workdir")
    args = parser.parse_args(argv)
    # The producers' client logs every retry; the soak counts errors itself (summary.json).
    logging.getLogger("durastream_spark").setLevel(logging.ERROR)
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    temporary = args.workdir is None
    if temporary:
        args.workdir = tempfile.mkdtemp(prefix="durastream-soak-")
    soak = Soak(args)

    def terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that cleanup() runs: drivers, server, proxy, tmpfs

    signal.signal(signal.SIGTERM, terminated)
    try:
        return soak.run()
    finally:
        soak.cleanup()
        if temporary and not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
