"""Benchmark durastream-server against the Node reference server (@durable-streams/server 0.3.7).

Both servers run on their file-backed stores (ours with fsync durability, its default; the reference
fdatasyncs every append). Each benchmark alternates the two servers round by round, because this machine
is noisy: a figure measured minutes apart on a busy VM says more about the VM than about the server.

Benchmarks (see docs/benchmarks.md for the method and the recorded figures):

- ``append``:   8 producers (Producer-Id/Epoch/Seq), each with one request in flight, 64 x 1 KiB JSON
                messages per request, all into one stream. Figure: acknowledged messages/s.
- ``read``:     catch-up read of a 1 GiB byte stream from ``-1`` (following Stream-Next-Offset until
                Stream-Up-To-Date). Figures: MiB/s, and server RSS before/peak/after the read.
- ``longpoll``: 100 long-poll readers parked at the tail of one stream, one writer. Figure: the delay
                from the writer sending an append to each reader receiving it (p50/p99/max).
- ``rss``:      write 2 GiB across 1,000 byte streams (64 KiB appends, 16 writers), then measure the
                server's RSS.
- ``small``:    issue 17's common write: 64 idempotent producers, each on its own JSON stream with one
                request in flight, one 200 B message per request. Figure: appends/s. Also run on the
                floor, a trivial uvicorn app answering the same requests with no disk and no protocol
                (``bench/uvicorn_floor.py``), in the same rounds with the same client.
- ``small8``, ``small8-shared``: the same with 8 messages per request, on 64 streams and on one shared
                stream: group commit across streams against group commit within one.

The client is a small HTTP/1.1 keep-alive client on asyncio streams (uvloop when installed), shared by
both servers, with request bodies built before the clock starts. Everything goes to 127.0.0.1 only, and
every benchmark is bounded in size and time. ``--quick`` shrinks the sizes for a smoke run.

Run: ``python bench/server_bench.py [--quick] [--only append,read,longpoll,rss,small,...] [--json FILE]``
(``make bench-server`` runs the full mode). The first run installs the reference server with ``npm ci``
into ``bench/node_modules``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
OURS = "ours"
REF = "reference"
FLOOR = "floor"  # a trivial uvicorn app (bench/uvicorn_floor.py): no disk, no protocol
KINDS = (OURS, REF)


# ------------------------------------------------------------------------------------------ sizes


@dataclass(frozen=True)
class Sizes:
    """Every size and duration of one mode; nothing in a benchmark is unbounded."""

    rounds: int  # alternating rounds of the cheap benchmarks (append, longpoll)
    heavy_rounds: int  # rounds of the benchmarks that write GiBs (read)
    append_seconds: float
    read_bytes: int
    read_append_bytes: int
    read_repeats: int
    longpoll_readers: int
    longpoll_events: int
    rss_streams: int
    rss_bytes_per_stream: int
    rss_append_bytes: int
    rss_writers: int
    small_seconds: float


FULL = Sizes(
    rounds=3,
    heavy_rounds=2,
    append_seconds=10.0,
    read_bytes=1 << 30,
    read_append_bytes=256 << 10,
    read_repeats=2,
    longpoll_readers=100,
    longpoll_events=200,
    rss_streams=1000,
    rss_bytes_per_stream=(2 << 30) // 1000,
    rss_append_bytes=64 << 10,
    rss_writers=16,
    small_seconds=10.0,
)
QUICK = Sizes(
    rounds=1,
    heavy_rounds=1,
    append_seconds=3.0,
    read_bytes=64 << 20,
    read_append_bytes=256 << 10,
    read_repeats=2,
    longpoll_readers=100,
    longpoll_events=30,
    rss_streams=1000,
    rss_bytes_per_stream=128 << 10,
    rss_append_bytes=64 << 10,
    rss_writers=16,
    small_seconds=3.0,
)

PRODUCERS = 8
MESSAGES_PER_REQUEST = 64
MESSAGE_BYTES = 1024


# ----------------------------------------------------------------------------------- HTTP client


class HttpError(RuntimeError):
    pass


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    body_len: int
    first_byte_at: float  # perf_counter() when the status line arrived


class Connection:
    """One keep-alive HTTP/1.1 connection. Requests on it are strictly sequential.

    Minimal on purpose (status line, headers, Content-Length or chunked bodies), so that the client
    costs far less CPU per request than either server; ``discard=True`` counts body bytes without
    keeping them, so a 1 GiB response does not have to fit in the client.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self._reader, self._writer = await asyncio.open_connection(
            self.host, self.port, limit=1 << 20
        )
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = None

    def send(self, method: str, path: str, headers: bytes = b"", body: bytes = b"") -> None:
        """Write a request; ``headers`` is pre-encoded ``Name: value\\r\\n`` lines."""
        assert self._writer is not None
        head = (
            (
                f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Length: {len(body)}\r\n"
            ).encode()
            + headers
            + b"\r\n"
        )
        if body:
            self._writer.writelines((head, body))
        else:
            self._writer.write(head)

    async def receive(self, *, discard: bool = False, head: bool = False) -> Response:
        reader = self._reader
        assert reader is not None
        raw = await reader.readuntil(b"\r\n\r\n")
        first = time.perf_counter()
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = b""
        length = 0
        if head or status in (204, 304) or 100 <= status < 200:
            pass
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                length += size
                remaining = size
                while remaining:
                    chunk = await reader.read(min(remaining, 1 << 20))
                    if not chunk:
                        raise HttpError("connection closed inside a chunk")
                    remaining -= len(chunk)
                    if not discard:
                        parts.append(chunk)
                await reader.readexactly(2)
            body = b"".join(parts)
        else:
            length = int(headers.get("content-length", "0"))
            if discard:
                remaining = length
                while remaining:
                    chunk = await reader.read(min(remaining, 1 << 20))
                    if not chunk:
                        raise HttpError("connection closed inside a body")
                    remaining -= len(chunk)
            elif length:
                body = await reader.readexactly(length)
        if not discard:
            length = len(body)
        return Response(status, headers, body, length, first)

    async def request(
        self,
        method: str,
        path: str,
        headers: bytes = b"",
        body: bytes = b"",
        *,
        discard: bool = False,
    ) -> Response:
        self.send(method, path, headers, body)
        return await self.receive(discard=discard, head=method == "HEAD")


