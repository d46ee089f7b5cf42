"""Many small streams, the sink side (issue 16): ``df.write`` routing rows to many streams vs one stream.

The job: ``--rows`` rows (default 40,000) of ~100 B JSON each, in ``--partitions`` partitions (default
two; ``local[2]`` runs two tasks at a time), written
by ``df.write.format("durastream")`` in transactional mode (the default on durastream-server):

- ``one``: every row to one stream (the ``stream`` option);
- ``fan``: a ``stream`` column routes them to ``--streams`` streams (default 2,000, so 20 rows each);
  every target is new, so the sink creates it, as a job writing per-entity streams for a new day would.

Each is run with two connectors in the same run, against the same server (this branch's, fsync
durability, its default): ``branch`` (this checkout) and ``base``, the connector of ``--base-ref``
(default ``main``; the first runs compared main before ``bulk-write``, ``merge16``: a ``HEAD``, a
``PUT``, a stage and a commit per stream and partition), extracted with ``git archive`` and put first
on ``PYTHONPATH`` of a child process (Spark's Python workers inherit it). Rounds alternate the two.

Figures per run: wall seconds of ``save()`` and the server's CPU seconds during it (``/proc``; wall time
on this shared machine is noisy, CPU much less); the requests the server answered during it, by kind
(its access log); and from Spark's status API the write stage's tasks, its duration and the tasks'
summed run time (executors), the rest of ``save()`` being the driver (planning, commit); the
Python workers' CPU (``workers_cpu_s``: the tasks' ``write`` and the job's ``commit``, which Spark 4
runs in a Python worker too) and per request kind the server's summed answer time (``server_ms``:
the commit's and the ensures' waits on the server). Ratios: ``fan / one`` per connector (target <= 2x wall,
<= 3x server CPU) and ``base / branch`` for ``fan``. Each ``fan`` run is checked: every stream holds its
rows exactly once.

The steady state (``--steady``, off by default; issue 16 measures both ``df.write`` and ``writeStream``):
a new stream costs its creation and its first records, which a streaming query pays once, in its first
batch. With ``--steady`` each child also times

- ``one_again`` / ``fan_again``: the same ``df.write`` of the same rows again, to the one stream and to
  the ``--streams`` streams, which now exist (sampled streams then hold their rows exactly twice);
- ``stream_one`` / ``stream_fan``: ``writeStream.format("durastream")`` over a file source that replays
  the rows ``--batches`` times (default 3), ``--partitions`` parquet files a replay, one replay a
  micro-batch (``maxFilesPerTrigger``, ``Trigger.AvailableNow``), into one stream and routed by the
  ``stream`` column to ``--streams`` new streams. Per batch: its wall (the progress's
  ``triggerExecution``) and the server's CPU over that span (sampled every 10 ms); the first batch
  (new streams) apart from the median of the later ones (existing streams, the query's targets
  remembered). Sampled routed streams hold their rows exactly ``--batches`` times.

Run: ``python bench/sink_fanout_bench.py [--rows 40000] [--streams 2000] [--rounds 2] [--json FILE]``
(``--only branch`` skips the base connector: this checkout's figures alone; ``--steady [--batches K]``
adds the steady-state rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import charts  # noqa: E402
from bulk_workers_bench import tree_cpu_seconds  # noqa: E402

CODE_VARIABLE = "DURASTREAM_BENCH_CODE"  # a child runs the connector found there (the base)
PHASE_VARIABLE = "DURASTREAM_PHASE_LOG"  # --phases: the connector's phase stamps (phase_hook/)


def child(args: argparse.Namespace) -> None:
    """One connector's runs (``one`` then ``fan``) in this process; prints one JSON line."""
    if os.environ.get(CODE_VARIABLE):  # ahead of this checkout (the imports above put it first)
        sys.path.insert(0, os.environ[CODE_VARIABLE])
        for name in [n for n in sys.modules if n.split(".")[0] == "durastream_spark"]:
            del sys.modules[name]
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import durastream_spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.port", "0")  # a free port: the status API gives the stage's figures
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        # Each file its own partition: writeStream's batches (--steady) run --partitions tasks,
        # not the few Spark packs small files into.
        .config("spark.sql.files.openCostInBytes", str(1 << 30))
        .getOrCreate()
    )
    spark.dataSource.register(durastream_spark.DurableStreamDataSource)
    rows = (
        spark.range(0, args.rows, numPartitions=args.partitions)
        .withColumn("name", F.concat(F.lit("n"), F.col("id").cast("string")))
        .withColumn("pad", F.lit("x" * 60))
    )
    rows.cache().count()

    def save(df, **options: str) -> list:
        """[wall s, server CPU s, {figures: requests by kind, the write stage's tasks and times}]."""
        cpu = tree_cpu_seconds(args.server_pid)  # with --workers N: the workers' too
        workers = python_workers_cpu(os.getpid())
        logged = Path(args.access_log).stat().st_size
        started, started_at = time.perf_counter(), time.time()
        df.write.format("durastream").option("url", args.url).options(**options).mode(
            "append"
        ).save()
        wall = time.perf_counter() - started
        ended_at = time.time()
        server_cpu = tree_cpu_seconds(args.server_pid) - cpu
        workers = python_workers_cpu(os.getpid()) - workers
        time.sleep(0.2)  # the server's last access-log lines reach the file
        answered = server_requests(Path(args.access_log), logged)
        figures: dict[str, object] = {"requests": {k: n for k, (n, _) in answered.items()}}
        figures["server_ms"] = {k: round(ms, 1) for k, (_, ms) in answered.items()}
        figures["workers_cpu_s"] = round(workers, 3)  # the tasks' and the commit's Python
        figures.update(write_stage(spark, wall))
        if os.environ.get(PHASE_VARIABLE):
            figures["phases"] = phase_split(Path(os.environ[PHASE_VARIABLE]), started_at, ended_at)
        return [wall, server_cpu, figures]

    # Warm-up: the whole rows, so both partitions' Python workers, the writer's code paths and the
    # server are warm before ``one`` is timed. A 200-row warm-up (``limit``: one partition) left
    # ``one`` cold: ~1.0 s against ~0.25 s warm on this machine, flattering ``fan / one`` ~3.5x.
    save(rows, stream=f"warm/{uuid.uuid4().hex[:8]}")
    out: dict[str, object] = {"code": str(Path(durastream_spark.__file__).parent.parent)}
    out_stream = f"one/{uuid.uuid4().hex[:8]}"
    out["one"] = save(rows, stream=out_stream)
    prefix = f"fan/{uuid.uuid4().hex[:8]}"
    routed = rows.withColumn(
        "stream", F.concat(F.lit(prefix + "/s"), (F.col("id") % args.streams).cast("string"))
    )
    out["fan"] = save(routed)
    out["prefix"] = prefix
    if args.steady:
        out["one_again"] = save(rows, stream=out_stream)
        with spying(args.spy, {"server": args.server_pid, "driver": os.getpid()}):
            out["fan_again"] = save(routed)
        out.update(streaming(spark, args, rows))
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


