"""Measure what idempotent producer state costs (docs/decisions/0005-producer-state.md, issue 14 item 5).

Two parts, both in one process against the real storage and engine:

1. ``memory``: ``--streams`` streams (10,000) with ``--per-stream`` producers each (100: 1 M in all), each
   producer one request (``spark-<query>-<n>``, epoch 3, seq 0: the Spark sink's transactional commit).
   Prints the RSS after the streams are created, after every producer wrote, after the producers went
   quiet (compacted) and after they were forgotten (a fake clock moves past the flags' defaults;
   ``sweep_producers`` runs as the server's background task would); then ``--rounds`` more times with a
   new query's producers, which shows whether the memory is reused. RSS is read after ``gc.collect()``
   and glibc's ``malloc_trim(0)``. ``durability=none``: the disk is not what is measured. With
   ``PYTHONPATH=<main>/server`` (before this change) it runs one round without sweeps.
2. ``snapshot``: one stream's state with ``--producers`` producers (6,000, issue 14's case; then 100,000
   and 1,000,000), each with one 24-byte digest. Times what a snapshot costs the event loop: ``capture``
   (the only part on the loop now) and, for comparison, the encoding (now in a worker thread). While the
   worker encodes, a probe on the loop measures its worst stall (the GIL is shared). With
   ``PYTHONPATH=<main>/server`` (a checkout before this change), it times the old path instead, which
   ran ``state_to_dict`` and ``encode_snapshot`` both on the loop.

3. ``state``: the Python heap one producer's state takes (``tracemalloc``), with 1 and 64 requests in its
   epoch, active, quiet and forgotten; with ``PYTHONPATH=<main>/server``, as before this change.
4. ``server``: the ``memory`` figure from a real server process. The producers are written in this process
   through the engine (``append_nowait``, ``durability=none``, every producer's request stamped with one
   clock reading, so they all go quiet together); then ``durastream-server`` is started on that data
   directory (``bench/scale_bench.py``'s ``ScaleServer``) with ``--producer-quiet-seconds`` and
   ``--producer-expiry-seconds`` chosen from how long the build took, so the RSS is read with every
   producer active, then quiet (compacted), then forgotten, then after a restart. The baseline, in the same
   run: a server on a data directory with the same streams and no producers.
5. ``aborts``: issue 14 item 6's case, ``--requests`` (70) aborts of ``--names`` (3,000) names each that
   the stream never staged (210,000 in all), on one stream. Prints the RSS and Python heap growth
   (``tracemalloc``) and how many names the stream still fences; with ``PYTHONPATH=<main>/server``, as
   before this change (every name tombstoned for 7 days).

Run: ``python bench/producer_state_bench.py memory [--streams 10000 --per-stream 100]``
     ``python bench/producer_state_bench.py snapshot [--producers 6000 100000 1000000]``
     ``python bench/producer_state_bench.py state [--producers 100000 --seqs 1 64]``
     ``python bench/producer_state_bench.py server [--streams 10000 --per-stream 100]``
     ``python bench/producer_state_bench.py aborts [--requests 70 --names 3000]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import re
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from durastream_server.engine.api import AppendRequest, CreateRequest
from durastream_server.engine.engine import Engine
from durastream_server.engine.txnapi import AbortRequest
from durastream_server.storage import DataDir, Durability, StorageConfig
from durastream_server.storage import snapshot as snap
from durastream_server.storage.index import SparseIndex
from durastream_server.storage.records import AppendEntry, ProducerTuple
from durastream_server.storage.state import StreamState, apply_entry

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_bench import ScaleServer  # noqa: E402

MIB = 1024 * 1024
DIGEST = bytes(range(24))


def _rss_mib() -> float:
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / MIB


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def memory(streams: int, per_stream: int, rounds: int) -> None:
    clock = FakeClock()
    with tempfile.TemporaryDirectory(dir=".") as root:
        data = await DataDir.open(StorageConfig(root=Path(root), durability=Durability.NONE))
        engine = Engine(data, clock=clock, sweep_interval=0)
        await engine.start()
        base = _rss_mib()
        print(f"RSS at start: {base:.0f} MiB")
        paths = [f"s{s}" for s in range(streams)]
        for path in paths:
            await engine.create(CreateRequest(path=path, content_type="text/plain"))
        created = _rss_mib()
        print(f"{streams} streams created: {created:.0f} MiB (+{created - base:.0f})")
        total = streams * per_stream
        sweep = getattr(engine, "sweep_producers", None)
        for round_ in range(rounds if sweep is not None else 1):
            query = f"{round_:08x}-0d1c-4e55-9a7b-2c1d5e8f9a01"  # a new query each round
            started = time.perf_counter()
            for n in range(per_stream):
                for at in range(0, streams, 500):  # 500 streams at once: their appends overlap
                    await asyncio.gather(
                        *(
                            _produce(engine, path, f"spark-{query}-{n}", epoch=3)
                            for path in paths[at : at + 500]
                        )
                    )
            took = time.perf_counter() - started
            active = _rss_mib()
            print(
                f"round {round_ + 1}: {total:,} new producers ({per_stream} per stream) written in "
                f"{took:.0f} s: {active:.0f} MiB (+{active - created:.0f} over the streams); Python "
                f"blocks in use: {sys.getallocatedblocks():,}"
            )
            if sweep is None:
                break
            policy = engine.producer_policy
            clock.now += policy.quiet_seconds + 1
            counts, took, worst = await _timed(sweep())
            quiet = _rss_mib()
            print(
                f"  quiet: {counts.compacted:,} compacted by a {took:.1f} s sweep (longest slice "
                f"{worst * 1000:.1f} ms): {quiet:.0f} MiB (+{quiet - created:.0f}); Python blocks in "
                f"use: {sys.getallocatedblocks():,}"
            )
            clock.now += policy.expiry_seconds
            counts, took, worst = await _timed(sweep())
            forgotten = _rss_mib()
            print(
                f"  expired: {counts.forgotten:,} forgotten by a {took:.1f} s sweep (longest slice "
                f"{worst * 1000:.1f} ms): {forgotten:.0f} MiB (+{forgotten - created:.0f}); Python "
                f"blocks in use: {sys.getallocatedblocks():,}"
            )
        await engine.close()
        await data.close()


async def _build(root: Path, streams: int, per_stream: int) -> tuple[float, float]:
    """``streams`` text streams (``s0`` ...) with ``per_stream`` producers each, one request per producer,
    written through the engine in this process with every request stamped ``stamp`` (one clock reading).
    Returns (stamp, seconds the build took)."""
    stamp = time.time()
    data = await DataDir.open(StorageConfig(root=root, durability=Durability.NONE))
    engine = Engine(data, clock=lambda: stamp, sweep_interval=0)
    await engine.start()
    started = time.perf_counter()
    paths = [f"s{s}" for s in range(streams)]
    for path in paths:
        await engine.create(CreateRequest(path=path, content_type="text/plain"))
    query = "00000000-0d1c-4e55-9a7b-2c1d5e8f9a01"
    for at in range(0, streams, 100):  # 100 streams' producers staged at once, then awaited
        await asyncio.gather(
            *(
                engine.append_nowait(
                    AppendRequest(
                        path=path,
                        content_type="text/plain",
                        body=b"x",
                        producer=ProducerTuple(f"spark-{query}-{n}", 3, 0),
                    )
                )
                for path in paths[at : at + 100]
                for n in range(per_stream)
            )
        )
    await engine.close()
    await data.close()
    return stamp, time.perf_counter() - started


def _metric(server: ScaleServer, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else -1.0


def _ready(server: ScaleServer) -> float:
    """Seconds from now until ``/healthz`` answers and no stream is waiting to be recovered."""
    started = time.perf_counter()
    server.wait_healthy()
    while (server.health() or {}).get("streams_pending", 0):
        time.sleep(0.1)
    return time.perf_counter() - started


def _swept(server: ScaleServer, word: str, total: int, timeout: float) -> float:
    """Wait until the server's log says ``total`` producers were ``word`` (compacted/forgotten);
    returns the seconds waited."""
    started = time.perf_counter()
    pattern = re.compile(rf"(\d+) {word} \(")
    while time.perf_counter() - started < timeout:
        done = sum(int(m) for m in pattern.findall(server.log_path.read_text(errors="replace")))
        if done >= total:
            return time.perf_counter() - started
        time.sleep(0.5)
    raise RuntimeError(f"the server did not report {total:,} producers {word} in {timeout:g} s")


def _mib(server: ScaleServer) -> float:
    time.sleep(2)  # let the last sweep's slices and the allocator settle
    return server.rss() / MIB


def server_memory(streams: int, per_stream: int, margin: float, keep: bool) -> None:
    total = streams * per_stream
    workdir = Path(tempfile.mkdtemp(prefix="producer-bench-", dir="."))
    try:
        baseline_dir, data_dir = workdir / "streams-only", workdir / "data"
        asyncio.run(_build(baseline_dir, streams, 0))
        stamp, took = asyncio.run(_build(data_dir, streams, per_stream))
        print(f"built {streams:,} streams x {per_stream} producers ({total:,}) in {took:.0f} s")
        base = ScaleServer(baseline_dir, None, ["--durability", "none"])
        base.spawn()
        ready = _ready(base)
        baseline = _mib(base)
        base.stop()
        print(
            f"baseline: {streams:,} streams, no producers: RSS {baseline:.0f} MiB (ready {ready:.1f} s)"
        )
        # The producers go quiet ``margin`` seconds from now (the server must start and be measured
        # before) and are forgotten ``margin`` seconds after that.
        quiet = round(time.time() - stamp + margin)
        expiry = quiet + round(margin)
        flags = ["--durability", "none", "--log-level", "INFO"]
        flags += ["--producer-quiet-seconds", str(quiet), "--producer-expiry-seconds", str(expiry)]
        server = ScaleServer(data_dir, None, flags)
        server.spawn()
        ready = _ready(server)
        remembered = _metric(server, "durastream_producers")
        rows = [("active (server started on the built directory)", _mib(server), ready, remembered)]
        if time.time() - stamp >= quiet:
            raise RuntimeError(f"the server took {ready:.0f} s to start: raise --margin")
        time.sleep(max(0.0, stamp + quiet - time.time()))
        waited = _swept(server, "compacted", total, margin * 4)
        rows.append(
            ("quiet (compacted)", _mib(server), waited, _metric(server, "durastream_producers"))
        )
        time.sleep(max(0.0, stamp + expiry - time.time()))
        waited = _swept(server, "forgotten", total, margin * 4)
        rows.append(("forgotten", _mib(server), waited, _metric(server, "durastream_producers")))
        server.stop()
        server.spawn()
        ready = _ready(server)
        rows.append(
            ("after a restart", _mib(server), ready, _metric(server, "durastream_producers"))
        )
        server.stop()
        print(
            f"{'state':<50} {'RSS MiB':>8} {'over baseline':>14} {'per producer':>13} {'s':>6} {'remembered':>11}"
        )
        for name, rss, seconds, count in rows:
            over = rss - baseline
            print(
                f"{name:<50} {rss:>8.0f} {over:>+13.0f}M {over * MIB / total:>11.0f} B "
                f"{seconds:>6.1f} {count:>11,.0f}"
            )
        print(f"flags: {' '.join(flags)}")
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


async def _produce(engine: Engine, path: str, producer_id: str, *, epoch: int) -> None:
    await engine.append(
        AppendRequest(
            path=path,
            content_type="text/plain",
            body=b"x",
            producer=ProducerTuple(producer_id, epoch, 0),
        )
    )


async def _timed(coro):  # noqa: ANN001, ANN202
    """``coro``'s result, its duration, and the longest the event loop thread worked between two
    wake-ups of a probe that sleeps 1 ms at a time (CPU time of the loop thread: on this shared VM the
    wall-clock delay is mostly other processes' turn on the CPU)."""
    done = False
    worst = 0.0

    async def probe() -> None:
        nonlocal worst
        last = time.thread_time()
        while not done:
            await asyncio.sleep(0.001)
            now = time.thread_time()
            worst = max(worst, now - last)
            last = now

    prober = asyncio.create_task(probe())
    await asyncio.sleep(0)
    started = time.perf_counter()
    result = await coro
    took = time.perf_counter() - started
    done = True
    await prober
    return result, took, worst


def _state(producers: int, seqs: int = 1) -> StreamState:
    """One stream's state after ``producers`` producers sent ``seqs`` requests each."""
    state = StreamState(tail=0)
    for n in range(producers):
        for seq in range(seqs):
            apply_entry(
                state,
                AppendEntry(
                    position=state.tail,
                    messages=(b"x",),
                    timestamp_ms=1_900_000_000_000,
                    producer=ProducerTuple(
                        f"spark-3f6b2a9e-0d1c-4e55-9a7b-2c1d5e8f9a01-{n}", 3, seq
                    ),
                    digest=DIGEST,
                ),
            )
    return state


def _old_snapshot(state: StreamState) -> float:
    """Before this change: both steps on the loop (CPU time of the loop thread)."""
    started = time.thread_time()
    snap.encode_snapshot("log", 0, 0, snap.state_to_dict(state), SparseIndex(65536))
    return time.thread_time() - started


async def _new_snapshot(state: StreamState) -> tuple[float, float, float]:
    """Now: ``capture`` on the loop, encoding in a worker thread; the loop's worst stall meanwhile."""
    loop = asyncio.get_running_loop()
    started = time.thread_time()
    image = snap.capture(state)
    index = snap.IndexImage.of(SparseIndex(65536))
    on_loop = time.thread_time() - started
    done = threading.Event()
    worst = 0.0

    async def probe() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last - 0.001)
            last = now

    def encode() -> float:
        began = time.perf_counter()
        snap.snapshot_pieces("log", 0, 0, image, index)
        done.set()
        return time.perf_counter() - began

    prober = asyncio.create_task(probe())
    encoded = await loop.run_in_executor(None, encode)
    await prober
    return on_loop, encoded, worst