def hdrs(**values: str) -> bytes:
    """``Producer_Id="x"`` -> ``b"Producer-Id: x\\r\\n"``."""
    return b"".join(f"{k.replace('_', '-')}: {v}\r\n".encode() for k, v in values.items())


def expect(resp: Response, *statuses: int, what: str) -> Response:
    if resp.status not in statuses:
        raise HttpError(f"{what}: HTTP {resp.status} {resp.body[:200]!r}")
    return resp


# --------------------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (Linux); 0 if unavailable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all threads), in seconds."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc``; none where that is not available)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(child) for child in fh.read().split()]
    except OSError:
        return []


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all cores busy over ``seconds`` (from /proc/stat), e.g. 0.5 = one of two cores."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values), idle

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def wait_quiet(limit: float, max_wait: float) -> float:
    """Wait (at most ``max_wait`` s) until other processes keep less than ``limit`` of the CPU busy.

    This machine is shared: a test suite started by someone else in the middle of a round distorts
    that round. Returns the last busy fraction seen (recorded with each result).
    """
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > limit and time.monotonic() < deadline:
        busy = cpu_busy(2.0)
    return busy


def ensure_reference_installed() -> None:
    """``npm ci`` into bench/node_modules when the reference server is missing (a fresh machine)."""
    marker = BENCH_DIR / "node_modules" / "@durable-streams" / "server" / "package.json"
    if marker.exists():
        return
    if shutil.which("npm") is None:
        sys.exit("npm is required to install the reference server (bench/package.json)")
    print("installing the reference server: npm ci in bench/ ...", flush=True)
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=BENCH_DIR, check=True
    )


class Server:
    """One server process on a fresh data directory, started and stopped by the benchmark."""

    def __init__(self, kind: str, workdir: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.extra_args = extra_args  # appended to our server's command line (experiments only)
        self.port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.with_suffix(".log")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        if self.kind == OURS:
            cmd = [
                sys.executable,
                "-m",
                "durastream_server",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                "--long-poll-timeout",
                "30",
                "--log-level",
                "WARNING",
                *self.extra_args,
            ]
            cwd = REPO
        elif self.kind == FLOOR:
            cmd = [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(BENCH_DIR),
                "uvicorn_floor:app",
                "--port",
                str(self.port),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--log-level",
                "warning",
                "--no-access-log",
            ]
            cwd = BENCH_DIR
        else:
            cmd = [
                "node",
                str(BENCH_DIR / "reference_server.mjs"),
                str(self.port),
                str(self.data_dir),
                "30000",
            ]
            cwd = BENCH_DIR
        log = open(self.log_path, "wb")  # noqa: SIM115 - kept open for the process's lifetime
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.kind} server exited: {self.log_path.read_text()[-2000:]}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.kind} server did not start listening within 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    async def connect(self) -> Connection:
        return await Connection("127.0.0.1", self.port).open()

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def cpu(self) -> float:
        """The server's CPU, its child processes' included (the workers of ``--workers N``)."""
        return cpu_seconds(self.pid) + sum(cpu_seconds(child) for child in children(self.pid))