@contextlib.contextmanager
def spying(directory: Path | None, pids: dict[str, int]):
    """With ``--spy DIR``: py-spy (raw, collapsed stacks) of each named process and its Python
    subprocesses (the driver's: Spark's Python workers) while the block runs."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    spies = [
        subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "100",
                "--subprocesses",
                "-o",
                str(directory / f"{time.strftime('%H%M%S')}-{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)


class CpuSampler:
    """The server's CPU seconds sampled every ``period`` s in a thread, so a span known only afterwards
    (a micro-batch's, from the query's progress) gets its CPU by interpolation."""

    def __init__(self, pid: int, period: float = 0.01) -> None:
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, float]] = []  # (time.time(), CPU seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), tree_cpu_seconds(self.pid)))
            self._stop.wait(self.period)
        self.samples.append((time.time(), tree_cpu_seconds(self.pid)))

    def at(self, when: float) -> float:
        """CPU seconds at ``when``, interpolated between the samples around it."""
        before = max((s for s in self.samples if s[0] <= when), default=self.samples[0])
        after = min((s for s in self.samples if s[0] >= when), default=self.samples[-1])
        if after[0] <= before[0]:
            return before[1]
        share = (when - before[0]) / (after[0] - before[0])
        return before[1] + share * (after[1] - before[1])


def streaming(spark, args: argparse.Namespace, rows) -> dict[str, object]:
    """``writeStream`` into one stream and routed to ``--streams`` streams: ``--batches`` micro-batches,
    each a replay of the rows. Returns per query its batches' [wall s, server CPU s, rows] and, for the
    routed one, the prefix of its streams (checked by the parent)."""
    from pyspark.sql import functions as F

    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="sink-steady-") as tmp:
        source = Path(tmp) / "source"
        for replay in range(args.batches):  # one replay = --partitions files = one micro-batch
            rows.write.parquet(str(Path(tmp) / f"replay{replay}"))
            for number, part in enumerate(
                sorted((Path(tmp) / f"replay{replay}").glob("*.parquet"))
            ):
                source.mkdir(exist_ok=True)
                target = source / f"r{replay:03d}-{number:03d}.parquet"
                part.rename(target)
                stamp = 1_700_000_000 + replay  # the file source orders files by modification time
                os.utime(target, (stamp, stamp))
        schema = spark.read.parquet(str(source)).schema
        # Warm-up: one batch of a first query, so the first timed query's first batch is not the
        # streaming path's cold start (~4.8 s against ~0.5 s warm in a probe).
        warm = Path(tmp) / "warm"
        warm.mkdir()
        for part in source.glob("r000-*.parquet"):
            shutil.copy(part, warm / part.name)
        for name in ("stream_warm", "stream_one", "stream_fan"):
            df = (
                spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", str(args.partitions))
                .parquet(str(warm if name == "stream_warm" else source))
            )
            writer = df.writeStream.format("durastream").option("url", args.url)
            if name in ("stream_warm", "stream_one"):
                writer = writer.option("stream", f"sone/{uuid.uuid4().hex[:8]}")
            else:
                prefix = f"sfan/{uuid.uuid4().hex[:8]}"
                out["stream_prefix"] = prefix
                df = df.withColumn(
                    "stream",
                    F.concat(F.lit(prefix + "/s"), (F.col("id") % args.streams).cast("string")),
                )
                writer = df.writeStream.format("durastream").option("url", args.url)
            with CpuSampler(args.server_pid) as sampler:
                query = (
                    writer.option("checkpointLocation", str(Path(tmp) / f"ckpt-{name}"))
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
            batches = []
            for progress in query.recentProgress:
                if not progress["numInputRows"]:
                    continue
                start = parse_time(progress["timestamp"].replace("Z", "GMT")) / 1000
                wall = progress["durationMs"]["triggerExecution"] / 1000
                cpu = sampler.at(start + wall) - sampler.at(start)
                batches.append([round(wall, 3), round(cpu, 3), progress["numInputRows"]])
            if name != "stream_warm":
                out[name] = batches
                out[name + "_tasks"] = write_stage(spark, 0.0)["tasks"]  # the last batch's
    return out


def phase_split(log: Path, start: float, end: float) -> dict[str, object]:
    """A ``df.write`` save's wall split by phase (seconds), from the connector's DEBUG stamps between
    ``start`` and ``end`` (``time.time()``): up to the first task's start (Spark's job and stage
    start, the Python worker), per task its input (routing, encoding, staging) and its ``finish``, from
    the last task's end to the commit's start (Spark), the commit (before its first bulk request is
    built; the requests, first built to last parsed; the rest) and after the commit. Every stamp the
    save logged is in ``stamps``, relative to ``start``."""
    stamps: list[tuple[float, str]] = []
    for line in log.read_text().splitlines():
        at, _, message = line.split(" ", 2)
        if start <= float(at) <= end:
            stamps.append((float(at) - start, message))
    if not stamps:
        return {}

    def first(text: str) -> float:
        return min(at for at, message in stamps if text in message)

    def last(text: str) -> float:
        return max(at for at, message in stamps if text in message)

    tasks = {}
    for at, message in stamps:
        if message.startswith("task "):
            _, number, what = message.split(" ", 2)
            tasks.setdefault(number, {})[what] = at
    split: dict[str, object] = {
        "to_first_task": first("task ") if tasks else None,
        "tasks": {
            number: {
                "input": round(times["fed"] - times["start"], 3),
                "finish": round(times["end"] - times["fed"], 3),
            }
            for number, times in tasks.items()
            if {"start", "fed", "end"} <= times.keys()
        },
    }
    if any("commit start" in message for _, message in stamps):
        commit = first("commit start")
        requests = [at for at, message in stamps if message.startswith("bulk ")]
        split["task_end_to_commit"] = commit - last("task ") if tasks else None
        if requests:
            split["commit_before_requests"] = first(" built") - commit
            split["commit_requests"] = last(" parsed") - first(" built")
            split["commit_after_requests"] = last("commit end") - last(" parsed")
        split["commit"] = last("commit end") - commit
        split["after_commit"] = (end - start) - last("commit end")
    rounded = {
        key: round(value, 3) if isinstance(value, float) else value for key, value in split.items()
    }
    rounded["stamps"] = [[round(at, 4), message] for at, message in stamps]
    return rounded


def python_workers_cpu(root: int) -> float:
    """CPU seconds of Spark's Python workers below ``root`` (this child; its JVM; the JVM's
    ``pyspark.daemon`` and the workers it forks, which run the tasks' ``write`` and the job's
    ``commit``): the connector's own CPU, steadier than wall time on a shared machine. Live processes'
    user + system time plus what the daemon reaped of exited workers (its children's times)."""
    total = 0
    pending = [root]
    while pending:
        pid = pending.pop()
        try:
            for task in Path(
                f"/proc/{pid}/task"
            ).iterdir():  # the JVM forks from any of its threads
                children = task / "children"
                pending += [int(child) for child in children.read_text().split()]
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # exited meanwhile
            continue
        if b"pyspark" in command and (b"daemon" in command or b"worker" in command):
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / os.sysconf("SC_CLK_TCK")


def server_requests(log: Path, start: int) -> dict[str, tuple[int, float]]:
    """Per method and kind after byte ``start``: (requests, the server's summed ms answering them).
    The ms of ``POST commits`` and ``POST ensure`` are the waits on the server of the commit and of
    the tasks' ensures (the requests of one kind may overlap: up to 4 bulk requests in flight)."""
    counts: dict[str, tuple[int, float]] = {}
    with log.open("rb") as file:
        file.seek(start)
        for line in file.read().decode("utf-8", "replace").splitlines():
            found = re.search(r" (GET|HEAD|PUT|POST|DELETE) (\S+) -> \d+ in ([0-9.]+) ms", line)
            if not found:
                continue
            method, target, ms = found.groups()
            kind = target.split("?")[0].rsplit("/", 1)[-1] if "__ds/" in target else "stream"
            if "/metrics" in target or "/healthz" in target:
                continue
            key = f"{method} {kind}"
            count, total = counts.get(key, (0, 0.0))
            counts[key] = (count + 1, total + float(ms))
    return counts


def write_stage(spark, wall: float) -> dict[str, float]:
    """The last completed stage (the write): its tasks, duration and the tasks' summed run time, from
    Spark's status API; ``driver_s`` is the rest of ``save()``'s wall time (planning, the commit)."""
    import urllib.request

    sc = spark.sparkContext
    port = sc.uiWebUrl.rsplit(":", 1)[1]  # the UI listens on every interface; no proxy for it
    url = f"http://127.0.0.1:{port}/api/v1/applications/{sc.applicationId}/stages?status=complete"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as answer:
        stages = json.load(answer)
    stage = max(stages, key=lambda s: s["stageId"])
    duration = (parse_time(stage["completionTime"]) - parse_time(stage["submissionTime"])) / 1000
    return {
        "tasks": stage["numTasks"],
        "stage_s": round(duration, 3),
        "executor_run_s": round(stage["executorRunTime"] / 1000, 3),
        "driver_s": round(wall - duration, 3),
    }


def parse_time(text: str) -> float:
    """Milliseconds of a status-API time such as ``2026-11-27T04:58:01.123GMT``."""
    import datetime as dt

    stamp = dt.datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return stamp.timestamp() * 1000


def check(url: str, prefix: str, streams: int, rows: int, times: int = 1) -> None:
    """Every sampled routed stream holds its rows exactly once per save or batch (``times``)."""
    from durastream_spark.options import ConnectionOptions
    from durastream_spark.protocol.client import StreamClient

    client = StreamClient(ConnectionOptions.parse({"url": url}))
    for s in range(0, streams, max(1, streams // 50)):  # a sample of 50 streams, every one checked
        chunk = client.read(f"{prefix}/s{s}", "-1")
        ids = sorted(m["id"] for m in json.loads(chunk.body))
        expected = sorted(list(range(s, rows, streams)) * times)
        assert ids == expected, f"{prefix}/s{s}: {len(ids)} rows, {len(expected)} expected"


def report_layout(variant: str, server: object) -> None:
    """After a variant's run: stream directories in its data dir, and its log's warnings and errors."""
    data_dir = server.data_dir  # type: ignore[attr-defined]
    dirs = (
        sum(1 for _ in (data_dir / "streams").rglob("*") if _.is_dir())
        if (data_dir / "streams").exists()
        else 0
    )
    packs = len(list((data_dir / "packs").glob("*"))) if (data_dir / "packs").exists() else 0
    print(f"{variant}: {dirs} directories under streams/, {packs} files in packs/", flush=True)
    for line in Path(server.log_path).read_text(errors="replace").splitlines():  # type: ignore[attr-defined]
        if "WARNING" in line or "ERROR" in line or "Traceback" in line:
            print(f"{variant} server log: {line}", flush=True)


def run_child(args: argparse.Namespace, url: str, pid: int, code: Path | None) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    if code is not None:
        # This process's sys.path (CODE_VARIABLE) and the Python workers' (PYTHONPATH, ahead of the
        # editable install's finder); the workers start in the child's directory, not this checkout.
        env[CODE_VARIABLE] = str(code)
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")])
    if args.phases:  # the phase stamps of the child and of Spark's Python workers (phase_split)
        log = Path(tempfile.mkdtemp(prefix="sink-phases-")) / "phases.log"
        env[PHASE_VARIABLE] = str(log)
        hook = str(Path(__file__).resolve().parent / "phase_hook")
        env["PYTHONPATH"] = os.pathsep.join([hook, env.get("PYTHONPATH", "")])
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--url",
        url,
        "--server-pid",
        str(pid),
        "--rows",
        str(args.rows),
        "--streams",
        str(args.streams),
        "--partitions",
        str(args.partitions),
        "--access-log",
        str(args.access_log),
        "--batches",
        str(args.batches),
    ]
    if args.steady:
        command.append("--steady")
    if args.spy:
        command += ["--spy", str(args.spy)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, cwd=code or REPO
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit(f"child failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--streams", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--partitions",
        type=int,
        default=2,
        help="input partitions (each a task and a producer per stream; 2 cores run them)",
    )
    parser.add_argument("--base-ref", default="main")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--url")
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--access-log", help="(child) the server's log, with its access lines")
    parser.add_argument(
        "--only", choices=("branch", "base"), help="run one connector (default: both, alternating)"
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help="also time the same df.write again (existing streams) and writeStream (batches)",
    )
    parser.add_argument(
        "--batches", type=int, default=3, help="(--steady) writeStream's micro-batches"
    )
    parser.add_argument(
        "--spy", type=Path, help="(--steady) py-spy the server and the driver during fan_again"
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="split each df.write save's wall by phase from the connector's DEBUG stamps "
        "(figures' 'phases'; a connector without the stamps gives none)",
    )
    parser.add_argument("--replot", type=Path, help="record the chart of a saved --json run")
    parser.add_argument(
        "--variant",
        action="append",
        help="extra server arguments, one server per --variant, the rounds alternating them "
        "(repeatable; e.g. --variant '' --variant=--no-packed-appends, packed appends being the default; default: one server, no extra)",
    )
    args = parser.parse_args()
    args.variant = args.variant or [""]
    if args.child:
        child(args)
        return
    if args.replot:
        charts.record("sink_fanout", figures(json.loads(args.replot.read_text())["summary"]))
        return

    from tests.support.server_process import ServerProcess

    with tempfile.TemporaryDirectory(prefix="sink-fanout-") as tmp:
        base_code = Path(tmp) / "base"
        base_code.mkdir()
        if args.only != "branch":
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.base_ref, "durastream_spark"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(base_code)], input=archive, check=True)
        servers = {}  # one server per --variant, all up for the run; rounds alternate them
        for number, variant in enumerate(args.variant):
            servers[variant] = ServerProcess(
                Path(tmp) / f"data{number or ''}",
                extra_args=["--access-log", *shlex.split(variant)],
            )
            servers[variant].start()
        runs: dict[str, list[dict]] = {}
        try:
            for round_ in range(args.rounds):
                order = ("base", "branch") if round_ % 2 == 0 else ("branch", "base")
                variants = args.variant if round_ % 2 == 0 else args.variant[::-1]
                for variant in variants:
                    server = servers[variant]
                    args.access_log = server.log_path
                    url = server.base_url + "/v1/stream"
                    for name in order:
                        if args.only not in (None, name):
                            continue
                        code = base_code if name == "base" else None
                        result = run_child(args, url, server.pid, code)
                        times = 2 if args.steady else 1  # the routed df.write, again
                        check(url, result["prefix"], args.streams, args.rows, times)
                        if args.steady:
                            check(
                                url, result["stream_prefix"], args.streams, args.rows, args.batches
                            )
                        key = f"{name} {variant}".strip()
                        runs.setdefault(key, []).append(result)
                        print(key, json.dumps(result), flush=True)
        finally:
            for variant, server in servers.items():
                server.stop()
                if variant:
                    report_layout(variant, server)
    load = os.getloadavg()
    summary = {
        "rows": args.rows,
        "streams": args.streams,
        "partitions": args.partitions,
        "base_ref": args.base_ref,
        "load": [round(x, 2) for x in load],
    }
    for name, results in runs.items():
        if not results:
            continue
        one_wall = statistics.median(r["one"][0] for r in results)
        one_cpu = statistics.median(r["one"][1] for r in results)
        fan_wall = statistics.median(r["fan"][0] for r in results)
        fan_cpu = statistics.median(r["fan"][1] for r in results)
        summary[name] = {
            "one_s": round(one_wall, 2),
            "one_server_cpu_s": round(one_cpu, 2),
            "fan_s": round(fan_wall, 2),
            "fan_server_cpu_s": round(fan_cpu, 2),
            "fan_over_one_wall": round(fan_wall / one_wall, 2),
            "fan_over_one_cpu": round(fan_cpu / max(one_cpu, 0.01), 2),
            "one_figures": results[-1]["one"][2],
            "fan_figures": results[-1]["fan"][2],
        }
        if args.steady:
            summary[name].update(steady_summary(results))
    if runs.get("base") and runs.get("branch"):
        summary["fan_base_over_branch_wall"] = round(
            summary["base"]["fan_s"] / summary["branch"]["fan_s"], 2
        )
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))
    full = args.rows == 40_000 and args.streams == 2_000 and args.rounds >= 2
    if args.only or args.variant != [""]:
        return
    charts.record("sink_fanout", figures(summary), full=full)


