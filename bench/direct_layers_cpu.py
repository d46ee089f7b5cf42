"""Loop-thread CPU per small append, layer by layer, in process: what each layer of the direct path adds.

``server_bench.py --only small`` measures the whole server behind real sockets, with the client on the
same 2 cores: its CPU per request moves 10% and more pair to pair on this shared machine. This runs
the same request shape (64 producers, each on its own JSON stream with one request in flight, one
200 B message with producer headers) in one process, without sockets: each "connection" is a fake
transport whose answer sends the producer's next request (``loop.call_soon``), so the figure is the
loop thread's own CPU (``time.thread_time``) per answered request, in five stacks:

- ``bare``: httptools alone, with the least a server does (url, headers, body, one write per answer),
  and this harness's client: the floor of any Python HTTP/1.1 server on this parser;
- ``machinery``: the server's real protocol class (uvicorn's httptools protocol, the connection guard,
  the fast-path mixin) with a stub direct app answering fixed lines: the HTTP machinery;
- ``http``: the real app (``app.direct``: headers, request id, CORS, auth, parsing, the answer's lines,
  metrics) over a started backend whose ``Engine.append_nowait`` returns a resolved future: the
  protocol's HTTP layer;
- ``engine``: the real engine over a log whose ``stage_to`` folds the entry into the stream's state
  and settles it a loop turn later, without a commit round: the engine's checks, the fold and the
  settle (observers, the answer);
- ``full``: the real engine and storage (fsync, packed appends): the loop thread's share of the
  engine's checks, staging, the commit round's callbacks and settling, plus the process's CPU
  (commit and I/O threads).

The heap is frozen and the GC's thresholds set as the server sets them once it listens
(``collections_hold.start_serving``, or main's ``gc.freeze()`` in a checkout without it), and each
line also shows the loop thread's CPU in the cyclic GC's collections (``gc.callbacks``).

Each (checkout, stack) runs in a fresh process (``PYTHONPATH=<checkout>/server``), checkouts
alternating; compare checkouts by the paired ratios, and layers by the differences between stacks.

Run: ``python bench/direct_layers_cpu.py --server-src /work/main --server-src . [--repeat 4]
[--stacks bare,machinery,http,engine,full] [--seconds 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storage_small_cpu import checkout_child  # noqa: E402

PRODUCERS = 64
PAD = b"x" * 160  # a ~200 B JSON message, as server_bench's small appends
ANSWER_LINES = (
    b"stream-next-offset: 0000000000000000_0000000000001234\r\ncache-control: no-store\r\n"
    b"producer-epoch: 0\r\nproducer-seq: 1\r\ncontent-length: 0\r\n"
)


def post(path: str, producer: str, seq: int) -> bytes:
    """One small append with producer headers, as ``server_bench.SmallProducer`` sends it."""
    body = b'{"producer":"%s","n":%d,"pad":"%s"}' % (producer.encode(), seq, PAD)
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nProducer-Id: {producer}\r\nProducer-Epoch: 0\r\n"
        f"Producer-Seq: {seq}\r\n\r\n"
    ).encode() + body


def put(path: str) -> bytes:
    return (
        f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n\r\n"
    ).encode()


class Client(asyncio.Transport):
    """A connection's transport that is also its producer: each complete answer sends the next request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str, producer: str) -> None:
        super().__init__()
        self.loop = loop
        self.path = path
        self.producer = producer
        self.seq = -1
        self.answers = 0
        self.protocol: Any = None
        self.buffer = b""
        self.stopped = True
        self.statuses: dict[bytes, int] = {}

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self._received(data)

    def writelines(self, parts: Any) -> None:
        self._received(b"".join(parts))

    def _received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length: ")
        length = int(head[at + 16 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        status = self.buffer[9:12]
        self.buffer = b""
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.answers += 1
        if not self.stopped:
            self.send_next()

    def send_next(self) -> None:
        self.seq += 1
        self.loop.call_soon(self.protocol.data_received, post(self.path, self.producer, self.seq))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


class StubApp:
    """Every request direct, answered at once with fixed lines (the ``machinery`` stack)."""

    def direct_candidate(self, scope: Any) -> bool:
        return True

    def direct(self, scope: Any, body: bytes, responder: Any, send: Any) -> bool:
        responder.send_lines(200 if scope["method"] == "POST" else 201, ANSWER_LINES)
        return True

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        pass


class Bare:
    """httptools with the least a server needs (the ``bare`` stack)."""

    def __init__(self, transport: Client) -> None:
        import httptools

        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.done = False

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True

    def data_received(self, data: bytes) -> None:
        self.done = False
        self.parser.feed_data(data)
        if self.done:
            status = b"201 Created" if self.parser.get_method() == b"PUT" else b"200 OK"
            self.transport.writelines(
                (b"HTTP/1.1 " + status + b"\r\n", ANSWER_LINES, b"x-request-id: 1\r\n", b"\r\n")
            )


def _resolved_append(request: Any) -> asyncio.Future[Any]:
    """``Engine.append_nowait`` for the ``http`` stack: accepted at once, nothing staged."""
    from durastream_server.engine.api import AppendResult

    future = asyncio.get_running_loop().create_future()
    producer = request.producer
    future.set_result(
        AppendResult(
            next_offset="0000000000000000_0000000000001234",
            closed=False,
            producer_epoch=producer.epoch,
            producer_seq=producer.seq,
        )
    )
    return future


def _settle_without_round() -> None:
    """``StreamLog.stage_to`` for the ``engine`` stack: the state fold, then settled a loop turn
    later, without the commit round (nothing is written)."""
    from durastream_server.storage.log import StreamLog
    from durastream_server.storage.state import apply_entry

    def stage_to(log: Any, entry: Any, slot: Any) -> None:
        apply_entry(log.state, entry)
        asyncio.get_running_loop().call_soon(slot.set_result, None)

    StreamLog.stage_to = stage_to  # type: ignore[method-assign]


class _CollectionTimes:
    """A ``gc.callbacks`` entry: the cyclic GC's collections and the loop thread's CPU in them."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.count += 1
            self.seconds += time.thread_time() - self._started


def _start_serving() -> None:
    """What the server does with the cyclic GC once it listens (``server.py``): this checkout's
    ``collections_hold.start_serving``, or, in a checkout without it, the ``gc.freeze()`` it does."""
    from durastream_server.http import collections_hold

    start = getattr(collections_hold, "start_serving", None)
    if start is not None:
        start()
    else:
        gc.collect()
        gc.freeze()


async def _settled(clients: list[Client], deadline: float) -> None:
    while any(c.buffer or c.answers < c.expected for c in clients):  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise RuntimeError("answers did not arrive")
        await asyncio.sleep(0.01)


async def child(stack: str, seconds: float, rounds: int) -> dict[str, Any]:
    """One process's figures for ``stack``: loop-thread and process CPU per request, per round."""
    import uvicorn
    from uvicorn.server import ServerState

    from durastream_server import server as server_module
    from durastream_server.config import ServerConfig
    from durastream_server.http import fastpath
    from durastream_server.http.guard import protocol_class

    data = Path(tempfile.mkdtemp(prefix="direct-layers-"))
    try:
        config = ServerConfig(data_dir=data / "data", long_poll_timeout=30.0)
        app = server_module.build_app(config)
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        life = asyncio.create_task(app({"type": "lifespan"}, inbox.get, outbox.put))
        await inbox.put({"type": "lifespan.startup"})
        started = await outbox.get()
        assert started["type"] == "lifespan.startup.complete", started
        served: Any = StubApp() if stack in ("bare", "machinery") else app
        if stack == "http":
            app._backend.engine.append_nowait = _resolved_append  # type: ignore[union-attr,method-assign]
        elif stack == "engine":
            _settle_without_round()
        uv_config = uvicorn.Config(
            served,
            http=fastpath.with_fast_path(protocol_class(config), served),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
        )
        uv_config.load()
        state = ServerState()
        loop = asyncio.get_running_loop()
        clients = []
        for i in range(PRODUCERS):
            client = Client(loop, f"/v1/stream/bench-small-{i:03d}", f"small-{i}")
            if stack == "bare":
                client.protocol = Bare(client)
            else:
                client.protocol = uv_config.http_protocol_class(  # type: ignore[call-arg]
                    config=uv_config, server_state=state, app_state={}
                )
                client.protocol.connection_made(client)
            client.protocol.data_received(put(client.path))
            client.expected = 1  # type: ignore[attr-defined]
            clients.append(client)
        await _settled(clients, time.monotonic() + 30)
        _start_serving()
        results = []
        for _ in range(rounds):
            for client in clients:
                client.stopped = False
                client.answers = 0
            collections = _CollectionTimes()
            gc.callbacks.append(collections)
            thread0, process0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
            for client in clients:
                client.send_next()
            await asyncio.sleep(seconds)
            for client in clients:
                client.stopped = True
            answered = sum(c.answers for c in clients)
            thread1, process1, wall1 = time.thread_time(), time.process_time(), time.perf_counter()
            gc.callbacks.remove(collections)
            for client in clients:
                client.expected = client.answers + 1  # type: ignore[attr-defined]
            await _settled(clients, time.monotonic() + 30)
            results.append(
                {
                    "loop_us": 1e6 * (thread1 - thread0) / answered,
                    "process_us": 1e6 * (process1 - process0) / answered,
                    "requests_per_s": answered / (wall1 - wall0),
                    "gc_us": 1e6 * collections.seconds / answered,
                    "gc_collections": collections.count,
                }
            )
        statuses: dict[str, int] = {}
        for client in clients:
            for status, count in client.statuses.items():
                statuses[status.decode()] = statuses.get(status.decode(), 0) + count
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await life
        return {"rounds": results, "statuses": statuses}
    finally:
        shutil.rmtree(data, ignore_errors=True)


def run_child(checkout: Path, stack: str, seconds: float, rounds: int) -> dict[str, Any]:
    argv = [__file__, "--child", stack, "--seconds", str(seconds), "--rounds", str(rounds)]
    return checkout_child(checkout, argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-src", type=Path, action="append", default=[])
    parser.add_argument("--stacks", default="bare,machinery,http,engine,full")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="counted seconds per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per process (median kept)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import uvloop

        print(json.dumps(uvloop.run(child(args.child, args.seconds, args.rounds))))
        return
    checkouts = [p.resolve() for p in args.server_src] or [Path(__file__).resolve().parents[1]]
    stacks = args.stacks.split(",")
    figures: dict[tuple[str, Path], list[float]] = {}
    for repeat in range(args.repeat):
        order = checkouts if repeat % 2 == 0 else checkouts[::-1]
        for stack in stacks:
            for checkout in order:
                result = run_child(checkout, stack, args.seconds, args.rounds)
                loop_us = statistics.median(r["loop_us"] for r in result["rounds"])
                gc_us = statistics.median(r["gc_us"] for r in result["rounds"])
                process_us = statistics.median(r["process_us"] for r in result["rounds"])
                rate = statistics.median(r["requests_per_s"] for r in result["rounds"])
                figures.setdefault((stack, checkout), []).append(loop_us)
                print(
                    f"{repeat} {stack:9} {checkout}: loop {loop_us:6.1f} us, process "
                    f"{process_us:6.1f} us per request (cyclic GC {gc_us:.1f} us), {rate:,.0f}/s, "
                    f"{result['statuses']}",
                    flush=True,
                )
    print("\nloop-thread CPU per request, median (min-max) over repeats:")
    for stack in stacks:
        row = []
        for checkout in checkouts:
            values = figures[(stack, checkout)]
            row.append(f"{statistics.median(values):6.1f} ({min(values):.1f}-{max(values):.1f})")
        line = f"  {stack:9} " + "  ".join(row)
        if len(checkouts) == 2:
            a, b = figures[(stack, checkouts[0])], figures[(stack, checkouts[1])]
            ratios = [y / x for x, y in zip(a, b, strict=True)]
            line += f"  paired ratio B/A median {statistics.median(ratios):.2f}"
        print(line)


if __name__ == "__main__":
    main()