class RssSampler:
    """Samples a process's RSS every ``interval`` seconds in the background (the peak is the figure)."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = rss_bytes(pid)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.peak = max(self.peak, rss_bytes(self.pid))


# ------------------------------------------------------------------------------------ benchmarks

MiB = 1 << 20


def json_messages_body(producer: int) -> bytes:
    """A JSON array of 64 objects, each exactly 1 KiB when serialized."""
    items = []
    for i in range(MESSAGES_PER_REQUEST):
        skeleton = json.dumps({"producer": producer, "i": i, "pad": ""}, separators=(",", ":"))
        pad = "x" * (MESSAGE_BYTES - len(skeleton))
        items.append(
            json.dumps({"producer": producer, "i": i, "pad": pad}, separators=(",", ":")).encode()
        )
    assert all(len(item) == MESSAGE_BYTES for item in items)
    return b"[" + b",".join(items) + b"]"


async def create_stream(server: Server, path: str, content_type: str) -> None:
    conn = await server.connect()
    try:
        expect(
            await conn.request("PUT", path, hdrs(Content_Type=content_type)),
            200,
            201,
            what=f"create {path}",
        )
    finally:
        await conn.close()


async def bench_append(server: Server, sizes: Sizes) -> dict:
    path = "/v1/stream/bench-append"
    await create_stream(server, path, "application/json")
    bodies = [json_messages_body(p) for p in range(PRODUCERS)]
    conns = [await server.connect() for _ in range(PRODUCERS)]
    seqs = [0] * PRODUCERS
    acked = [0] * PRODUCERS
    latencies: list[float] = []
    json_type = hdrs(Content_Type="application/json")

    async def one(p: int) -> None:
        headers = json_type + hdrs(
            Producer_Id=f"bench-{p}", Producer_Epoch="0", Producer_Seq=str(seqs[p])
        )
        seqs[p] += 1
        t0 = time.perf_counter()
        resp = await conns[p].request("POST", path, headers, bodies[p])
        expect(resp, 200, what="producer append")
        latencies.append(time.perf_counter() - t0)

    async def producer(p: int, stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            await one(p)
            acked[p] += MESSAGES_PER_REQUEST

    # Warm-up: a few requests per producer, not counted.
    await asyncio.gather(*(producer(p, time.perf_counter() + 0.5) for p in range(PRODUCERS)))
    acked = [0] * PRODUCERS
    latencies.clear()
    cpu0 = server.cpu()
    start = time.perf_counter()
    await asyncio.gather(*(producer(p, start + sizes.append_seconds) for p in range(PRODUCERS)))
    elapsed = time.perf_counter() - start
    cpu = server.cpu() - cpu0
    for conn in conns:
        await conn.close()
    latencies.sort()
    total = sum(acked)
    return {
        "messages_per_s": total / elapsed,
        "requests_per_s": total / MESSAGES_PER_REQUEST / elapsed,
        "mib_per_s": total * MESSAGE_BYTES / MiB / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "server_cpu_per_s": cpu / elapsed,
        "rss_mib": server.rss() / MiB,
    }


async def fill_stream(
    server: Server, path: str, total: int, append_bytes: int, writers: int = 4
) -> float:
    """Write ``total`` bytes to a byte stream with plain appends; returns MiB/s."""
    chunk = (b"0123456789abcdef" * (append_bytes // 16 + 1))[:append_bytes]
    count = total // append_bytes
    remaining = [count]
    headers = hdrs(Content_Type="application/octet-stream")

    async def writer() -> None:
        conn = await server.connect()
        try:
            while remaining[0] > 0:
                remaining[0] -= 1
                expect(await conn.request("POST", path, headers, chunk), 200, 204, what="fill")
        finally:
            await conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return count * append_bytes / MiB / (time.perf_counter() - start)


class BlockingReader:
    """A blocking keep-alive GET client that discards bodies with ``recv_into`` into one buffer.

    The catch-up benchmark moves a GiB through the client; an asyncio stream allocates a bytes object
    per read, which on this 2-core machine made the client a visible part of the measured time. This
    reader runs in a thread and touches each byte once (the kernel copy), so the server is the bottleneck.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.scratch = bytearray(4 << 20)
        self.view = memoryview(self.scratch)
        self.buf = b""  # bytes received but not yet consumed

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        n = self.sock.recv_into(self.view, 64 << 10)
        if not n:
            raise HttpError("connection closed")
        self.buf += self.scratch[:n]

    def _line(self, sep: bytes = b"\r\n") -> bytes:
        while True:
            at = self.buf.find(sep)
            if at >= 0:
                line, self.buf = self.buf[:at], self.buf[at + len(sep) :]
                return line
            self._fill()

    def _skip(self, n: int) -> None:
        take = min(n, len(self.buf))
        self.buf = self.buf[take:]
        n -= take
        while n:
            got = self.sock.recv_into(self.view, min(n, len(self.scratch)))
            if not got:
                raise HttpError("connection closed inside a body")
            n -= got

    def get(self, path: str) -> tuple[int, dict[str, str], int]:
        """GET ``path``; returns (status, headers, body length) with the body discarded."""
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        lines = self._line(b"\r\n\r\n").decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0
        if status in (204, 304):
            pass
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    self._line()
                    break
                self._skip(size + 2)
                length += size
        else:
            length = int(headers.get("content-length", "0"))
            self._skip(length)
        return status, headers, length


def catch_up_blocking(port: int, path: str) -> tuple[int, int]:
    """Read ``path`` from -1 to its tail, following Stream-Next-Offset; returns (bytes, requests)."""
    client = BlockingReader(port)
    offset = "-1"
    got = 0
    requests = 0
    try:
        while True:
            status, headers, length = client.get(f"{path}?offset={offset}")
            if status != 200:
                raise HttpError(f"catch-up read: HTTP {status}")
            requests += 1
            got += length
            offset = headers["stream-next-offset"]
            if headers.get("stream-up-to-date") == "true":
                return got, requests
    finally:
        client.close()


async def catch_up(server: Server, path: str) -> tuple[int, int]:
    return await asyncio.to_thread(catch_up_blocking, server.port, path)


