"""Many streams (issue 17): 100,000 small streams on one server, and 10,000 live readers across them.

One server process on a fresh data directory (fsync durability, the defaults), driven over loopback by a
lean client in this process (a bare asyncio protocol per connection: the client's own cost per request must
stay well below the server's on this 2-core machine). Phases, in order, on the same data directory:

``create``   ``--streams`` JSON streams (``scale/s000000`` ...), each created with ``PUT`` and then given
             one small message with ``POST``, by ``--clients`` connections with one request in flight
             each (the issue's method). Figures: streams/s, and the requests' p50/p99. Then
             ``--puts`` more streams are created with ``PUT`` alone (creates/s of the create path).
``idle``     after ``--settle`` seconds: RSS, RSS per stream above an empty server's, open fds.
``list``     listing pages (``pattern=scale/*``, ``limit=100`` from random places; and a full walk at
             ``limit=1000``): latency median/p99. ``--change-query URL`` also times a change query, if
             the server has one (the path and query are given, e.g. ``/v1/stream/__ds/...``).
``restart``  SIGKILL, start again: seconds until ``/healthz`` answers, until a read of a random stream
             answers, and (when ``/healthz`` reports ``streams_pending``) until every stream is recovered;
             the latency of first reads of random streams meanwhile; RSS after the restart.
``readers``  ``--readers`` long-poll readers, each on its own stream (its own connection), parked at the
             tail; appends arrive at ``--event-rate`` per second on random streams among them
             (``--events`` of them). Figures: RSS with every reader parked, and the wake latency (from
             sending the append to the first byte of the reader's answer) p50/p99/max. The same with
             SSE readers. Then, in the same server, 100 long-poll readers on one stream
             (``server_bench.bench_longpoll``): the figure the wake latency is compared with.

``--server-src DIR`` runs the server of another checkout (``PYTHONPATH=DIR/server``), e.g. ``/work/main``
for the figures before a change. ``--server-args "..."`` passes flags. Results print as a table and go
to ``--json FILE``; a full run (``--streams 100000 --readers 10000``) also saves
``bench/results/scale.json`` and renders ``docs/img/bench-scale.png`` (``bench/charts.py``).

Run: ``python bench/scale_bench.py [--streams 100000] [--readers 10000] [--only create,idle,list,restart,readers]``
(a run at full size takes 5-15 minutes here). ``--streams 10000 --puts 0 --only readers`` measures
10,000 readers on 10,000 streams in about 4 minutes (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

import server_bench  # noqa: E402
from server_bench import cpu_seconds, free_port, parse_response, rss_bytes  # noqa: E402

MiB = 1 << 20
PREFIX = "scale"
LISTING = "/v1/stream/__ds/x-durastream/streams"
PHASES = ("create", "idle", "list", "restart", "readers")


def stream_path(i: int) -> str:
    return f"{PREFIX}/s{i:06d}"


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def quantiles(samples: list[float]) -> dict[str, float]:
    """p50/p99/max in milliseconds."""
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max_ms": 1000 * ordered[-1],
    }


# ----------------------------------------------------------------------------------- lean client


class Client(asyncio.Protocol):
    """One keep-alive connection with one request in flight; parses only what the bench needs."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.waiter: asyncio.Future[tuple[int, str]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        parsed = parse_response(self.buf)
        if parsed is not None and self.waiter is not None:
            status, next_offset, used = parsed
            self.buf = self.buf[used:]
            waiter, self.waiter = self.waiter, None
            if not waiter.done():
                waiter.set_result((status, next_offset.decode("latin-1")))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    async def request(self, raw: bytes) -> tuple[int, str]:
        """Send a complete request; (status, Stream-Next-Offset)."""
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter


