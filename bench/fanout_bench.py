"""Many small streams, the source side (issue 16): per-batch cost when few of 100,000 streams change.

Set-up: ``--streams`` streams (default 100,000, ``fan/sNNNNNN``) of one JSON message each, created with their
content directly through the engine (``CreateRequest`` with a body, ``--durability none``: 100k PUTs over
HTTP would measure creates, not reads), and for the Spark part ``--small`` streams (default 10,000,
``ten/sNNNNN``) of ``--per-stream`` messages (default 10) plus one stream ``one/all`` holding the same rows.
Then a real server process starts on that data directory; everything measured is HTTP over loopback.

Each connector figure runs twice, in the same run: with the server's ``changes`` and ``multi-range``
extensions (what durastream-server advertises), and ``plain``: the same connector with those two hidden,
which is what a server without them gets (the Node reference server, rakaia) and what main did before
issue 16 (one listing walk or one HEAD per stream per trigger, one limit lookup per range).

1. **planning** (no Spark: the reader objects Spark drives, called in this process): a pattern query over
   all ``--streams`` has read everything; ``--changed`` streams (default 1%) get one append each; then the
   time of ``latestOffset`` + ``partitions`` for that batch, the requests they sent, the tasks planned, and
   the size of the batch's end offset as Spark writes it (JSON text), with the time to parse it back.
2. **idle** (no Spark): a pattern query over the first ``--idle-streams`` streams (default 10,000) calls
   ``latestOffset`` back to back for ``--idle-seconds``, as Spark's trigger loop does while nothing is
   new: requests per second and server CPU (% of one core).
4. **reader** (no Spark, only when named): ``spark.read`` of the ``--small`` streams against ``one/all``
   at the reader objects, planning and reading timed apart, with ranges sized by byte positions and by
   limit lookups (``byte-positions`` hidden), alternating against the same server.
3. **spark** (``local[*]``, ``format("noop")``): a batch read (``spark.read``) and a streaming
   ``Trigger.AvailableNow`` query of the ``--small`` streams against the same rows in ``one/all``: seconds
   and the ratio (target <= 2x).

Run: ``python bench/fanout_bench.py [--streams 100000] [--changed 1000] [--parts planning,idle,spark]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import charts  # noqa: E402
from listing_bench import server_cpu_seconds  # noqa: E402

from durastream_server.engine.api import AppendRequest, CreateRequest  # noqa: E402
from durastream_server.engine.engine import Engine  # noqa: E402
from durastream_server.storage import DataDir, Durability, StorageConfig  # noqa: E402
from durastream_spark.compat import ReadAllAvailable  # noqa: E402
from durastream_spark.options import ConnectionOptions  # noqa: E402
from durastream_spark.protocol import extensions as ext  # noqa: E402
from durastream_spark.protocol.client import StreamClient  # noqa: E402
from durastream_spark.source import batch_reader, stream_reader  # noqa: E402
from durastream_spark.source.arrow import DEFAULT_SCHEMA  # noqa: E402
from durastream_spark.source.offsets import SourceOffset  # noqa: E402
from tests.support import server_process  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402

HIDDEN = (ext.CHANGES, ext.MULTI_RANGE)
MODES = ("extensions", "plain")


def fan_path(n: int) -> str:
    return f"fan/s{n:06d}"


def small_path(n: int) -> str:
    return f"ten/s{n:05d}"


def document(i: int) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "pad": "x" * 60}, separators=(",", ":")).encode()


def array(first: int, count: int) -> bytes:
    return b"[" + b",".join(document(i) for i in range(first, first + count)) + b"]"


async def populate(
    root: Path, streams: int, small: int, per_stream: int, packed: bool = False
) -> None:
    """The streams of every part, created with their content through the engine, 64 at a time.

    ``packed`` (decision 0010 step 2): the ``--small`` streams are created empty and given their
    messages by one append each, fsync durability and ``packed_appends``, so they stay packed (no
    directory): what a server with ``--packed-appends`` makes of them; a create with a body or
    ``--durability none`` makes a directory.
    """
    durability = Durability.FSYNC if packed else Durability.NONE
    config = StorageConfig(root=root, durability=durability, packed_appends=packed)
    data = await DataDir.open(config)
    engine = Engine(data, sweep_interval=0)
    await engine.start()
    json_type = "application/json"
    try:
        wanted = [(fan_path(n), array(n, 1)) for n in range(streams)]
        smalls = [(small_path(n), array(n * per_stream, per_stream)) for n in range(small)]
        wanted += [] if packed else smalls
        wanted.append(("one/all", array(0, small * per_stream)))
        for first in range(0, len(wanted), 64):
            await asyncio.gather(
                *(
                    engine.create(CreateRequest(path=path, content_type=json_type, body=body))
                    for path, body in wanted[first : first + 64]
                )
            )

        async def create_then_append(path: str, body: bytes) -> None:
            await engine.create(CreateRequest(path=path, content_type=json_type))
            await engine.append(AppendRequest(path=path, content_type=json_type, body=body))

        for first in range(0, len(smalls) if packed else 0, 64):
            await asyncio.gather(*(create_then_append(*one) for one in smalls[first : first + 64]))
    finally:
        await engine.close()
        await data.close()


@contextmanager
def mode(name: str) -> Iterator[None]:
    """``plain``: clients in this process see the server without the changes and multi-range extensions."""
    with hiding(() if name == "extensions" else HIDDEN):
        yield


@contextmanager
def hiding(names: tuple[str, ...]) -> Iterator[None]:
    """Clients in this process see the server without the extensions ``names``."""
    if not names:
        yield
        return
    real = StreamClient.extensions

    def without(self: StreamClient) -> ext.Extensions:
        found = real(self)
        return ext.Extensions(tuple((n, v) for n, v in found.versions if n not in names))

    StreamClient.extensions = without  # type: ignore[method-assign]
    try:
        yield
    finally:
        StreamClient.extensions = real  # type: ignore[method-assign]


@contextmanager
def counted() -> Iterator[Counter]:
    """Requests sent by every client in this process while inside, by method."""
    seen: Counter = Counter()
    real = StreamClient._exchange

    def spy(self: StreamClient, method: str, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        seen[method] += 1
        return real(self, method, *args, **kwargs)  # type: ignore[arg-type]

    StreamClient._exchange = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        StreamClient._exchange = real  # type: ignore[method-assign]


def planning(url: str, streams: int, changed: int, pid: int) -> dict[str, float]:
    print(f"\n## planning one batch where {changed} of {streams} streams changed")
    writer = StreamClient(ConnectionOptions.parse({"url": url}))
    rows = []
    for name in MODES:
        with mode(name):
            reader = stream_reader({"url": url, "pattern": "fan/*"}, DEFAULT_SCHEMA)
            started = time.perf_counter()
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            first_plan = time.perf_counter() - started
            reader.commit(end)
            step = max(1, streams // changed)
            moved = [fan_path(n) for n in range(0, streams, step)][:changed]
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda p: writer.append(p, array(0, 1), "application/json"), moved))
            cpu = server_cpu_seconds(pid)
            with counted() as requests:
                started = time.perf_counter()
                later = reader.latestOffset(end, ReadAllAvailable())
                planned = time.perf_counter() - started
                tasks = reader.partitions(end, later)
                total = time.perf_counter() - started
            cpu = server_cpu_seconds(pid) - cpu
            text = json.dumps(later)
            started = time.perf_counter()
            SourceOffset.from_json(text)
            parse = time.perf_counter() - started
            readable = len(json.dumps(SourceOffset.from_json(text).as_dict()))
            reader.commit(later)
            rows.append(
                (name, first_plan, planned, total, sum(requests.values()), dict(requests))
                + (len(tasks), len(text), readable, parse, cpu)
            )
    print(
        "| path | first plan s | latestOffset s | + partitions s | requests | by method | tasks "
        "| end offset JSON | readable form | parse s | server CPU s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, first, plan, total, count, methods, tasks, size, readable, parse, cpu in rows:
        print(
            f"| {name} | {first:.2f} | {plan:.3f} | {total:.3f} | {count} | {methods} | {tasks} "
            f"| {size:,} B | {readable:,} B | {parse:.3f} | {cpu:.2f} |"
        )
    return {row[0]: row[3] for row in rows}


def idle(url: str, idle_streams: int, seconds: float, pid: int) -> dict[str, tuple[float, float]]:
    digits = len(str(idle_streams - 1))  # a power of ten: fan/s00* is fan/s000000..fan/s009999
    pattern = "fan/s" + "0" * (6 - digits) + "*"
    print(f"\n## idle query over {pattern} ({idle_streams} streams), {seconds:.0f} s of triggers")
    print("| path | triggers | requests/s | server CPU % of a core |")
    print("| --- | ---: | ---: | ---: |")
    found: dict[str, tuple[float, float]] = {}
    for name in MODES:
        with mode(name):
            reader = stream_reader({"url": url, "pattern": pattern}, DEFAULT_SCHEMA)
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            reader.commit(end)
            assert reader.latestOffset(end, ReadAllAvailable()) == end
            cpu = server_cpu_seconds(pid)
            triggers = 0
            with counted() as requests:
                started = time.monotonic()
                while time.monotonic() - started < seconds:
                    assert reader.latestOffset(end, ReadAllAvailable()) == end
                    triggers += 1
                elapsed = time.monotonic() - started
            cpu = server_cpu_seconds(pid) - cpu
            rate = sum(requests.values()) / elapsed
            print(f"| {name} | {triggers} | {rate:.1f} | {cpu / elapsed * 100:.1f} |")
            found[name] = (rate, cpu / elapsed * 100)
    return found


def reader_part(url: str, small: int, repeats: int, pid: int) -> None:
    """``spark.read`` of the ``--small`` streams against ``one/all`` at the reader API, in this process
    (no Spark): the driver's planning and the tasks' reads, with ranges sized by byte positions and, in
    the same run against the same server, with ``byte-positions`` hidden (sized by limit lookups)."""
    print(
        f"\n## reader API: spark.read of {small} streams vs one stream (no Spark; best of {repeats})"
    )
    print(
        "| sizing | selection | plan s | read s | tasks | requests while planning | server CPU s |"
    )
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    selections = {"one stream": {"streams": "one/all"}, f"{small} streams": {"pattern": "ten/*"}}
    sizings = {"byte positions": (), "limit lookups": (ext.BYTE_POSITIONS,)}
    best: dict[tuple[str, str], tuple[float, float, int, dict, float]] = {}
    for round_ in range(repeats + 1):  # the first round warms up
        for sizing, hidden in sizings.items():
            for label, options in selections.items():
                with hiding(hidden), counted() as requests:
                    reader = batch_reader({"url": url, **options}, DEFAULT_SCHEMA)
                    cpu = server_cpu_seconds(pid)
                    started = time.perf_counter()
                    tasks = reader.partitions()
                    planned = time.perf_counter() - started
                    sent = dict(requests)
                    for task in tasks:
                        for _ in reader.read(task):
                            pass
                    took = time.perf_counter() - started
                    cpu = server_cpu_seconds(pid) - cpu
                key = (sizing, label)
                if round_ and (key not in best or took < sum(best[key][:2])):
                    best[key] = (planned, took - planned, len(tasks), sent, cpu)
    for (sizing, label), (plan, read, tasks, sent, cpu) in best.items():
        print(f"| {sizing} | {label} | {plan:.3f} | {read:.3f} | {tasks} | {sent} | {cpu:.2f} |")
    print(f"load: {os.getloadavg()}")


def spark_part(
    url: str, small: int, per_stream: int, repeats: int, pid: int
) -> dict[str, tuple[float, float]]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.authenticate.socketTimeout", "120s")  # a loaded machine: as the tests
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(DurableStreamDataSource)
    rows = small * per_stream
    print(f"\n## Spark: {small} streams x {per_stream} messages vs one stream of {rows} rows")
    selections = {"one stream": {"streams": "one/all"}, f"{small} streams": {"pattern": "ten/*"}}

    tracker = spark.sparkContext.statusTracker()

    def tasks_of(group: str) -> tuple[int, int]:
        """Spark jobs of a job group and the tasks of their stages (``statusTracker``)."""
        jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
        stages = [tracker.getStageInfo(stage) for job in jobs if job for stage in job.stageIds]
        return len(jobs), sum(stage.numTasks for stage in stages if stage)

    def batch(options: dict[str, str]) -> tuple[int, int]:
        group = f"fanout-{time.monotonic_ns()}"
        spark.sparkContext.setJobGroup(group, "fanout batch read")
        spark.read.format("durastream").options(url=url, **options).load().write.format(
            "noop"
        ).mode("overwrite").save()
        return tasks_of(group)

    def available_now(options: dict[str, str]) -> tuple[int, int]:
        checkpoint = tempfile.mkdtemp(prefix="fanout-chk-")
        query = (
            spark.readStream.format("durastream")
            .options(url=url, **options)
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        query.awaitTermination()
        return tasks_of(str(query.runId))  # a streaming query's jobs run in its run id's group

    print(
        "| job | one stream s | many streams s | ratio | server CPU s (one / many) "
        "| jobs / tasks (one / many) |"
    )
    print("| --- | ---: | ---: | ---: | --- | --- |")
    found: dict[str, tuple[float, float]] = {}
    for job, run in (("batch read -> noop", batch), ("AvailableNow -> noop", available_now)):
        best: dict[str, tuple[float, float, tuple[int, int]]] = {}
        for _ in range(repeats + 1):  # the first round warms up
            for label, options in selections.items():
                cpu = server_cpu_seconds(pid)
                started = time.perf_counter()
                tasks = run(options)
                took = time.perf_counter() - started
                cpu = server_cpu_seconds(pid) - cpu
                if _ and (label not in best or took < best[label][0]):
                    best[label] = (took, cpu, tasks)
        one, many = best["one stream"], best[f"{small} streams"]
        print(
            f"| {job} | {one[0]:.2f} | {many[0]:.2f} | {many[0] / one[0]:.2f}x "
            f"| {one[1]:.2f} / {many[1]:.2f} | {one[2][0]} / {one[2][1]}, "
            f"{many[2][0]} / {many[2][1]} |",
            flush=True,
        )
        found[job] = (one[0], many[0])
    spark.stop()
    return found


def layout(data_dir: Path) -> str:
    """Where the streams are: directories under ``streams/`` (a packed stream has none), packs."""
    streams = data_dir / "streams"
    dirs = sum(1 for p in streams.rglob("*") if p.is_dir()) if streams.exists() else 0
    packs = len(list((data_dir / "packs").glob("*"))) if (data_dir / "packs").exists() else 0
    return f"{dirs} directories under streams/, {packs} files in packs/"


def spot_check(url: str, small: int, per_stream: int, sample: int = 50) -> None:
    """``sample`` of the ``--small`` streams read back whole over HTTP: their messages, in order."""
    client = StreamClient(ConnectionOptions.parse({"url": url}))
    for n in random.sample(range(small), min(sample, small)):
        got = client.read(small_path(n), "-1").body  # ~1 KiB: one chunk
        want = [json.loads(document(i)) for i in range(n * per_stream, (n + 1) * per_stream)]
        assert json.loads(got) == want, f"{small_path(n)}: {got[:200]!r}"


def log_problems(server: ServerProcess) -> list[str]:
    """The server log's warning, error and traceback lines."""
    text = Path(server.log_path).read_text(errors="replace")
    return [
        line for line in text.splitlines() if any(w in line for w in ("WARNING", "ERROR", "Trace"))
    ]


