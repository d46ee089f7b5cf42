"""The served request around "one record a batch" (issue 16, decision 0012 step 2): CPU per stream.

``bench/onerecord_floor.py`` timed the engine and storage work of a batch's streams as ONE WAL record
(~5-7 us a stream). This times what a served request adds around it, bench-only, no product change:

In process, with the server's real functions (``http/bulk.py``), on bodies built as the connector
builds them (``durastream_spark/protocol/bulk.py``: ``commit_parts``, bulk-write 2, chunked by
``_chunks``: at most 10,000 parts, 8 MiB a request):

``dsr1_parse``  today's ``commits`` request read: ``_requests`` (the DSR1 framing, the JSON header, a
    ``bytes`` copy of each entry's body) and ``txn_entries``' pass over the entries before the engine
    (``_path``, ``check_scope``, ``SharedAppendHeaders.inline_parts``: an ``AppendRequest`` a part);
``dsr1_frame``  of ``dsr1_parse``, ``_requests`` alone (the rest is the per-entry pass);
``dsr1_answer``  today's answer of every part OK: ``StreamHandlers.append_answer`` a part, the
    ``{"status", "parts": [...]}`` entries, ``answer_body`` (msgspec) of the whole document;
``col_parse``  a columnar request as the one-record layout would take it (hand-written here): a magic,
    a u32 header length, a JSON header ``{"ledger", "batch", "content_type", "key", "paths": [...],
    "lengths": [...]}`` (the server's JSON parser), then the streams' bytes concatenated; read as the
    header, each path canonicalised and scope-checked (``_path``, ``check_scope``: a stream path is
    still checked per stream), the lengths checked and summed into offsets; the payload stays one
    ``memoryview`` (the record can be written from it: no copy a stream);
``col_paths``  of ``col_parse``, the per-path ``_path`` + ``check_scope`` alone (what is left per stream);
``col_answer``  the answer as one offsets table: ``answer_body({"next_offsets": [token, ...]})`` of the
    tokens ``onerecord_floor.py``'s ``settle`` already makes (so its ~1.5 us is not counted twice).

In a real server process (``--served``): a trivial uvicorn app (httptools, uvloop, as the server runs)
that reads the body as ``http/body.read_body`` does and answers a body of the given size, no protocol
work, but glibc's malloc thresholds fixed as ``cli.main`` fixes them (``allocator.keep_freed_memory``;
without it each ~1.4 MB body is a fresh ``mmap`` and the receive costs ~3-4x more): ``recv_dsr1`` /
``recv_col`` is the server's CPU (``/proc``) per stream for today's request bodies
with today's answer sizes / the columnar request and answer, ``--requests`` requests a measurement
(``/proc`` counts 10 ms ticks); ``--split-send`` adds today's bodies answered with nothing
(``recv_only``) and today's answers to empty requests (``send_only``). And ``ensure`` (``--ensure``): our real server (fsync durability), a bulk
``ensure`` (``create`` true) of ``--streams`` existing streams through the connector's ``BulkWrites``,
server CPU per stream: what a routed save's ensure costs when its streams exist.

Variants alternate in rotating order, ``--repeat`` runs; medians and ranges, per stream.

Run: ``.venv/bin/python bench/served_floor.py [--streams 10000] [--rows 10] [--repeat 4] [--served] [--ensure]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

ROW = json.dumps({"id": 123456, "name": "row-0000000", "pad": "x" * 60}).encode()  # ~100 B
COL_MAGIC = b"DSC1"


def _cpu() -> float:
    return time.process_time()


def _part(rows: int) -> bytes:
    return b"[" + b",".join([ROW] * rows) + b"]"


def dsr1_bodies(paths: list[str], rows: int, partitions: int) -> list[tuple[int, bytes]]:
    """Today's ``commits`` bodies of a transactional batch, as ``BulkWrites.commit_parts`` builds them
    (one entry a stream holding its partitions' parts, chunked by the connector's ``_chunks``):
    ``(entries, body)`` a request."""
    from durastream_spark.protocol.bulk import MAGIC, PARTS_HEADER, _chunks
    from durastream_spark.protocol.client import Producer, _producer_headers

    per = max(1, rows // partitions)
    bodies = [_part(per)] * partitions
    base = {
        "Content-Type": "application/json",
        "Durastream-Commit-Key": "durastream-spark.transactional",
        **_producer_headers(Producer("durastream-spark-w1234567-q", 3, 0), refuse_forgotten=True),
    }
    requests = []
    for path in paths:
        headers = dict(base)
        headers[PARTS_HEADER] = ",".join(f"-{p}:{len(b)}" for p, b in enumerate(bodies))
        requests.append((path, headers, b"".join(bodies)))
    out = []
    for first, last in _chunks([len(b) for _, _, b in requests], [partitions] * len(requests)):
        part = requests[first:last]
        header = json.dumps(
            {"requests": [{"path": p, "headers": h, "bytes": len(b)} for p, h, b in part]},
            separators=(",", ":"),
        ).encode()
        pieces = [MAGIC, len(header).to_bytes(4, "little"), header]
        pieces.extend(b for _, _, b in part)
        out.append((last - first, b"".join(pieces)))
    return out


def col_bodies(paths: list[str], rows: int, max_bytes: int) -> list[tuple[int, bytes]]:
    """The columnar request (hand-written, bench-only): one header naming the batch once and the
    streams as two lists, then every stream's bytes (its partitions' rows as one JSON array, as
    decision 0012's driver merges them), at most ``max_bytes`` of payload a request."""
    body = _part(rows)
    out = []
    step = max(1, max_bytes // len(body))
    for first in range(0, len(paths), step):
        part = paths[first : first + step]
        header = json.dumps(
            {
                "ledger": "durastream-spark-w1234567-q",
                "batch": 3,
                "content_type": "application/json",
                "key": "durastream-spark.transactional",
                "paths": part,
                "lengths": [len(body)] * len(part),
            },
            separators=(",", ":"),
        ).encode()
        out.append(
            (len(part), COL_MAGIC + len(header).to_bytes(4, "little") + header + body * len(part))
        )
    return out


class InProcess:
    """The request's parse and answer, today's and the columnar one, with the server's functions."""

    def __init__(self) -> None:
        from durastream_server.http.handlers import Request

        async def nothing(*_: Any) -> Any:
            return None

        self.request = Request(
            method="POST",
            raw_path=b"/v1/stream/__ds/x-durastream/commits",
            query_string=b"",
            headers={},
            scheme="http",
            server=None,
            receive=nothing,
            send=nothing,
        )

    @staticmethod
    async def dsr1_frame(body: bytes) -> list[Any]:
        """``read_requests`` after the receive: the framing, the JSON header, the entries."""
        from durastream_server.http import bulk

        return await bulk._requests(body)

    def dsr1_entries(self, entries: list[Any]) -> list[Any]:
        """``txn_entries``' pass over the entries before the engine."""
        from durastream_server.http import bulk

        shared = bulk.SharedAppendHeaders()
        request = self.request
        inline = []
        for index, (raw_path, headers, entry_body) in enumerate(entries):
            assert bulk._is_inline_commit(headers)
            path = bulk._path(raw_path, f"requests[{index}].path")
            bulk.check_scope(request, path)
            appends = shared.inline_parts(path, headers, entry_body, index)
            inline.extend((index, append) for append in appends)
        return inline

    @staticmethod
    def dsr1_answer(inline: list[Any], outcomes: list[Any], entries: int) -> bytes:
        """``txn_entries``' answers after the engine, every part OK, and ``answer_body``."""
        from durastream_server.http import bulk
        from durastream_server.http.handlers import StreamHandlers

        results: list[dict[str, Any]] = [{}] * entries
        for index in range(entries):
            results[index] = {"status": 200, "parts": []}
        for (index, append), outcome in zip(inline, outcomes, strict=True):
            status, answer = StreamHandlers.append_answer(append, outcome)
            results[index]["parts"].append({"status": status, "headers": dict(answer)})
        return bulk.answer_body({"results": results})

    async def col_parse(self, body: bytes) -> tuple[list[str], list[int], memoryview]:
        from durastream_server.errors import BadRequest
        from durastream_server.http import bulk
        from durastream_server.http.body import parse_json

        if len(body) < 8 or body[:4] != COL_MAGIC:
            raise BadRequest("not a columnar body")
        size = int.from_bytes(body[4:8], "little")
        header = await parse_json(body[8 : 8 + size], "a columnar header")
        raw_paths, lengths = header["paths"], header["lengths"]
        if not isinstance(raw_paths, list) or not isinstance(lengths, list):
            raise BadRequest("paths and lengths must be lists")
        if len(raw_paths) != len(lengths):
            raise BadRequest("paths and lengths differ in length")
        request = self.request
        path_of = bulk._path
        paths = []
        for index, raw in enumerate(raw_paths):
            path = path_of(raw, f"paths[{index}]")
            bulk.check_scope(request, path)
            paths.append(path)
        table = array("q", lengths)  # ints only (TypeError otherwise); negatives checked below
        if min(table) <= 0:
            raise BadRequest("every length must be positive")
        starts = list(itertools.accumulate(table, initial=0))
        payload = memoryview(body)[8 + size :]
        if starts[-1] != len(payload):
            raise BadRequest("the lengths must add up to the payload")
        return paths, starts, payload

    def col_paths(self, raw_paths: list[str]) -> None:
        from durastream_server.http import bulk

        request = self.request
        for index, raw in enumerate(raw_paths):
            bulk.check_scope(request, bulk._path(raw, f"paths[{index}]"))

    @staticmethod
    def col_answer(tokens: list[str]) -> bytes:
        from durastream_server.http import bulk

        return bulk.answer_body({"status": 200, "next_offsets": tokens})


async def in_process(args: argparse.Namespace) -> dict[str, list[float]]:
    from durastream_server.engine.api import AppendResult
    from durastream_server.offsets import format_offset

    n = args.streams
    paths = [f"t/s{i:06d}" for i in range(n)]
    dsr1 = dsr1_bodies(paths, args.rows, args.partitions)
    col = col_bodies(paths, args.rows, args.max_bytes)
    print(
        f"dsr1: {len(dsr1)} requests of {[len(b) for _, b in dsr1]} bytes; "
        f"columnar: {len(col)} of {[len(b) for _, b in col]} bytes",
        flush=True,
    )
    proto = InProcess()
    tail = 1_000_000
    tokens = [format_offset(tail + i) for i in range(n)]
    outcomes_of = [
        [AppendResult(next_offset=tokens[0], closed=False)] * (entries * args.partitions)
        for entries, _ in dsr1
    ]
    figures: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    gc.collect()
    gc.freeze()  # as the server does once it listens

    def keep(spent: dict[str, float], name: str, answer_bytes: int) -> None:
        for key, seconds in spent.items():
            figures.setdefault(key, []).append(seconds / n * 1e6)
        sizes[name] = answer_bytes

    async def today() -> None:
        spent = dict.fromkeys(("dsr1_parse", "dsr1_frame", "dsr1_answer"), 0.0)
        total = 0
        for (entries, body), outcomes in zip(dsr1, outcomes_of, strict=True):
            c0 = _cpu()
            entries_read = await proto.dsr1_frame(body)
            cf = _cpu()
            inline = proto.dsr1_entries(entries_read)
            c1 = _cpu()
            total += len(proto.dsr1_answer(inline, outcomes, entries))
            spent["dsr1_frame"] += cf - c0
            spent["dsr1_parse"] += c1 - c0
            spent["dsr1_answer"] += _cpu() - c1
        keep(spent, "dsr1_answer_bytes", total)

    async def columnar() -> None:
        spent = dict.fromkeys(("col_parse", "col_paths", "col_answer"), 0.0)
        total = at = 0
        for entries, body in col:
            c0 = _cpu()
            got, _, _ = await proto.col_parse(body)
            c1 = _cpu()
            proto.col_paths(got)
            c2 = _cpu()
            total += len(proto.col_answer(tokens[at : at + entries]))
            at += entries
            spent["col_parse"] += c1 - c0
            spent["col_paths"] += c2 - c1
            spent["col_answer"] += _cpu() - c2
        keep(spent, "col_answer_bytes", total)

    for rep in range(args.repeat):
        steps = [today, columnar] if rep % 2 == 0 else [columnar, today]
        for step in steps:
            await step()
        row = {k: round(v[-1], 2) for k, v in figures.items()}
        print(f"in-process run {rep}: {row} load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"answer bytes: {sizes}", flush=True)
    args.answer_sizes = sizes
    return figures


# ---- the served receive: a trivial uvicorn app ---------------------------------------------------


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the body as ``http/body.read_body`` does, answers ``x-answer-bytes`` bytes of JSON-ish
    filler: uvicorn's and httptools' share of a bulk request, no protocol work."""
    if scope["type"] == "lifespan":
        # As our server's entry point (cli.main) does: fixed malloc thresholds, so a ~1-8 MB body
        # comes from the heap, not a fresh mmap a request (~1.2-1.5 us a stream of page faults more).
        from durastream_server.allocator import keep_freed_memory

        keep_freed_memory()
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    chunks = []
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    size = 0
    for name, value in scope["headers"]:
        if name == b"x-answer-bytes":
            size = int(value)
    answer = b"x" * size
    headers = [
        (b"content-type", b"application/json"),
        (b"cache-control", b"no-store"),
        (b"content-length", str(len(answer)).encode()),
        (b"x-got", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served(args: argparse.Namespace, figures: dict[str, list[float]]) -> None:
    from listing_bench import server_cpu_seconds

    n = args.streams
    paths = [f"t/s{i:06d}" for i in range(n)]
    shapes = {
        "recv_dsr1": (
            dsr1_bodies(paths, args.rows, args.partitions),
            args.answer_sizes["dsr1_answer_bytes"],
        ),
        "recv_col": (
            col_bodies(paths, args.rows, args.max_bytes),
            args.answer_sizes["col_answer_bytes"],
        ),
    }
    if args.split_send:  # today's request bodies answered with nothing; today's answers alone
        dsr1 = shapes["recv_dsr1"][0]
        shapes["recv_only"] = (dsr1, 0)
        shapes["send_only"] = ([(entries, b"") for entries, _ in dsr1], shapes["recv_dsr1"][1])
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).parent)]
        + ["served_floor:app", "--port", str(port), "--loop", "uvloop", "--http", "httptools"]
        + ["--log-level", "warning", "--no-access-log"]
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for rep in range(args.repeat):
            names = list(shapes)
            names = names[rep % len(names) :] + names[: rep % len(names)]
            for name in names:
                bodies, answer_bytes = shapes[name]
                cpu0 = server_cpu_seconds(proc.pid)
                for _ in range(args.requests):
                    for entries, body in bodies:
                        share = answer_bytes * entries // n
                        headers = {"x-answer-bytes": str(share)}
                        conn.request("POST", "/", body=body, headers=headers)
                        reply = conn.getresponse()
                        got = reply.read()
                        assert reply.status == 200 and len(got) == share, reply.status
                        assert int(reply.headers["x-got"]) == len(body)
                spent = server_cpu_seconds(proc.pid) - cpu0
                figures.setdefault(name, []).append(spent / (n * args.requests) * 1e6)
            row = {k: round(v[-1], 2) for k, v in figures.items() if k.startswith("recv")}
            print(f"served run {rep}: {row} load {os.getloadavg()[0]:.1f}", flush=True)
        conn.close()
    finally:
        proc.terminate()
        proc.wait()


def ensure(args: argparse.Namespace, figures: dict[str, list[float]]) -> None:
    """A bulk ``ensure`` of existing streams against our real server: its CPU per stream."""
    from listing_bench import server_cpu_seconds

    from durastream_spark.protocol.bulk import BulkWrites
    from durastream_spark.protocol.client import StreamClient
    from durastream_spark.sink.options import SinkOptions
    from tests.support.server_process import ServerProcess

    with tempfile.TemporaryDirectory(prefix="served-floor-") as tmp:
        server = ServerProcess(Path(tmp) / "data")
        server.start()
        try:
            options = SinkOptions.parse(
                {"url": server.base_url + "/v1/stream", "contentType": "application/json"}
            )
            client = StreamClient(options.connection)
            bulk = BulkWrites(client, "application/json")
            paths = [f"e/s{i:06d}" for i in range(args.streams)]
            bulk.ensure(paths, create=True)  # they exist from here on
            for rep in range(args.repeat):
                cpu0 = server_cpu_seconds(server.pid)
                got = bulk.ensure(paths, create=True)
                spent = server_cpu_seconds(server.pid) - cpu0
                bad = [g for g in got if isinstance(g, Exception)]
                assert not bad, bad[:3]
                figures.setdefault("ensure", []).append(spent / args.streams * 1e6)
                print(f"ensure run {rep}: {figures['ensure'][-1]:.1f} us a stream", flush=True)
        finally:
            server.stop()


def _summary(figures: dict[str, list[float]]) -> None:
    for key, values in figures.items():
        print(
            f"{key:>12}: median {statistics.median(values):6.2f} us a stream "
            f"(range {min(values):.2f}-{max(values):.2f}, n={len(values)})"
        )

    def med(*keys: str) -> float:
        return sum(statistics.median(figures[k]) for k in keys if k in figures)

    print(
        f"  today's request around the engine (dsr1_parse + dsr1_answer + recv_dsr1): "
        f"{med('dsr1_parse', 'dsr1_answer', 'recv_dsr1'):.2f} us a stream"
    )
    print(
        f"  columnar (col_parse + col_answer + recv_col): "
        f"{med('col_parse', 'col_answer', 'recv_col'):.2f} us a stream"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=10, help="rows of ~100 B a stream")
    parser.add_argument("--partitions", type=int, default=2, help="parts a stream (today's shape)")
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument(
        "--max-bytes", type=int, default=8 * 1024 * 1024, help="columnar payload a request"
    )
    parser.add_argument("--served", action="store_true", help="time uvicorn's receive and send")
    parser.add_argument("--requests", type=int, default=5, help="batches a served measurement")
    parser.add_argument("--ensure", action="store_true", help="time a bulk ensure (real server)")
    parser.add_argument(
        "--split-send", action="store_true", help="also today's receive and answer apart"
    )
    args = parser.parse_args()
    import uvloop

    print("load average before:", os.getloadavg(), flush=True)
    uvloop.install()
    figures = asyncio.run(in_process(args))
    gc.unfreeze()
    if args.served:
        served(args, figures)
    if args.ensure:
        ensure(args, figures)
    print("load average after:", os.getloadavg())
    _summary(figures)


if __name__ == "__main__":
    main()