def steady_summary(results: list[dict]) -> dict[str, float]:
    """Medians over the runs of the steady-state rows, and their ratios to the one-stream baseline:
    ``again`` (df.write to existing streams), ``first`` (writeStream's first batch: new streams),
    ``later`` (its later batches: existing streams; the median of each run's later batches)."""
    out: dict[str, float] = {}

    def later(batches: list, column: int) -> float:
        return statistics.median(b[column] for b in batches[1:]) if len(batches) > 1 else 0.0

    picks = {
        "again": lambda r, one, c: r["one_again" if one else "fan_again"][c],
        "first": lambda r, one, c: r["stream_one" if one else "stream_fan"][0][c],
        "later": lambda r, one, c: later(r["stream_one" if one else "stream_fan"], c),
    }
    for label, pick in picks.items():
        one_wall = statistics.median(pick(r, True, 0) for r in results)
        one_cpu = statistics.median(pick(r, True, 1) for r in results)
        fan_wall = statistics.median(pick(r, False, 0) for r in results)
        fan_cpu = statistics.median(pick(r, False, 1) for r in results)
        out[f"{label}_one_s"] = round(one_wall, 3)
        out[f"{label}_one_server_cpu_s"] = round(one_cpu, 3)
        out[f"{label}_fan_s"] = round(fan_wall, 3)
        out[f"{label}_fan_server_cpu_s"] = round(fan_cpu, 3)
        out[f"{label}_fan_over_one_wall"] = round(fan_wall / max(one_wall, 0.001), 2)
        out[f"{label}_fan_over_one_cpu"] = round(fan_cpu / max(one_cpu, 0.01), 2)
    return out


def figures(summary: dict) -> dict:
    """The chart of docs/benchmarks.md: both connectors, one stream and routed, in one run."""
    ours, base = "this branch's connector", f"{summary.get('base_ref', 'main')}'s connector"
    streams, rows = summary["streams"], summary["rows"]
    groups = {"one stream": "one", f"{streams:,} streams x {rows // streams}": "fan"}

    def panel(title: str, suffix: str) -> dict:
        return {
            "title": title,
            "unit": "s",
            "higher_is_better": False,
            "ours": [ours],
            "baselines": [base],
            "groups": [
                {
                    "label": label,
                    "values": {
                        ours: summary["branch"][key + suffix],
                        base: summary["base"][key + suffix],
                    },
                }
                for label, key in groups.items()
            ],
        }

    return {
        "title": f"df.write of {rows:,} rows: routed to {streams:,} streams vs one stream "
        f"(load {summary['load'][0]})",
        "panels": [
            panel("wall time of save()", "_s"),
            panel("server CPU during save()", "_server_cpu_s"),
        ],
    }


if __name__ == "__main__":
    main()