@contextmanager
def server_checkout(src: str | None) -> Iterator[None]:
    """A server process started inside runs the ``server/`` of checkout ``src`` (None: this tree)."""
    if src is None:
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(Path(src) / "server")
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=1000)
    parser.add_argument("--idle-streams", type=int, default=10_000)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--per-stream", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--parts",
        default="planning,idle,spark",
        help="comma-separated: planning, idle, spark; reader (the batch read at the reader API, sized "
        "by byte positions and by limit lookups) runs only when named",
    )
    parser.add_argument("--dir", help="reuse a data directory made by an earlier run")
    parser.add_argument(
        "--server-src",
        nargs="+",
        default=["-"],
        help="server checkouts to run the parts against, one after the other (- is this tree)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        help="extra server arguments, one pass of the parts per --variant in the order given (repeat "
        "one to alternate: --variant '' --variant=--packed-appends --variant=--packed-appends "
        "--variant ''); each distinct variant has its own data directory; with --packed-appends the "
        "--small streams are made packed (create, then one append, fsync)",
    )
    args = parser.parse_args()
    args.variant = args.variant or [""]
    parts = set(args.parts.split(","))

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    distinct = list(dict.fromkeys(args.variant))
    data_dirs = {v: root / f"data{i or ''}" for i, v in enumerate(distinct)}
    for variant, data_dir in data_dirs.items():
        if not (data_dir / "streams").exists():
            started = time.perf_counter()
            packed = "--packed-appends" in shlex.split(variant)
            asyncio.run(populate(data_dir, args.streams, args.small, args.per_stream, packed))
            print(f"created the streams via the engine in {time.perf_counter() - started:.0f} s")
        if variant:
            print(f"{variant}: {layout(data_dir)}")
    server_process.STARTUP_TIMEOUT_SECONDS = 900.0
    planned = idled = sparked = None
    for src in args.server_src:
        for variant in args.variant:
            data_dir = data_dirs[variant]
            # Reads do not sync, so durability only matters to the server's own checks: packed
            # appends need fsync (the server refuses them with --durability none).
            packed = "--packed-appends" in shlex.split(variant)
            extra = (*(() if packed else ("--durability", "none")), *shlex.split(variant))
            server = ServerProcess(data_dir, extra_args=extra)
            with server_checkout(None if src == "-" else src):
                server.start()
            url = server.base_url + "/v1/stream"
            name = f"{src if src != '-' else 'this tree'} {variant}".strip()
            print(f"\n# server: {name}; load before: {os.getloadavg()}")
            try:
                if "spark" in parts and variant:
                    spot_check(url, args.small, args.per_stream)
                if "planning" in parts:
                    planned = planning(url, args.streams, args.changed, server.pid)
                if "idle" in parts:
                    idled = idle(url, args.idle_streams, args.idle_seconds, server.pid)
                if "reader" in parts:
                    reader_part(url, args.small, args.repeats, server.pid)
                if "spark" in parts:
                    sparked = spark_part(url, args.small, args.per_stream, args.repeats, server.pid)
            finally:
                server.stop()
            if variant:
                print(f"{variant}: after the run, {layout(data_dir)}")
            for line in log_problems(server):
                print(f"{name} server log: {line}")
            print(f"\nload after: {os.getloadavg()}")
    full = not [
        a
        for a in vars(args)
        if a not in ("dir", "parts", "server_src", "variant")
        and getattr(args, a) != parser.get_default(a)
    ]
    if planned and idled and sparked and args.variant == [""]:
        charts.record("fanout", figures(args, planned, idled, sparked), full=full)


def figures(
    args: argparse.Namespace,
    planned: dict[str, float],
    idled: dict[str, tuple[float, float]],
    sparked: dict[str, tuple[float, float]],
) -> dict:
    """The chart of docs/benchmarks.md: each figure against its baseline of the same run."""
    ours, plain = "changes + multi-range", "plain protocol (no extensions)"
    many, one = f"{args.small:,} streams x {args.per_stream}", "one stream, same rows"
    return {
        "title": f"Many small streams: {args.streams:,} streams, {args.changed:,} changed per batch",
        "panels": [
            {
                "title": "planning one batch (latestOffset + partitions)",
                "unit": "s",
                "higher_is_better": False,
                "ours": [ours],
                "baselines": [plain],
                "groups": [
                    {
                        "label": f"{args.changed:,} of {args.streams:,} changed",
                        "values": {ours: planned["extensions"], plain: planned["plain"]},
                    }
                ],
            },
            {
                "title": f"idle query over {args.idle_streams:,} streams",
                "unit": "requests/s",
                "higher_is_better": False,
                "ours": [ours],
                "baselines": [plain],
                "groups": [
                    {
                        "label": "requests/s",
                        "values": {ours: idled["extensions"][0], plain: idled["plain"][0]},
                    },
                    {
                        "label": "server CPU, % of a core",
                        "values": {ours: idled["extensions"][1], plain: idled["plain"][1]},
                    },
                ],
            },
            {
                "title": "Spark, seconds (best run)",
                "unit": "s",
                "higher_is_better": False,
                "ours": [many],
                "baselines": [one],
                "groups": [
                    {"label": job, "values": {many: times[1], one: times[0]}}
                    for job, times in sparked.items()
                ],
            },
        ],
    }


if __name__ == "__main__":
    main()