def raw_request(method: str, path: str, body: bytes = b"", content_type: str = "") -> bytes:
    head = (
        f"{method} /v1/stream/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    )
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + body


async def connect(port: int, factory: Callable[[], asyncio.Protocol] = Client) -> Any:
    _, protocol = await asyncio.get_running_loop().create_connection(factory, "127.0.0.1", port)
    return protocol


# ---------------------------------------------------------------------------------------- server


class ScaleServer:
    """The server under test: one data directory, SIGKILL and restart on it."""

    def __init__(self, data_dir: Path, server_src: str | None, extra: list[str]) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.server_src = server_src
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.with_suffix(".log")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> float:
        """Start the process; returns the perf_counter() of the spawn."""
        env = dict(os.environ)
        if self.server_src:
            env["PYTHONPATH"] = str(Path(self.server_src) / "server")
        cmd = [
            sys.executable,
            "-m",
            "durastream_server",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--log-level",
            "WARNING",
            "--long-poll-timeout",
            "60",
            *self.extra,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process's lifetime
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        return started

    def health(self) -> dict | None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                sock.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
        except OSError:
            return None
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return None
        return json.loads(body)

    def wait_healthy(self, timeout: float = 600) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            if self.health() is not None:
                return time.perf_counter()
            time.sleep(0.01)
        raise RuntimeError("server not healthy in time")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    async def connect(self) -> server_bench.Connection:
        return await server_bench.Connection("127.0.0.1", self.port).open()


# ---------------------------------------------------------------------------------------- phases


async def run_clients(
    port: int, clients: int, items: range, work: Callable[[Client, int], Any]
) -> float:
    """``work(client, i)`` for every i, by ``clients`` connections; returns the elapsed seconds."""
    conns = [await connect(port) for _ in range(clients)]
    queue = iter(items)

    async def one(conn: Client) -> None:
        for i in queue:
            await work(conn, i)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(c) for c in conns))
    finally:
        for c in conns:
            c.transport.close()
    return time.perf_counter() - started


async def phase_create(server: ScaleServer, args: argparse.Namespace, tails: list[str]) -> dict:
    put_latency: list[float] = []
    post_latency: list[float] = []

    async def create(conn: Client, i: int) -> None:
        path = stream_path(i)
        t0 = time.perf_counter()
        status, _ = await conn.request(raw_request("PUT", path, content_type="application/json"))
        t1 = time.perf_counter()
        if status != 201:
            raise RuntimeError(f"PUT {path}: HTTP {status}")
        status, tail = await conn.request(
            raw_request("POST", path, b'{"i":%d,"pad":"0123456789abcdef"}' % i, "application/json")
        )
        t2 = time.perf_counter()
        if status not in (200, 204):
            raise RuntimeError(f"POST {path}: HTTP {status}")
        tails[i] = tail
        put_latency.append(t1 - t0)
        post_latency.append(t2 - t1)

    cpu0 = server.cpu()
    elapsed = await run_clients(server.port, args.clients, range(args.streams), create)
    cpu = server.cpu() - cpu0
    puts = []

    async def put_only(conn: Client, i: int) -> None:
        path = f"{PREFIX}-put/p{i:06d}"
        t0 = time.perf_counter()
        status, _ = await conn.request(raw_request("PUT", path, content_type="application/json"))
        puts.append(time.perf_counter() - t0)
        if status != 201:
            raise RuntimeError(f"PUT {path}: HTTP {status}")

    put_elapsed = await run_clients(server.port, args.clients, range(args.puts), put_only)
    return {
        "streams": args.streams,
        "seconds": elapsed,
        "streams_per_s": args.streams / elapsed,
        "server_cpu_ms_per_stream": 1000 * cpu / args.streams,
        "put": quantiles(put_latency),
        "post": quantiles(post_latency),
        "put_only_streams": args.puts,
        "put_only_creates_per_s": args.puts / put_elapsed if args.puts else None,
        "put_only": quantiles(puts),
    }


async def phase_idle(server: ScaleServer, args: argparse.Namespace, empty_rss: int) -> dict:
    await asyncio.sleep(args.settle)
    total = args.streams + args.puts
    rss = server.rss()
    return {
        "streams": total,
        "rss_mib": rss / MiB,
        "empty_rss_mib": empty_rss / MiB,
        "rss_per_stream_bytes": (rss - empty_rss) / total,
        "open_fds": fd_count(server.pid),
    }


async def get_json(conn: server_bench.Connection, path: str) -> tuple[float, Any]:
    t0 = time.perf_counter()
    resp = await conn.request("GET", path)
    elapsed = time.perf_counter() - t0
    server_bench.expect(resp, 200, what=path)
    return elapsed, json.loads(resp.body)