async def snapshot(sizes: list[int], rounds: int) -> None:
    new = hasattr(snap, "capture")
    print("snapshot of one stream's state, ms (loop thread CPU), median of", rounds, "rounds")
    for producers in sizes:
        state = _state(producers)
        if new:
            results = [await _new_snapshot(state) for _ in range(rounds)]
            on_loop, encoded, worst = (statistics.median(r[i] for r in results) for i in range(3))
            print(
                f"{producers:>9,} producers: on the loop {on_loop * 1000:.2f} (capture); encoded in a "
                f"worker in {encoded * 1000:.0f}; worst loop stall meanwhile {worst * 1000:.1f}"
            )
        else:
            on_loop = statistics.median(_old_snapshot(state) for _ in range(rounds))
            print(
                f"{producers:>9,} producers: on the loop {on_loop * 1000:.1f} (state_to_dict + encode)"
            )


def state_bytes(producers: int, seqs: int) -> None:
    """Python heap per producer (``tracemalloc``), state only, ``seqs`` requests each."""
    import tracemalloc

    from durastream_server.storage import state as state_module

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = _state(producers, seqs)
    active = tracemalloc.get_traced_memory()[0] - before
    print(f"{producers:,} producers x {seqs} request(s): {active / producers:.0f} B each")
    compact = getattr(state_module, "compact_producer", None)
    if compact is not None:
        for pid in list(state.producers):
            compact(state, pid)
        quiet = tracemalloc.get_traced_memory()[0] - before
        print(f"  quiet (8-byte digests): {quiet / producers:.0f} B each")
        for pid in list(state.producers):
            state_module.forget_producer(state, pid)
        gone = tracemalloc.get_traced_memory()[0] - before
        print(f"  forgotten (one group left): {gone / producers:.1f} B each")