async def bench_read(server: Server, sizes: Sizes) -> dict:
    path = "/v1/stream/bench-read"
    await create_stream(server, path, "application/octet-stream")
    fill_rate = await fill_stream(server, path, sizes.read_bytes, sizes.read_append_bytes)
    await asyncio.sleep(1.0)
    runs = []
    for _ in range(sizes.read_repeats):
        before = server.rss()
        cpu0 = server.cpu()
        with RssSampler(server.pid) as sampler:
            start = time.perf_counter()
            got, requests = await catch_up(server, path)
            elapsed = time.perf_counter() - start
        if got != sizes.read_bytes:
            raise HttpError(f"catch-up read returned {got} bytes, expected {sizes.read_bytes}")
        runs.append(
            {
                "mib_per_s": got / MiB / elapsed,
                "seconds": elapsed,
                "requests": requests,
                "rss_before_mib": before / MiB,
                "rss_peak_mib": sampler.peak / MiB,
                "rss_after_mib": server.rss() / MiB,
                "server_cpu_per_s": (server.cpu() - cpu0) / elapsed,
            }
        )
    best = max(runs, key=lambda r: r["mib_per_s"])
    return {**best, "runs": runs, "fill_mib_per_s": fill_rate}


_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[ \t]*chunked", re.IGNORECASE)
_NEXT_OFFSET = re.compile(rb"\r\nstream-next-offset:[ \t]*([^\r\n]*?)[ \t]*\r\n", re.IGNORECASE)


def parse_response(buf: bytes) -> tuple[int, bytes, int] | None:
    """Status, Stream-Next-Offset (b"" if absent) and length of the complete response at the start of
    ``buf``; None if it is still incomplete. Handles Content-Length and chunked bodies (the reference
    server sends chunked). It looks up only the headers it needs, with a regular expression each: with
    100 answers arriving at once, the client's own per-answer work delays its reading of the next one,
    and that delay would count as wake latency."""
    end = buf.find(_HEAD_END)
    if end < 0:
        return None
    head = buf[: end + 2]
    status = int(head[9:12])
    found = _NEXT_OFFSET.search(head)
    next_offset = found.group(1) if found else b""
    at = end + 4
    if status in (204, 304):
        return status, next_offset, at
    if _CHUNKED.search(head):
        while True:
            nl = buf.find(b"\r\n", at)
            if nl < 0:
                return None
            size = int(buf[at:nl].split(b";")[0], 16)
            at = nl + 2 + size + 2
            if at > len(buf):
                return None
            if size == 0:
                return status, next_offset, at
    length = _CONTENT_LENGTH.search(head)
    at += int(length.group(1)) if length else 0
    return (status, next_offset, at) if len(buf) >= at else None


