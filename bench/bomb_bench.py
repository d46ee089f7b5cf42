"""Message-count bombs: what one JSON append of millions of tiny messages, and every read of them,
costs the server (issue 14, item 2).

Usage: ``.venv/bin/python bench/bomb_bench.py [--mib 8] [--server-args "..."] [--json FILE]``

Starts its own durastream-server (``--durability none``: only memory and loop time are measured) on a
temporary data directory and runs, one phase at a time, while a second client polls ``GET /healthz``
on its own connection in a thread:

- ``append``: one POST of ``[0,0,...,0]``, ``--mib`` MiB (8 MiB: 4,194,303 messages). With the
  server's default ``--max-messages-per-request`` it is refused with 413; ``append-accepted`` sends
  the same body to a second server started with the cap raised to fit it (``--raised-cap``).
- ``fill`` (not a figure): the same messages, written in appends the default cap allows.
- the reads of those messages from the start to the tail, each flavour in turn: ``read`` (plain
  catch-up), ``read-end`` (bounded, ``end=``), ``frames``, ``frames-lines``, ``long-poll``
  (``live=long-poll`` until up to date), ``sse`` (``live=sse`` until the first up-to-date control
  event) and ``lookup`` (``lookup=limit&max_messages=`` the whole stream).

Figures per phase: the server's peak RSS growth (``/proc/PID/status`` VmHWM after resetting it through
``/proc/PID/clear_refs``, minus the RSS at the phase's start; sampled every 5 ms where the reset is not
allowed), the worst ``/healthz`` latency seen by the poller (a request still waiting when a phase ends
counts for it), the phase's wall time and the requests it took. ``--server-pythonpath DIR`` runs the
server from another source tree (e.g. an export of an older commit's ``server/``), for before/after
comparisons with the same client.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server_process import ServerProcess  # noqa: E402

MiB = 1 << 20
STREAM = "/v1/stream/bomb/zeros"
FILL_MESSAGES = 50_000  # messages per append while filling: below any sensible cap
TIMEOUT = 600.0


def bomb_body(mib: int) -> bytes:
    """The largest ``[0,0,...,0]`` of at most ``mib`` MiB: two bytes per message."""
    count = (mib * MiB - 1) // 2
    return b"[" + b"0," * (count - 1) + b"0]"


# ----------------------------------------------------------------------------------- measurement


class Rss:
    """Peak resident memory of a process over a phase: the kernel's high-water mark where it can be
    reset (``clear_refs``), else samples every 5 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.resettable = self._reset()
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _status(self, field: str) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc/{self.pid}/status")

    def current(self) -> int:
        return self._status("VmRSS")

    def _reset(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as refs:
                refs.write("5")
            return True
        except OSError:
            return False

    def start(self) -> int:
        """Begin a phase; returns the RSS at its start."""
        base = self.current()
        self._peak = base
        if self.resettable:
            self._reset()
        else:
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return base

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._peak = max(self._peak, self.current())

    def peak(self) -> int:
        """End a phase; returns its peak RSS."""
        if self.resettable:
            return max(self._peak, self._status("VmHWM"))
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        return max(self._peak, self.current())


class HealthPoller:
    """GET /healthz in a loop on its own keep-alive connection; remembers every request's span."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.spans: list[tuple[float, float]] = []
        self.in_flight: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
        while not self._stop.is_set():
            started = time.monotonic()
            self.in_flight = started
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            ended = time.monotonic()
            self.in_flight = None
            if response.status != 200:
                raise RuntimeError(f"/healthz answered {response.status}")
            self.spans.append((started, ended))
            self._stop.wait(0.005)

    def worst(self, start: float, end: float) -> float:
        """The longest /healthz request that overlapped ``[start, end]``; waits for one still open."""
        while self.in_flight is not None and self.in_flight < end:
            time.sleep(0.001)
        return max((e - s for s, e in self.spans if s < end and e > start), default=0.0)


@dataclass
class Phase:
    name: str
    status: str  # what the server answered (e.g. "413", or "200 x 3")
    requests: int
    seconds: float
    rss_before_mib: float
    rss_peak_growth_mib: float
    worst_healthz_ms: float


def measure(
    name: str, rss: Rss, health: HealthPoller, work: Callable[[], tuple[str, int]]
) -> Phase:
    before = rss.start()
    started = time.monotonic()
    status, requests = work()
    ended = time.monotonic()
    peak = rss.peak()
    worst = health.worst(started, ended)
    return Phase(
        name=name,
        status=status,
        requests=requests,
        seconds=round(ended - started, 3),
        rss_before_mib=round(before / MiB, 1),
        rss_peak_growth_mib=round((peak - before) / MiB, 1),
        worst_healthz_ms=round(worst * 1000, 1),
    )


# ----------------------------------------------------------------------------------------- client


class Client:
    def __init__(self, host: str, port: int) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)

    def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        try:
            self.conn.request(method, path, body, headers or {})
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # The server closed the idle keep-alive connection (a long phase on another one).
            self.conn.close()
            self.conn.request(method, path, body, headers or {})
            response = self.conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def tail(self) -> str:
        _, headers, _ = self.call("HEAD", STREAM)
        return headers["stream-next-offset"]


def append(client: Client, body: bytes) -> tuple[str, int]:
    status, _, data = client.call("POST", STREAM, body, {"Content-Type": "application/json"})
    note = f" {data[:160].decode(errors='replace')}" if status >= 400 else ""
    return f"{status}{note}", 1


def fill(client: Client, messages: int) -> tuple[str, int]:
    piece = b"[" + b"0," * (FILL_MESSAGES - 1) + b"0]"
    sent = 0
    requests = 0
    while sent < messages:
        count = min(FILL_MESSAGES, messages - sent)
        body = piece if count == FILL_MESSAGES else b"[" + b"0," * (count - 1) + b"0]"
        status, _, data = client.call("POST", STREAM, body, {"Content-Type": "application/json"})
        if status not in (200, 204):
            raise RuntimeError(f"fill append answered {status}: {data[:200]!r}")
        sent += count
        requests += 1
    return "204", requests


def read_all(client: Client, query: str, tail: str) -> tuple[str, int]:
    """Catch-up (or long-poll) reads from the start until ``Stream-Next-Offset`` is the tail."""
    offset = "-1"
    requests = 0
    statuses: set[int] = set()
    while True:
        status, headers, body = client.call("GET", f"{STREAM}?offset={offset}{query}")
        requests += 1
        statuses.add(status)
        if status != 200:
            raise RuntimeError(f"read {query!r} answered {status}: {body[:200]!r}")
        offset = headers["stream-next-offset"]
        if offset == tail:
            return ",".join(map(str, sorted(statuses))), requests


def read_sse(host: str, port: int, tail: str) -> tuple[str, int]:
    """One SSE connection from the start, until the control event that says up to date at the tail."""
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    conn.request("GET", f"{STREAM}?offset=-1&live=sse")
    response = conn.getresponse()
    events = 0
    control = False
    try:
        for line in response:
            if line.startswith(b"event: control"):
                control = True
                events += 1
            elif control and line.startswith(b"data:"):
                control = False
                data = json.loads(line[5:])
                if data.get("upToDate") and data["streamNextOffset"] == tail:
                    return f"{response.status}", events
        raise RuntimeError("SSE ended before reaching the tail")
    finally:
        conn.close()


def lookup(client: Client, messages: int) -> tuple[str, int]:
    status, _, body = client.call("GET", f"{STREAM}?offset=-1&lookup=limit&max_messages={messages}")
    if status != 200 or json.loads(body)["messages"] != messages:
        raise RuntimeError(f"lookup answered {status}: {body[:200]!r}")
    return str(status), 1


# ------------------------------------------------------------------------------------------- runs


def serve(tmp: Path, name: str, args: argparse.Namespace, extra: list[str]) -> ServerProcess:
    return ServerProcess(
        tmp / name,
        max_body_bytes=max(64 * MiB, args.mib * MiB),
        long_poll_timeout=30,
        extra_args=(
            "--durability",
            "none",
            "--log-level",
            "WARNING",
            *shlex.split(args.server_args),
            *extra,
        ),
    )


def run(args: argparse.Namespace) -> list[Phase]:
    body = bomb_body(args.mib)
    messages = body.count(b",") + 1
    print(f"bomb: {len(body):,} bytes, {messages:,} messages", flush=True)
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with serve(tmp, "default", args, []) as server:
            host, port = server.host, server.port
            client = Client(host, port)
            client.call("PUT", STREAM, b"", {"Content-Type": "application/json"})
            rss = Rss(server.pid)
            with HealthPoller(host, port) as health:
                phases.append(measure("append", rss, health, lambda: append(client, body)))
                print(phases[-1], flush=True)
                if client.tail().endswith("_0000000000000000"):
                    phases.append(measure("fill", rss, health, lambda: fill(client, messages)))
                    print(phases[-1], flush=True)
                tail = client.tail()
                reads: list[tuple[str, Callable[[], tuple[str, int]]]] = [
                    ("read", lambda: read_all(client, "", tail)),
                    ("read-end", lambda: read_all(client, f"&end={tail}", tail)),
                    ("frames", lambda: read_all(client, "&format=frames", tail)),
                    ("frames-lines", lambda: read_all(client, "&format=frames-lines", tail)),
                    ("long-poll", lambda: read_all(client, "&live=long-poll", tail)),
                    ("sse", lambda: read_sse(host, port, tail)),
                    ("lookup", lambda: lookup(client, messages)),
                ]
                for name, work in reads:
                    phases.append(measure(name, rss, health, work))
                    print(phases[-1], flush=True)
        if args.raised_cap:
            cap = ["--max-messages-per-request", str(messages)]
            with serve(tmp, "raised", args, cap) as server:
                client = Client(server.host, server.port)
                client.call("PUT", STREAM, b"", {"Content-Type": "application/json"})
                rss = Rss(server.pid)
                with HealthPoller(server.host, server.port) as health:
                    phase = measure("append-accepted", rss, health, lambda: append(client, body))
                    phases.append(phase)
                    print(phase, flush=True)
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=8, help="size of the bomb body (default: 8)")
    parser.add_argument("--server-args", default="", help="extra server arguments")
    parser.add_argument(
        "--raised-cap",
        action="store_true",
        help="also append the bomb to a server whose --max-messages-per-request admits it",
    )
    parser.add_argument(
        "--server-pythonpath",
        type=Path,
        help="run the server from this source tree (prepended to PYTHONPATH), e.g. an old commit's "
        "server/ directory",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    if args.server_pythonpath is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, (str(args.server_pythonpath.resolve()), os.environ.get("PYTHONPATH")))
        )
    revision = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    phases = run(args)
    print(f"\n{'phase':<16} {'status':<10} {'req':>5} {'s':>7} {'RSS +MiB':>9} {'healthz ms':>11}")
    for p in phases:
        status = p.status.split(" ", 1)[0]
        print(
            f"{p.name:<16} {status:<10} {p.requests:>5} {p.seconds:>7.2f} "
            f"{p.rss_peak_growth_mib:>9.1f} {p.worst_healthz_ms:>11.1f}"
        )
    if args.json is not None:
        document = {
            "revision": revision,
            "server_pythonpath": str(args.server_pythonpath or ""),
            "mib": args.mib,
            "phases": [asdict(p) for p in phases],
        }
        args.json.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