async def phase_list(server: ScaleServer, args: argparse.Namespace) -> dict:
    conn = await server.connect()
    rng = random.Random(1)
    pages = []
    try:
        for _ in range(args.list_pages):
            after = stream_path(rng.randrange(args.streams))
            elapsed, page = await get_json(
                conn, f"{LISTING}?pattern={PREFIX}/*&limit=100&after={after}"
            )
            pages.append(elapsed)
        walk_started = time.perf_counter()
        after, walked, walk_pages = None, 0, 0
        while True:
            query = f"{LISTING}?pattern=**&limit=1000" + (f"&after={after}" if after else "")
            _, page = await get_json(conn, query)
            walked += len(page["streams"])
            walk_pages += 1
            if page["next"] is None:
                break
            after = page["next"]
        walk = time.perf_counter() - walk_started
        result: dict[str, Any] = {
            "page_limit_100": quantiles(pages),
            "walk_seconds": walk,
            "walk_pages": walk_pages,
            "walk_streams": walked,
        }
        if args.change_query:
            samples = []
            for _ in range(args.list_pages):
                elapsed, _ = await get_json(conn, args.change_query)
                samples.append(elapsed)
            result["change_query"] = quantiles(samples)
        return result
    finally:
        await conn.close()


async def phase_restart(server: ScaleServer, args: argparse.Namespace, tails: list[str]) -> dict:
    server.kill()
    spawned = server.spawn()
    healthy = await asyncio.to_thread(server.wait_healthy)
    rng = random.Random(2)
    conn = await connect(server.port)
    first_reads = []
    first_answer = None
    for _ in range(args.restart_reads):
        i = rng.randrange(args.streams)
        t0 = time.perf_counter()
        status, tail = await conn.request(raw_request("GET", f"{stream_path(i)}?offset=-1"))
        done = time.perf_counter()
        if status != 200 or tail != tails[i]:
            raise RuntimeError(f"read of {stream_path(i)} after restart: {status} {tail}")
        first_answer = first_answer or done
        first_reads.append(done - t0)
    conn.transport.close()
    health = server.health() or {}
    recovered_at = None
    if "streams_pending" in health:
        deadline = time.monotonic() + 900
        while (health.get("streams_pending") or 0) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            health = server.health() or {}
        recovered_at = time.perf_counter()
    await asyncio.sleep(args.settle)
    total = args.streams + args.puts
    return {
        "healthz_seconds": healthy - spawned,
        "first_read_seconds": (first_answer or healthy) - spawned,
        "all_recovered_seconds": None if recovered_at is None else recovered_at - spawned,
        "first_reads": quantiles(first_reads),
        "rss_mib": server.rss() / MiB,
        "rss_per_stream_bytes": (server.rss() - args.empty_rss) / total,
        "open_fds": fd_count(server.pid),
    }