class NoDelayProtocol(asyncio.Protocol):
    """A client protocol that sends each request at once (TCP_NODELAY) and keeps its transport."""

    transport: asyncio.Transport | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class LongPollClient(NoDelayProtocol):
    """One long-poll connection as a bare protocol: the arrival time of a response is taken in
    ``data_received``, in the loop iteration its first bytes arrive, and the complete answer is handed
    to ``on_answer`` right there, without waking a task per reader. With 100 readers answered in a
    burst, a stream- or task-based client would add its own queueing to the latency it measures."""

    def __init__(self, on_answer: Callable[[LongPollClient, int, str, float], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.on_answer = on_answer
        self.buf = b""
        self.first_at = 0.0
        self.offset = ""  # the offset of the reader's next (or pending) long-poll
        self.pending = False
        self.error: Exception | None = None

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.first_at = time.perf_counter()
        self.buf += data
        parsed = parse_response(self.buf)
        if parsed is not None and self.pending:
            status, next_offset, used = parsed
            self.buf = self.buf[used:]
            self.pending = False
            self.on_answer(self, status, next_offset.decode("latin-1"), self.first_at)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pending:
            self.error = HttpError(f"connection lost: {exc}")
            self.pending = False
            self.on_answer(self, 0, "", 0.0)

    def get(self, path: str) -> None:
        assert self.transport is not None
        self.pending = True
        self.transport.write(
            f"GET {path}?offset={self.offset}&live=long-poll HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        )


async def bench_longpoll(server: Server, sizes: Sizes) -> dict:
    path = "/v1/stream/bench-longpoll"
    await create_stream(server, path, "application/json")
    conn = await server.connect()
    expect(
        await conn.request("POST", path, hdrs(Content_Type="application/json"), b'{"seed":0}'),
        200,
        204,
        what="seed",
    )
    head = expect(await conn.request("HEAD", path), 200, what="head")
    tail = head.headers["stream-next-offset"]
    loop = asyncio.get_running_loop()
    sent: list[tuple[float, str]] = []  # per event: when its append was sent, the tail after it
    deliveries: list[tuple[str, str, float]] = []  # (offset asked, offset returned, arrival time)
    outstanding = [0]  # long-polls sent and not yet answered
    all_answered = asyncio.Event()
    errors: list[Exception] = []

    def on_answer(client: LongPollClient, status: int, next_offset: str, first_at: float) -> None:
        outstanding[0] -= 1
        if outstanding[0] == 0:
            all_answered.set()
        if client.error is not None:
            errors.append(client.error)
        elif status == 200:
            deliveries.append((client.offset, next_offset, first_at))
            client.offset = next_offset
        elif status != 204:
            errors.append(HttpError(f"long-poll: HTTP {status}"))

    readers: list[LongPollClient] = []
    for _ in range(sizes.longpoll_readers):
        _, protocol = await loop.create_connection(
            lambda: LongPollClient(on_answer), "127.0.0.1", server.port
        )
        protocol.offset = tail
        readers.append(protocol)

    def park() -> None:
        # Readers re-park once every reader has the event (or after 2 s), not the moment each is
        # answered: on this 2-core machine the client's own re-requests would otherwise compete with
        # the server burst being measured (and delay the client's reading of later answers).
        for client in readers:
            if not client.pending:
                client.get(path)
                outstanding[0] += 1
        all_answered.clear()

    append_latency: list[float] = []
    headers = hdrs(Content_Type="application/json")
    cpu0 = server.cpu()
    try:
        for event in range(sizes.longpoll_events):
            park()
            await asyncio.sleep(0.03)  # let the server park every request it has received
            if errors:
                raise errors[0]
            body = json.dumps({"event": event, "pad": "x" * 100}).encode()
            t0 = time.perf_counter()
            conn.send("POST", path, headers, body)
            resp = await conn.receive()
            append_latency.append(time.perf_counter() - t0)
            expect(resp, 200, 204, what="long-poll writer append")
            sent.append((t0, resp.headers["stream-next-offset"]))
            # A reader the server failed to wake stays parked and is answered by the next event
            # (and measured from this one), so do not wait for it forever.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(all_answered.wait(), 2)
        park()  # the last event's re-parks count in the server CPU figure, as every other's
        await asyncio.sleep(0.03)
        if errors:
            raise errors[0]
    finally:
        cpu = server.cpu() - cpu0
        for client in readers:
            if client.transport is not None:
                client.transport.close()
        await conn.close()
    # Each delivery answers every event between the offset it asked from and the one it returned
    # (offsets are fixed-width, so they compare as strings). An event a reader was not woken for
    # and got only with a later one is measured from its own append: a missed wake-up shows as the
    # latency it really caused.
    samples = [
        arrived - sent_time
        for asked, returned, arrived in deliveries
        for sent_time, tail_after in sent
        if asked < tail_after <= returned
    ]
    expected = sizes.longpoll_events * sizes.longpoll_readers
    if len(samples) != expected:
        raise HttpError(f"long-poll: {len(samples)} event deliveries, expected {expected}")
    samples.sort()
    append_latency.sort()
    return {
        "samples": len(samples),
        "late_deliveries": sum(1 for s in samples if s > 0.010),
        "p50_ms": 1000 * samples[len(samples) // 2],
        "p90_ms": 1000 * samples[int(len(samples) * 0.90)],
        "p99_ms": 1000 * samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "max_ms": 1000 * samples[-1],
        "append_p50_ms": 1000 * append_latency[len(append_latency) // 2],
        # Server CPU per event (a writer append plus 100 wake-ups and re-parks): robust to noise.
        "server_cpu_ms_per_event": 1000 * cpu / sizes.longpoll_events,
    }


SMALL_PRODUCERS = 64
SMALL_MESSAGE_BYTES = 200


def small_messages_body(producer: int, messages: int) -> bytes:
    """A JSON array of ``messages`` objects of exactly SMALL_MESSAGE_BYTES each (a chat token, an event)."""
    items = []
    for i in range(messages):
        skeleton = json.dumps({"producer": producer, "i": i, "text": ""}, separators=(",", ":"))
        text = "t" * (SMALL_MESSAGE_BYTES - len(skeleton))
        item = json.dumps({"producer": producer, "i": i, "text": text}, separators=(",", ":"))
        assert len(item) == SMALL_MESSAGE_BYTES
        items.append(item.encode())
    return b"[" + b",".join(items) + b"]"


class SmallProducer(NoDelayProtocol):
    """One idempotent producer on its own keep-alive connection, one request in flight.

    A bare protocol: the next request is written from ``data_received`` the moment the answer is
    complete, with the request bytes prepared up to the sequence number. At ten thousand requests a
    second on two cores the client's own cost per request is part of what is measured, for every
    server alike; this keeps it to a few microseconds (the floor's figure shows what is left)."""

    def __init__(self, port: int, path: str, producer_id: str, body: bytes, messages: int) -> None:
        self.head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Producer-Id: {producer_id}\r\nProducer-Epoch: 0\r\nProducer-Seq: "
        ).encode()
        self.tail = b"\r\n\r\n" + body
        self.messages = messages
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.seq = 0
        self.sent_at = 0.0
        self.acked = 0  # messages acknowledged while counting
        self.latencies: list[float] = []
        self.counting = False
        self.stop_at = 0.0
        self.done: asyncio.Future[None] | None = None
        self.error: Exception | None = None

    def run_until(self, stop_at: float, *, counting: bool) -> asyncio.Future[None]:
        self.stop_at = stop_at
        self.counting = counting
        self.done = asyncio.get_running_loop().create_future()
        self._send()
        return self.done

    def _send(self) -> None:
        assert self.transport is not None
        self.sent_at = time.perf_counter()
        self.transport.write(self.head + str(self.seq).encode() + self.tail)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        parsed = parse_response(self.buf)
        if parsed is None:
            return
        now = time.perf_counter()
        status, _, used = parsed
        self.buf = self.buf[used:]
        assert self.done is not None
        if status != 200:
            self.error = HttpError(f"small append: HTTP {status}")
            self.done.set_result(None)
            return
        self.seq += 1
        if self.counting:
            self.acked += self.messages
            self.latencies.append(now - self.sent_at)
        if now < self.stop_at:
            self._send()
        else:
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.error = HttpError(f"connection lost: {exc}")
            self.done.set_result(None)


async def run_small_producers(
    producers: list[SmallProducer], servers: list[Server], seconds: float
) -> tuple[float, float, float]:
    """Run connected producers for a 0.5 s warm-up, then ``seconds`` counted; close them. Returns the
    counted phase's length, the CPU seconds ``servers`` spent in it and this process's (the client's)."""

    async def phase(length: float, *, counting: bool) -> float:
        start = time.perf_counter()
        await asyncio.gather(*(p.run_until(start + length, counting=counting) for p in producers))
        for p in producers:
            if p.error is not None:
                raise p.error
        return time.perf_counter() - start

    try:
        await phase(0.5, counting=False)  # warm-up, not counted
        cpu0 = sum(s.cpu() for s in servers)
        client0 = time.process_time()
        elapsed = await phase(seconds, counting=True)
        client = time.process_time() - client0
        return elapsed, sum(s.cpu() for s in servers) - cpu0, client
    finally:
        for p in producers:
            if p.transport is not None:
                p.transport.close()


async def bench_small_appends(server: Server, sizes: Sizes, *, streams: int, messages: int) -> dict:
    """SMALL_PRODUCERS idempotent producers, each with one request of ``messages`` x 200 B in flight,
    spread over ``streams`` JSON streams (producer p writes stream p % streams)."""
    paths = [f"/v1/stream/bench-small-{i:03d}" for i in range(streams)]
    for path in paths:
        await create_stream(server, path, "application/json")
    loop = asyncio.get_running_loop()
    producers: list[SmallProducer] = []
    for p in range(SMALL_PRODUCERS):
        body = small_messages_body(p, messages)
        _, protocol = await loop.create_connection(
            lambda p=p, body=body: SmallProducer(
                server.port, paths[p % streams], f"small-{p}", body, messages
            ),
            "127.0.0.1",
            server.port,
        )
        producers.append(protocol)
    elapsed, cpu, _ = await run_small_producers(producers, [server], sizes.small_seconds)
    latencies = sorted(x for p in producers for x in p.latencies)
    total = sum(p.acked for p in producers)
    requests = len(latencies)
    return {
        "messages_per_s": total / elapsed,
        "requests_per_s": requests / elapsed,
        "p50_ms": 1000 * latencies[requests // 2],
        "p99_ms": 1000 * latencies[min(requests - 1, int(requests * 0.99))],
        # Server CPU per request (all threads): what the server spends, robust to a busy machine.
        "server_cpu_us_per_request": 1e6 * cpu / max(1, requests),
        "server_cpu_per_s": cpu / elapsed,
    }


async def bench_small(server: Server, sizes: Sizes) -> dict:
    """Issue 17: single-message appends, 64 producers on 64 streams."""
    return await bench_small_appends(server, sizes, streams=SMALL_PRODUCERS, messages=1)


async def bench_small8(server: Server, sizes: Sizes) -> dict:
    """8-message appends, 64 producers on 64 streams (group commit across streams)."""
    return await bench_small_appends(server, sizes, streams=SMALL_PRODUCERS, messages=8)


async def bench_small8_shared(server: Server, sizes: Sizes) -> dict:
    """8-message appends, 64 producers on one stream (group commit within a stream)."""
    return await bench_small_appends(server, sizes, streams=1, messages=8)


async def bench_rss(server: Server, sizes: Sizes) -> dict:
    paths = [f"/v1/stream/bench-rss-{i:04d}" for i in range(sizes.rss_streams)]
    conn = await server.connect()
    headers = hdrs(Content_Type="application/octet-stream")
    for path in paths:
        expect(await conn.request("PUT", path, headers), 201, what="create")
    await conn.close()
    rss_start = server.rss()
    chunk = (b"fedcba9876543210" * (sizes.rss_append_bytes // 16 + 1))[: sizes.rss_append_bytes]
    per_stream = -(-sizes.rss_bytes_per_stream // sizes.rss_append_bytes)  # at least the total
    # Round-robin over streams, so every stream is written throughout (not one after another).
    jobs = [path for _ in range(per_stream) for path in paths]
    next_job = [0]

    async def writer() -> None:
        c = await server.connect()
        try:
            while next_job[0] < len(jobs):
                path = jobs[next_job[0]]
                next_job[0] += 1
                expect(await c.request("POST", path, headers, chunk), 200, 204, what="rss append")
        finally:
            await c.close()

    with RssSampler(server.pid, 0.1) as sampler:
        start = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(sizes.rss_writers)))
        elapsed = time.perf_counter() - start
        await asyncio.sleep(2.0)
    written = len(jobs) * sizes.rss_append_bytes
    return {
        "rss_after_mib": server.rss() / MiB,
        "rss_peak_mib": sampler.peak / MiB,
        "rss_start_mib": rss_start / MiB,
        "written_mib": written / MiB,
        "write_mib_per_s": written / MiB / elapsed,
    }


BENCHMARKS: dict[str, tuple[Callable[[Server, Sizes], Awaitable[dict]], str]] = {
    "append": (bench_append, "rounds"),
    "read": (bench_read, "heavy_rounds"),
    "longpoll": (bench_longpoll, "rounds"),
    "rss": (bench_rss, "heavy_rounds"),
    "small": (bench_small, "rounds"),
    "small8": (bench_small8, "rounds"),
    "small8-shared": (bench_small8_shared, "rounds"),
}
# Benchmarks that also run the floor (bench/uvicorn_floor.py) in every round: small requests, where what
# uvicorn and the client cost on this machine is most of what can be measured.
WITH_FLOOR = frozenset({"small"})
# Run by default (``--only`` names the others): the small-append benchmarks are issue 17's.
DEFAULT_BENCHMARKS = ("append", "read", "longpoll", "rss", "small", "small8", "small8-shared")


# -------------------------------------------------------------------------------------- reporting


@dataclass
class Results:
    runs: dict[str, dict[str, list[dict]]] = field(default_factory=dict)

    def add(self, bench: str, kind: str, result: dict) -> None:
        self.runs.setdefault(bench, {OURS: [], REF: []}).setdefault(kind, []).append(result)

    def median(self, bench: str, kind: str, key: str) -> float:
        return statistics.median(r[key] for r in self.runs[bench][kind])


# (benchmark, key, label, higher is better, format)
FIGURES = [
    ("append", "messages_per_s", "append: messages/s (8 producers, 64 x 1 KiB)", True, "{:,.0f}"),
    ("append", "p99_ms", "append: request latency p99 (ms)", False, "{:.1f}"),
    ("append", "server_cpu_per_s", "append: server CPU (cores busy)", False, "{:.2f}"),
    ("read", "mib_per_s", "catch-up read: MiB/s", True, "{:,.0f}"),
    ("read", "rss_before_mib", "catch-up read: RSS before (MiB)", False, "{:.0f}"),
    ("read", "rss_peak_mib", "catch-up read: RSS peak during (MiB)", False, "{:.0f}"),
    ("read", "fill_mib_per_s", "catch-up read: fill rate MiB/s (4 writers)", True, "{:,.0f}"),
    ("longpoll", "p50_ms", "long-poll wake: p50 (ms)", False, "{:.2f}"),
    ("longpoll", "p99_ms", "long-poll wake: p99 (ms)", False, "{:.2f}"),
    ("longpoll", "max_ms", "long-poll wake: max (ms)", False, "{:.2f}"),
    ("longpoll", "append_p50_ms", "long-poll: writer append p50 (ms)", False, "{:.2f}"),
    ("longpoll", "server_cpu_ms_per_event", "long-poll: server CPU ms per event", False, "{:.1f}"),
    ("rss", "rss_after_mib", "RSS after writing (MiB)", False, "{:.0f}"),
    ("rss", "rss_peak_mib", "RSS peak while writing (MiB)", False, "{:.0f}"),
    ("rss", "write_mib_per_s", "write MiB/s across streams (16 writers)", True, "{:,.0f}"),
    (
        "small",
        "requests_per_s",
        "small: appends/s (64 producers, 64 streams, 1 msg)",
        True,
        "{:,.0f}",
    ),
    ("small", "p99_ms", "small: request latency p99 (ms)", False, "{:.1f}"),
    ("small", "server_cpu_us_per_request", "small: server CPU per request (us)", False, "{:.0f}"),
    ("small8", "messages_per_s", "small8: messages/s (64 streams, 8 x 200 B)", True, "{:,.0f}"),
    ("small8-shared", "messages_per_s", "small8-shared: messages/s (1 stream)", True, "{:,.0f}"),
]


def report(results: Results, sizes: Sizes) -> str:
    lines = [
        f"{'figure':<50} {'ours':>12} {'reference':>12} {'ratio':>8}",
        "-" * 86,
    ]
    for bench, key, label, higher, fmt in FIGURES:
        if bench not in results.runs:
            continue
        ours = results.median(bench, OURS, key)
        ref = results.median(bench, REF, key)
        if ref and ours:
            ratio = ours / ref if higher else ref / ours
            ratio_text = f"{ratio:.2f}x"
        else:
            ratio_text = "-"
        lines.append(f"{label:<50} {fmt.format(ours):>12} {fmt.format(ref):>12} {ratio_text:>8}")
    lines.append("(ratio: how many times better ours is; medians over the rounds)")
    if results.runs.get("small", {}).get(FLOOR):
        floor = results.median("small", FLOOR, "requests_per_s")
        ours = results.median("small", OURS, "requests_per_s")
        lines.append(
            f"small: the floor (trivial uvicorn app, same client) answered {floor:,.0f} requests/s; "
            f"ours is {ours / floor:.0%} of it"
        )
    lines.append("")
    lines.append("targets:")
    targets = []
    if "append" in results.runs:
        r = results.median("append", OURS, "messages_per_s") / results.median(
            "append", REF, "messages_per_s"
        )
        targets.append(("appends >= 2x reference", f"{r:.2f}x", r >= 2))
    if "read" in results.runs:
        r = results.median("read", OURS, "mib_per_s") / results.median("read", REF, "mib_per_s")
        targets.append(
            (f"catch-up read ({sizes.read_bytes // MiB} MiB) >= 3x", f"{r:.2f}x", r >= 3)
        )
        growth = max(
            run["rss_peak_mib"] - run["rss_before_mib"]
            for result in results.runs["read"][OURS]
            for run in result["runs"]
        )
        targets.append(("  RSS flat during the read (growth)", f"+{growth:.0f} MiB", growth < 64))
    if "longpoll" in results.runs:
        p99 = max(r["p99_ms"] for r in results.runs["longpoll"][OURS])
        targets.append(("long-poll wake p99 <= 10 ms (worst round)", f"{p99:.2f} ms", p99 <= 10))
    if "rss" in results.runs:
        rss = max(r["rss_after_mib"] for r in results.runs["rss"][OURS])
        total = round(statistics.median(r["written_mib"] for r in results.runs["rss"][OURS]))
        targets.append(
            (
                f"RSS after {total} MiB / {sizes.rss_streams} streams <= 250 MB",
                f"{rss * MiB / 1e6:.0f} MB",
                rss * MiB <= 250e6,
            )
        )
    if "small" in results.runs:
        ours = results.median("small", OURS, "requests_per_s")
        r = ours / results.median("small", REF, "requests_per_s")
        targets.append(("small appends >= 10,000/s", f"{ours:,.0f}/s", ours >= 10_000))
        targets.append(("small appends >= 5x reference", f"{r:.2f}x", r >= 5))
        if results.runs["small"].get(FLOOR):
            f = ours / results.median("small", FLOOR, "requests_per_s")
            targets.append(("small appends >= 50% of the floor", f"{f:.0%}", f >= 0.5))
    for label, value, ok in targets:
        lines.append(f"  {label:<48} {value:>12}  {'met' if ok else 'NOT met'}")
    return "\n".join(lines)


def machine() -> dict:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="ascii") as fh:
        mem = int(fh.readline().split()[1]) * 1024
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / (1 << 30), 1),
        "python": platform.python_version(),
        "node": node,
        "kernel": platform.release(),
        "load_avg_at_start": os.getloadavg(),
    }


# ------------------------------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> Results:
    sizes = QUICK if args.quick else FULL
    names = args.only.split(",") if args.only else list(DEFAULT_BENCHMARKS)
    results = Results()
    workdir = Path(tempfile.mkdtemp(prefix="durastream-bench-", dir=args.workdir))
    try:
        for name in names:
            func, rounds_attr = BENCHMARKS[name]
            rounds = args.rounds or getattr(sizes, rounds_attr)
            for round_no in range(rounds):
                # Alternate who goes first, so neither always runs on the warmer (or busier) machine.
                kinds = (*KINDS, FLOOR) if name in WITH_FLOOR and not args.no_floor else KINDS
                shift = round_no % len(kinds)
                order = kinds[shift:] + kinds[:shift]
                for kind in order:
                    busy = (
                        wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_wait else None
                    )
                    extra = tuple(args.ours_args.split()) if kind == OURS and args.ours_args else ()
                    server = Server(kind, workdir, extra)
                    server.start()
                    try:
                        started = time.perf_counter()
                        result = await func(server, sizes)
                    finally:
                        server.stop()
                    if busy is not None:
                        result["cpu_busy_before"] = busy
                    results.add(name, kind, result)
                    shown = {k: round(v, 2) for k, v in result.items() if isinstance(v, float)}
                    print(
                        f"[{name} round {round_no + 1}/{rounds}] {kind:<9} "
                        f"{time.perf_counter() - started:6.1f} s  {shown}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (smoke run)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    parser.add_argument("--rounds", type=int, help="override the number of alternating rounds")
    parser.add_argument("--json", type=Path, help="also write the raw results to this file")
    parser.add_argument(
        "--ours-args", help="extra command-line arguments for our server (experiments), quoted"
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each run, wait up to this many seconds for the machine to be idle (shared VMs)",
    )
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=0.15,
        help="'idle' for --quiet-wait: at most this fraction of all cores busy (default 0.15)",
    )
    parser.add_argument("--workdir", help="where the data directories go (default: system tmp)")
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the uvicorn floor in the small-append rounds"
    )
    args = parser.parse_args()
    if args.only and not set(args.only.split(",")) <= set(BENCHMARKS):
        parser.error(f"--only takes a subset of {','.join(BENCHMARKS)}")
    ensure_reference_installed()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    info = machine()
    sizes = QUICK if args.quick else FULL
    print(
        f"durastream-server vs @durable-streams/server 0.3.7, {'quick' if args.quick else 'full'} mode"
    )
    print(f"machine: {info}", flush=True)
    started = time.time()
    results = asyncio.run(run(args))
    text = report(results, sizes)
    print()
    print(text)
    print(f"\ntotal {time.time() - started:.0f} s, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "mode": "quick" if args.quick else "full",
                    "machine": info,
                    "results": results.runs,
                },
                indent=2,
            )
        )
    import charts  # bench/charts.py: bench/results/server.json and docs/img/bench-server.png

    full = not (args.quick or args.only or args.rounds or args.ours_args)
    charts.record("server", charts.server_figures(results.runs, info), full=full)


if __name__ == "__main__":
    main()