async def aborts(requests: int, names: int) -> None:
    """Aborts naming handles the stream never staged (a zombie's, or anyone's with write access)."""
    import tracemalloc

    with tempfile.TemporaryDirectory(dir=".") as root:
        data = await DataDir.open(StorageConfig(root=Path(root), durability=Durability.NONE))
        engine = Engine(data, sweep_interval=0)
        await engine.start()
        await engine.create(CreateRequest(path="s", content_type="text/plain"))
        before = _rss_mib()
        tracemalloc.start()
        heap = tracemalloc.get_traced_memory()[0]
        for r in range(requests):
            handles = tuple(str(uuid.UUID(int=r * names + n)) for n in range(names))
            await engine.abort(AbortRequest(path="s", handles=handles))
        grown = tracemalloc.get_traced_memory()[0] - heap
        tracemalloc.stop()
        after = _rss_mib()
        space = next(iter(engine._txns._spaces.values()))
        kept = len(space.tombstones) + len(getattr(space, "fenced", ()))
        print(
            f"{requests} aborts x {names:,} unknown names: RSS +{after - before:.1f} MiB, Python heap "
            f"+{grown / MIB:.1f} MiB; names the stream keeps: {kept:,}"
        )
        await engine.close()
        await data.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    mem = sub.add_parser("memory")
    mem.add_argument("--streams", type=int, default=10_000)
    mem.add_argument("--per-stream", type=int, default=100)
    mem.add_argument(
        "--rounds", type=int, default=2, help="rounds of new producers (a new query each)"
    )
    snp = sub.add_parser("snapshot")
    snp.add_argument("--producers", type=int, nargs="+", default=[6_000, 100_000, 1_000_000])
    snp.add_argument("--rounds", type=int, default=5)
    sta = sub.add_parser("state")
    sta.add_argument("--producers", type=int, default=100_000)
    sta.add_argument("--seqs", type=int, nargs="+", default=[1, 64])
    srv = sub.add_parser("server")
    srv.add_argument("--streams", type=int, default=10_000)
    srv.add_argument("--per-stream", type=int, default=100)
    srv.add_argument(
        "--margin",
        type=float,
        default=90.0,
        help="seconds from the server's start to the producers going quiet, and to their expiry after",
    )
    srv.add_argument("--keep", action="store_true", help="keep the data directories")
    abt = sub.add_parser("aborts")
    abt.add_argument("--requests", type=int, default=70)
    abt.add_argument("--names", type=int, default=3_000)
    args = parser.parse_args()
    if args.part == "state":
        for seqs in args.seqs:
            state_bytes(args.producers, seqs)
    elif args.part == "aborts":
        asyncio.run(aborts(args.requests, args.names))
    elif args.part == "server":
        server_memory(args.streams, args.per_stream, args.margin, args.keep)
    elif args.part == "memory":
        asyncio.run(memory(args.streams, args.per_stream, args.rounds))
    else:
        asyncio.run(snapshot(args.producers, args.rounds))


if __name__ == "__main__":
    main()
