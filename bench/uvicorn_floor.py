"""A trivial uvicorn app: the floor under our server's figures for long-poll wake-ups and small appends.

The app has the long-poll shape and nothing else: a GET at the tail parks on a future, a POST wakes every
parked GET, and each answers with headers like our server's. No disk, no fsync, no protocol logic. The
client is ``server_bench.bench_longpoll``, so the figures compare directly with ``server_bench.py --only
longpoll``: what this app reaches on a machine is what uvicorn, the event loop and the client cost there.

A POST with producer headers is answered as our server answers an idempotent producer's append (200,
``Producer-Epoch``/``Producer-Seq``, ``Stream-Next-Offset`` and headers of the same size). ``server_bench.py
--only small`` starts this app itself, as a third server in the same rounds as ours and the reference.

Run: ``.venv/bin/python bench/uvicorn_floor.py [--events N] [--rounds N]``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server_bench as sb  # noqa: E402

_tail = [0]
_parked: list[asyncio.Future[None]] = []
_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"cross-origin"),
    (b"access-control-allow-origin", b"*"),
    (
        b"access-control-expose-headers",
        b"Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, ETag",
    ),
    (b"content-type", b"application/json"),
    (b"cache-control", b"no-store"),
]


# What our server puts on an append's answer besides the offset and producer headers.
_APPEND_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"sandbox"),
    (b"cross-origin-resource-policy", b"cross-origin"),
    (
        b"access-control-expose-headers",
        b"Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, ETag, Location",
    ),
    (b"durastream-extensions", b"bounded-read=1, message-frames=1, listing=1"),
    (b"vary", b"Origin"),
    (b"cache-control", b"no-store"),
]


def _offset(position: int) -> bytes:
    return f"0000000000000000_{position:016d}".encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Just enough of the protocol for ``bench_longpoll``: PUT, HEAD, POST, GET ?offset=&live=."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    method = scope["method"]
    headers = _HEADERS + [(b"stream-next-offset", _offset(_tail[0]))]
    if method == "POST" and any(name == b"producer-id" for name, _ in scope["headers"]):
        await _producer_append(scope, send, len(body))
        return
    if method == "POST":
        _tail[0] += len(body)
        woken, _parked[:] = list(_parked), []
        for future in woken:
            if not future.done():
                future.set_result(None)
        headers = _HEADERS + [(b"stream-next-offset", _offset(_tail[0]))]
    if method in ("PUT", "HEAD", "POST"):
        status = {"PUT": 201, "HEAD": 200, "POST": 204}[method]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return
    query = scope["query_string"].decode()
    position = int(query.split("offset=")[1].split("&")[0].split("_")[1])
    if position >= _tail[0]:
        future = asyncio.get_running_loop().create_future()
        _parked.append(future)
        await future
    payload = b'[{"event":' + b"0" * 100 + b"}]"
    headers = _HEADERS + [
        (b"stream-next-offset", _offset(_tail[0])),
        (b"stream-up-to-date", b"true"),
        (b"stream-cursor", b"1"),
        (b"etag", b'"floor"'),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _producer_append(scope: dict[str, Any], send: Any, size: int) -> None:
    """An idempotent producer's append (``server_bench.bench_small``), answered as our server does:
    200 with the producer's epoch and seq and the stream's next offset, and nothing written."""
    wanted = {b"producer-epoch": b"0", b"producer-seq": b"0"}
    for name, value in scope["headers"]:
        if name in wanted:
            wanted[name] = value
    _tail[0] += size
    headers = _APPEND_HEADERS + [
        (b"stream-next-offset", _offset(_tail[0])),
        (b"producer-epoch", wanted[b"producer-epoch"]),
        (b"producer-seq", wanted[b"producer-seq"]),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=sb.FULL.longpoll_events)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    sizes = dataclasses.replace(sb.FULL, longpoll_events=args.events)
    for round_no in range(args.rounds):
        busy = sb.wait_quiet(0.15, 120)
        port = sb.free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).parent)]
            + ["uvicorn_floor:app", "--port", str(port), "--loop", "uvloop", "--http", "httptools"]
            + ["--log-level", "warning", "--no-access-log"]
        )
        server = sb.Server.__new__(sb.Server)
        server.kind, server.port, server.proc = "floor", port, proc
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    sb.socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            result = asyncio.run(sb.bench_longpoll(server, sizes))
        finally:
            proc.kill()  # parked requests would stall a graceful shutdown
            proc.wait()
        shown = {k: round(v, 2) for k, v in result.items() if isinstance(v, float)}
        print(f"[floor round {round_no + 1}/{args.rounds}] cpu_busy_before={busy:.2f} {shown}")


if __name__ == "__main__":
    main()