class Reader(asyncio.Protocol):
    """A live reader on one stream: long-poll (re-parks after each answer) or SSE (one response)."""

    def __init__(self, bench: ReaderBench, index: int, offset: str, sse: bool) -> None:
        self.bench = bench
        self.index = index
        self.offset = offset
        self.sse = sse
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.first_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def park(self) -> None:
        assert self.transport is not None
        live = "sse" if self.sse else "long-poll"
        self.transport.write(
            f"GET /v1/stream/{stream_path(self.index)}?offset={self.offset}&live={live} HTTP/1.1"
            "\r\nHost: 127.0.0.1\r\n\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.sse:
            if b"event: data" in self.buf[-16:] + data:
                self.bench.arrived(self, now)
            self.buf = (self.buf + data)[-16:]
            return
        if not self.buf:
            self.first_at = now
        self.buf += data
        parsed = parse_response(self.buf)
        if parsed is None:
            return
        status, next_offset, used = parsed
        self.buf = self.buf[used:]
        if status == 200:
            self.offset = next_offset.decode("latin-1")
            self.bench.arrived(self, self.first_at)
        elif status != 204:
            self.bench.errors.append(f"{stream_path(self.index)}: HTTP {status}")
        self.park()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.bench.closing:
            self.bench.errors.append(f"{stream_path(self.index)}: connection lost ({exc})")


@dataclasses.dataclass
class ReaderBench:
    sent: dict[int, float] = dataclasses.field(default_factory=dict)  # reader index -> append sent
    latencies: list[float] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    closing: bool = False

    def arrived(self, reader: Reader, at: float) -> None:
        sent = self.sent.pop(reader.index, None)
        if sent is not None:
            self.latencies.append(at - sent)


async def phase_readers_of(
    server: ScaleServer, args: argparse.Namespace, tails: list[str], *, sse: bool
) -> dict:
    bench = ReaderBench()
    count = min(args.readers, args.streams)
    loop = asyncio.get_running_loop()
    readers: list[Reader] = []
    rss_before = server.rss()
    for i in range(count):
        _, reader = await loop.create_connection(
            lambda i=i: Reader(bench, i, tails[i], sse), "127.0.0.1", server.port
        )
        # Park at once: the server closes a connection whose request does not arrive within
        # --header-timeout-seconds, and opening 10,000 connections takes longer than that.
        reader.park()
        readers.append(reader)
    deadline = time.monotonic() + 120
    parked = 0
    while time.monotonic() < deadline:
        parked = (server.health() or {}).get("waiters", 0)
        if parked >= count:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(args.settle)
    rss_parked = server.rss()
    writers = [await connect(server.port) for _ in range(args.writers)]
    free = list(writers)
    rng = random.Random(3)
    cpu0 = server.cpu()
    interval = 1.0 / args.event_rate
    started = time.perf_counter()
    pending: set[asyncio.Task[None]] = set()

    async def append(writer: Client, i: int) -> None:
        bench.sent[i] = time.perf_counter()
        status, tail = await writer.request(
            raw_request("POST", stream_path(i), b'{"event":1}', "application/json")
        )
        free.append(writer)
        if status not in (200, 204):
            bench.errors.append(f"append {stream_path(i)}: HTTP {status}")
        tails[i] = tail

    for n in range(args.events):
        await asyncio.sleep(max(0.0, started + n * interval - time.perf_counter()))
        while not free:
            await asyncio.sleep(0.001)
        i = rng.randrange(count)
        while i in bench.sent:
            i = rng.randrange(count)
        task = loop.create_task(append(free.pop(), i))
        pending.add(task)
        task.add_done_callback(pending.discard)
    deadline = time.monotonic() + 30
    while (bench.sent or pending) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    cpu = server.cpu() - cpu0
    bench.closing = True
    for reader in readers:
        reader.transport.close()
    for writer in writers:
        writer.transport.close()
    return {
        "readers": count,
        "parked_seen": parked,
        "rss_before_mib": rss_before / MiB,
        "rss_parked_mib": rss_parked / MiB,
        "rss_per_reader_bytes": (rss_parked - rss_before) / count,
        "events": args.events,
        "events_per_s": args.events / elapsed,
        "missed": len(bench.sent),
        "errors": bench.errors[:5],
        "wake": quantiles(bench.latencies),
        "server_cpu_ms_per_event": 1000 * cpu / args.events,
    }


async def phase_readers(server: ScaleServer, args: argparse.Namespace, tails: list[str]) -> dict:
    result = {"long_poll": await phase_readers_of(server, args, tails, sse=False)}
    await asyncio.sleep(args.settle)
    result["sse"] = await phase_readers_of(server, args, tails, sse=True)
    sizes = dataclasses.replace(server_bench.QUICK, longpoll_events=args.baseline_events)
    result["baseline_100_on_one"] = await server_bench.bench_longpoll(server, sizes)  # type: ignore[arg-type]
    return result


# ------------------------------------------------------------------------------------------- main


def raise_fd_limit(needed: int) -> int:
    """Raise this process's open-file limit (inherited by the server it spawns) to at least ``needed``,
    up to the hard limit: 10,000 readers are 10,000 sockets in the client and as many in the server.
    Returns the soft limit now; exits naming the limit if the hard one is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            sys.exit(
                f"--readers needs {needed:,} open files, and the hard limit (ulimit -Hn) is {hard:,}: "
                "raise it or run fewer readers"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        soft = needed
    return soft


async def run(args: argparse.Namespace) -> dict:
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="scale-bench-"))
    data_dir = workdir / "data"
    server = ScaleServer(data_dir, args.server_src, shlex.split(args.server_args))
    results: dict[str, Any] = {
        "streams": args.streams,
        "readers": args.readers,
        "server_src": args.server_src or str(REPO),
        "server_args": args.server_args,
    }
    tails = [""] * args.streams
    try:
        server.spawn()
        await asyncio.to_thread(server.wait_healthy)
        await asyncio.sleep(1)
        args.empty_rss = server.rss()
        only = set(args.only.split(","))
        # create and the tails it yields are needed by every later phase
        results["create"] = await phase_create(server, args, tails)
        print_phase("create", results["create"])
        for name, phase in (
            ("idle", lambda: phase_idle(server, args, args.empty_rss)),
            ("list", lambda: phase_list(server, args)),
            ("restart", lambda: phase_restart(server, args, tails)),
            ("readers", lambda: phase_readers(server, args, tails)),
        ):
            if name in only:
                results[name] = await phase()
                print_phase(name, results[name])
    finally:
        server.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    return results


def print_phase(name: str, figures: dict) -> None:
    print(f"== {name}: {json.dumps(figures, indent=1, default=str)}", flush=True)


def chart_figures(results: dict) -> dict:
    """The saved figures and the chart's panels (bench/charts.py)."""
    create, idle, restart = results["create"], results["idle"], results["restart"]
    readers = results.get("readers", {})
    panels = [
        {
            "title": f"{results['streams']:,} streams: restart after SIGKILL",
            "unit": "seconds to serve",
            "higher_is_better": False,
            "ours": ["this server"],
            "baselines": ["before (main)"],
            "groups": [
                {"label": "/healthz", "values": {"this server": restart["healthz_seconds"]}}
            ],
        },
        {
            "title": "RSS per idle stream",
            "unit": "bytes",
            "higher_is_better": False,
            "ours": ["this server"],
            "baselines": ["before (main)"],
            "groups": [
                {
                    "label": "after creating",
                    "values": {"this server": idle["rss_per_stream_bytes"]},
                },
                {
                    "label": "after a restart",
                    "values": {"this server": restart["rss_per_stream_bytes"]},
                },
            ],
        },
        {
            "title": "Creating streams",
            "unit": "streams/s",
            "higher_is_better": True,
            "ours": ["this server"],
            "baselines": ["before (main)"],
            "groups": [
                {"label": "PUT + POST", "values": {"this server": create["streams_per_s"]}},
                {"label": "PUT", "values": {"this server": create["put_only_creates_per_s"]}},
            ],
        },
    ]
    if readers:
        panels.append(
            {
                "title": f"{readers['long_poll']['readers']:,} readers on as many streams",
                "unit": "wake p99 ms",
                "higher_is_better": False,
                "ours": ["this server"],
                "baselines": ["100 readers on one stream"],
                "groups": [
                    {
                        "label": "long-poll",
                        "values": {
                            "this server": readers["long_poll"]["wake"]["p99_ms"],
                            "100 readers on one stream": readers["baseline_100_on_one"]["p99_ms"],
                        },
                    },
                    {
                        "label": "SSE",
                        "values": {"this server": readers["sse"]["wake"]["p99_ms"]},
                    },
                ],
            }
        )
    return {"title": "Many streams (bench/scale_bench.py)", "panels": panels, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument(
        "--puts", type=int, default=None, help="PUT-only creates (default streams/10)"
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--readers", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--event-rate", type=float, default=200.0)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--baseline-events", type=int, default=100)
    parser.add_argument("--list-pages", type=int, default=100)
    parser.add_argument("--restart-reads", type=int, default=200)
    parser.add_argument("--change-query", default="")
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--only", default=",".join(PHASES))
    parser.add_argument("--server-src", default=None)
    parser.add_argument("--server-args", default="")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("--json", default=None)
    parser.add_argument("--record", action="store_true", help="save bench/results/scale.json")
    args = parser.parse_args()
    if args.puts is None:
        args.puts = args.streams // 10
    raise_fd_limit(min(args.readers, args.streams) + args.writers + 1024)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    results = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.record:
        import charts

        charts.record("scale", chart_figures(results), command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
