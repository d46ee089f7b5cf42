"""The floor of "a batch's streams as ONE record" (issue 16, decision 0012 step 2): in-process CPU per stream.

No HTTP, no product change: a bench-only prototype of the pieces such a layout would need, timed against
today's ``Engine.append_batch`` of the same shape, in one process on uvloop (as the server runs), on a
``DataDir`` with fsync durability and packed appends (decision 0010 step 2: the routed sink's usual
target). ``--streams`` existing packed streams (created, then one warm-up batch each, so each has its
extents), ``--rows`` rows of ~100 B a stream; the reference is the same rows to ONE stream.

Pieces, CPU per stream (``time.process_time``: every thread, the commit thread's round included):

``today``  ``Engine.append_batch`` of one plain append a stream (no producer, no key), awaited until
    every entry is settled (the round written, synced, noted, answered); ``--ctype`` JSON streams pay
    the JSON split, octet-stream ones do not;
``one``  the reference: the same rows to one stream, ``append_batch`` of ~1 MiB plain appends;
``lookup``  per stream, what the request must still do whatever the layout: ``_append_target`` (the
    stream's lookup, its content type) and the closed check;
``split``  (JSON streams) per stream, ``jsonmode.split_messages`` of its rows, as today's append does;
``carry``  not a piece: the process's CPU in the ``--pause`` after ``today`` (the idle checkpoint
    carrying its packed records into packs), what "settled" adds today;
``record``  one WAL entry holding every stream's bytes: one ``join``, one CRC (the WAL's own, in
    ``WalFile.append``), written and ``fdatasync``-ed into a real WAL file (``Kind.PACKED_RECORDS``);
``index``  per stream, the least index work the layout needs, with the real functions on copies of
    each stream's objects: ``Extents.add`` of its slice of the record, the pack book's note of it
    (``PackBook.wrote``), ``SparseIndex.note`` of the record start, the state's tail, entries, time;
``pcarry``  not in the floor: the checkpoint's least work for that entry (read back, written whole
    into a pack file and synced, each stream's extent relocated), against ``carry``;
``settle``  per stream, the answer as one loop over arrays: durable tail and count, the offset token
    (``format_offset``), the ``AppendResult``, and the entry's bulk answer.

What it leaves out (so it is a floor, not an estimate): recovery (a replay splitting the entry back
into streams), readers of a stream whose bytes sit inside another entry (``packview`` reads extents, so
that is mostly free, but frames a reader must skip are not designed), the checkpoint beyond
``pcarry`` (the pack's sidecar and index, the WAL file's removal, merges), per-stream record frames (a reader needs message boundaries: ``--frames`` times
today's ``encode_append`` per stream as an extra piece), the JSON split (done once over the request it
is timed, per stream), observers (``on_appended``), the HTTP request and answer bytes.

Variants alternate (``today`` and the prototype pieces in rotating order), ``--repeat`` runs; medians and
ranges are printed, with ``(lookup + record + index + settle)`` against ``today`` and the budget.

Run: ``.venv/bin/python bench/onerecord_floor.py [--streams 10000] [--rows 10] [--repeat 4] [--frames]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import tempfile
import time
from array import array
from pathlib import Path

import uvloop

from durastream_server.engine import jsonmode
from durastream_server.engine.api import AppendRequest, AppendResult, CreateRequest
from durastream_server.engine.engine import Engine
from durastream_server.offsets import format_offset
from durastream_server.storage.codec import encode_append
from durastream_server.storage.datadir import DataDir, Durability, StorageConfig
from durastream_server.storage.extents import IN_PACK, IN_WAL, Extents, records_offsets
from durastream_server.storage.index import SparseIndex
from durastream_server.storage.records import AppendEntry
from durastream_server.storage.state import StreamState
from durastream_server.storage.wal import Kind, WalEntry, WalFile

ROW = json.dumps({"id": 123456, "name": "row-0000000", "pad": "x" * 60}).encode()  # ~100 B
BUDGET_US = 21.0  # issue 16: <= 3x the one-stream save, ~21 us a stream for everything


def _cpu() -> float:
    return time.process_time()


class Prototype:
    """The one-record layout's pieces over ``streams`` (bench-only: copies, never the engine's logs)."""

    def __init__(self, engine: Engine, paths: list[str], ctype: str, wal_dir: Path) -> None:
        self.engine = engine
        self.paths = paths
        self.ctype = ctype
        self.wal_dir = wal_dir
        self.generation = 1_000_000  # never one of the data directory's
        # A WAL file of its own, made untimed: a round appends to the current file.
        self.wal = WalFile.create(wal_dir, self.generation)
        logs = [engine._lookup(p).log for p in paths]
        self.ids = [log.id for log in logs]
        # Copies of each stream's extents, index and state, made untimed: the timed pieces call the
        # real functions on them without touching the engine's streams.
        self.extents = []
        for log in logs:
            copy = Extents()
            a = log.extents._a  # type: ignore[union-attr]
            copy._a = array(a.typecode, a)
            self.extents.append(copy)
        self.ends = [log._file_end for log in logs]
        self.sparse = [SparseIndex(log._index.sparse.interval) for log in logs]
        self.states = [StreamState(tail=log.state.tail) for log in logs]
        self.packs = engine._data._committer.packs

    def lookup(self, requests: list[AppendRequest]) -> None:
        target = self.engine._append_target
        for request in requests:
            inc, _ = target(request)
            if inc.log.state.closed:
                raise AssertionError("closed")

    def split(self, bodies: list[bytes]) -> None:
        """A JSON stream's rows are still split (validated, their boundaries found) per stream."""
        split = jsonmode.split_messages
        for body in bodies:
            split(body, allow_empty_array=False, views=True)

    def rotate(self) -> None:
        """A new WAL file for the next batch (untimed): ``carry`` then moves one file's entry."""
        self.generation += 1
        self.wal = WalFile.create(self.wal_dir, self.generation)

    def record(self, bodies: list[bytes]) -> tuple[int, list[int]]:
        """One entry of every stream's bytes: join, the WAL's CRC, pwrite, fdatasync. Returns where
        the bytes start in the WAL file and each stream's slice start inside them."""
        starts = []
        at = 0
        for body in bodies:
            starts.append(at)
            at += len(body)
        entry = WalEntry("batch", 0, 0, [b"".join(bodies)], Kind.PACKED_RECORDS)
        wal = self.wal
        base = wal.end
        wal.append([entry])
        self.last = (records_offsets([entry], base, [at])[0], at, starts)
        return self.last[0], starts

    def carry(self, bodies: list[bytes]) -> None:
        """The checkpoint's least work for the entry: read it back from the WAL file, write it whole
        into a pack file and sync it, then relocate each stream's extent there (``Extents.relocate``,
        as ``PackBook.carried_out`` does; the pack's sidecar, index and the WAL's removal are not)."""
        at, length, starts = self.last
        data = os.pread(self.wal.fd, length, at)
        pack = self.wal_dir / f"pack-{self.generation}"
        fd = os.open(pack, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        generation = self.generation
        for i, start in enumerate(starts):
            position = self.positions[i]
            self.extents[i].relocate(
                IN_WAL,
                generation,
                [(start, len(bodies[i]), position)],
                (IN_PACK, generation),
                known_only=True,
            )
        assert (IN_PACK, generation) in self.extents[0].files(), "not relocated"

    def index(self, base: int, starts: list[int], bodies: list[bytes], rows: int, now: int) -> None:
        packs = self.packs
        generation = self.generation
        self.positions = list(self.ends)
        for i, start in enumerate(starts):
            length = len(bodies[i])
            end = self.ends[i]
            extents = self.extents[i]
            extents.add(IN_WAL, generation, base + start, length, end)
            self.ends[i] = end + length
            if packs is not None:
                packs.wrote(self.ids[i], extents, generation)
            state = self.states[i]
            self.sparse[i].note(state.tail, end, rows, now)
            state.tail += length
            state.entries += 1
            if now > state.last_timestamp_ms:
                state.last_timestamp_ms = now

    def settle(self) -> list[dict]:
        answers = []
        for state in self.states:
            token = format_offset(state.tail)
            result = AppendResult(next_offset=token, closed=False)
            answers.append({"status": 200, "next_offset": result.next_offset})
        return answers


async def _existing(engine: Engine, prefix: str, count: int, ctype: str) -> list[str]:
    paths = [f"{prefix}/s{i:06d}" for i in range(count)]
    queue = iter(paths)

    async def worker() -> None:
        for path in queue:
            await engine.create(CreateRequest(path=path, content_type=ctype))

    await asyncio.gather(*(worker() for _ in range(64)))
    return paths


def _body(rows: int) -> bytes:
    return b"[" + b",".join([ROW] * rows) + b"]"


async def _today(engine: Engine, paths: list[str], ctype: str, body: bytes) -> float:
    requests = [AppendRequest(path=p, content_type=ctype, body=body) for p in paths]
    cpu = _cpu()
    batch = engine.append_batch(requests)
    await batch.all_done
    spent = _cpu() - cpu
    bad = [o for o in batch.outcomes if isinstance(o, BaseException)]
    assert not bad, bad[:3]
    return spent


async def _run(args: argparse.Namespace) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="onerecord-") as root:
        config = StorageConfig(
            root=Path(root) / "data", durability=Durability.FSYNC, packed_appends=True
        )
        data = await DataDir.open(config)
        engine = Engine(data, sweep_interval=0)
        await engine.start()
        proto = None
        try:
            ctype = args.ctype
            body = _body(args.rows)
            n = args.streams
            paths = await _existing(engine, "t", n, ctype)
            await _today(engine, paths, ctype, body)  # warm-up: every stream has its extents
            proto_paths = await _existing(engine, "p", n, ctype)
            await _today(engine, proto_paths, ctype, body)
            (one,) = await _existing(engine, "o", 1, ctype)
            total = n * args.rows
            per = max(1, (1 << 20) // len(ROW))
            chunks = [_body(per)] * (total // per) + ([_body(total % per)] if total % per else [])
            wal_dir = Path(root) / "proto-wal"
            wal_dir.mkdir()
            proto = Prototype(engine, proto_paths, ctype, wal_dir)
            requests = [AppendRequest(path=p, content_type=ctype, body=body) for p in proto_paths]
            bodies = [body] * n
            frames = [
                AppendEntry(position=0, messages=(body,), timestamp_ms=1_700_000_000_000)
                for _ in range(n)
            ]

            gc.collect()
            gc.freeze()  # as the server does once it listens (server.py)

            def proto_once() -> dict[str, float]:
                got = {}
                proto.rotate()
                c0 = _cpu()
                proto.lookup(requests)
                if ctype == "application/json":
                    c = _cpu()
                    proto.split(bodies)
                    got["split"] = _cpu() - c
                    c0 += got["split"]
                c1 = _cpu()
                base, starts = proto.record(bodies)
                c2 = _cpu()
                proto.index(base, starts, bodies, args.rows, int(time.time() * 1000))
                c3 = _cpu()
                answers = proto.settle()
                c4 = _cpu()
                assert len(answers) == n
                c5 = _cpu()
                proto.carry(bodies)
                got["pcarry"] = _cpu() - c5
                proto.wal.remove()
                got.update(lookup=c1 - c0, record=c2 - c1, index=c3 - c2, settle=c4 - c3)
                if args.frames:
                    c5 = _cpu()
                    for entry in frames:
                        encode_append(entry)
                    got["frames"] = _cpu() - c5
                return got

            for rep in range(args.repeat):
                steps = ["today", "proto", "one"]
                steps = steps[rep % 3 :] + steps[: rep % 3]
                for step in steps:
                    await asyncio.sleep(args.pause)  # the idle checkpoint runs outside the timings
                    if step == "today":
                        spent = await _today(engine, paths, ctype, body)
                        figures.setdefault("today", []).append(spent / n * 1e6)
                        cpu = _cpu()  # the idle checkpoint carrying today's records into packs
                        await asyncio.sleep(args.pause)
                        figures.setdefault("carry", []).append((_cpu() - cpu) / n * 1e6)
                    elif step == "one":
                        requests_one = [
                            AppendRequest(path=one, content_type=ctype, body=c) for c in chunks
                        ]
                        cpu = _cpu()
                        batch = engine.append_batch(requests_one)
                        await batch.all_done
                        figures.setdefault("one", []).append((_cpu() - cpu) / n * 1e6)
                    else:
                        for key, spent in proto_once().items():
                            figures.setdefault(key, []).append(spent / n * 1e6)
                row = {k: round(v[-1], 1) for k, v in figures.items()}
                print(
                    f"run {rep} ({' '.join(steps)}): {row} load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        finally:
            await engine.close()
            await data.close()
    return figures


def _summary(figures: dict[str, list[float]]) -> None:
    def med(key: str) -> float:
        return statistics.median(figures[key])

    for key, values in figures.items():
        print(
            f"{key:>8}: median {med(key):6.1f} us a stream (range {min(values):.1f}-{max(values):.1f})"
        )
    pieces = [k for k in ("lookup", "split", "record", "index", "settle") if k in figures]
    floors = [sum(figures[k][i] for k in pieces) for i in range(len(figures["today"]))]
    ratios = [f / t for f, t in zip(floors, figures["today"], strict=True)]
    floor = statistics.median(floors)
    print(
        f"   floor: {' + '.join(pieces)} = {floor:.1f} us a stream (range {min(floors):.1f}-"
        f"{max(floors):.1f}); x today {statistics.median(ratios):.2f} ({min(ratios):.2f}-"
        f"{max(ratios):.2f}); x budget {floor / BUDGET_US:.2f}; x one {floor / med('one'):.1f}"
    )
    top = max(pieces, key=med)
    print(f"   largest piece: {top} ({med(top) / floor:.0%} of the floor)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--ctype", default="application/json")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds idle before each step")
    parser.add_argument("--frames", action="store_true", help="time a record frame per stream too")
    args = parser.parse_args()
    print("load average before:", os.getloadavg(), flush=True)
    uvloop.install()
    figures = asyncio.run(_run(args))
    print("load average after:", os.getloadavg())
    _summary(figures)


if __name__ == "__main__":
    main()
