"""Where a ``spark.read`` of many small streams spends its time and CPU (issue 16): the whole job, every
process.

Runs the batch read of ``fanout_bench.py``'s Spark part (``pattern`` ``ten/*`` -> ``noop``, and one stream
``one/all`` holding the same rows) ``--repeats`` times each, alternating, on a data directory made by
``fanout_bench.py`` / ``plan_bench.py`` (``--dir``), and reports per job, median over the repeats:

- wall: from ``save()`` to its return, split with Spark's REST status (the UI on a free port) into what
  comes before the job is submitted (analysis and the Python source's planning, ``partitions()`` in a
  Python worker on the driver), the job itself (its stage's task: the Python worker's read and Arrow
  hand-over) and after it;
- CPU seconds of each process during the job, from ``/proc``: the server (by thread name), the driver JVM
  (by thread name), Spark's Python workers (daemon, workers, the planner's worker, with reaped children),
  and this driver process (server threads all show as one: Python names its threads only for
  itself, so the split by thread comes from py-spy).

``--spy DIR`` records the server with ``py-spy --threads`` (raw stacks, ``DIR/server.txt``) during the
measured rounds; py-spy itself costs CPU on a 2-core machine, so figures of a run with it are inflated.

    .venv/bin/python bench/read_breakdown.py --dir /tmp/fan --repeats 5 [--server-src /work/main]
    DURASTREAM_TREE=/work/main /work/main/.venv/bin/python bench/read_breakdown.py --dir /tmp/fan
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

# DURASTREAM_TREE: measure another checkout (its connector, its server, with its own venv's python).
REPO = Path(os.environ.get("DURASTREAM_TREE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tests.support import server_process  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: str) -> tuple[str, float, float]:
    """(comm, own CPU s, reaped children's CPU s) of a /proc stat file."""
    with open(path) as f:
        text = f.read()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / TICK
    children = (int(fields[13]) + int(fields[14])) / TICK
    return comm, own, children


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def descendants(root: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            at = pid
            while at > 1:
                at = _parent(at)
                if at == root:
                    found.append(pid)
                    break
        except OSError:
            continue
    return found


def snapshot(server: int) -> dict[str, float]:
    """CPU seconds so far of every process the job involves, keyed by role."""
    cpu: dict[str, float] = defaultdict(float)
    for pid in descendants(os.getpid()) + [os.getpid()]:
        cmd = _cmdline(pid)
        try:
            comm, own, children = _stat(f"/proc/{pid}/stat")
        except OSError:
            continue
        if pid == server:
            role = "server (all threads)"
        elif "java" in comm or "java" in cmd.split(" ")[0]:
            role = "driver JVM"
        elif pid == os.getpid():
            role = "driver Python (py4j client)"
        elif "pyspark" in cmd or "daemon" in cmd or "worker" in cmd:
            role = "Python workers (planning + task)"
        else:
            role = f"other: {comm}"
        cpu[role] += own + children
    return cpu


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="data directory root of fanout_bench.py")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--server-src", default=None, help="server checkout (default: this tree)")
    parser.add_argument("--spy", help="directory for py-spy flame graphs of the server and workers")
    args = parser.parse_args()
    data_dir = Path(args.dir) / "data"
    server_process.STARTUP_TIMEOUT_SECONDS = 900.0
    if args.server_src:
        os.environ["PYTHONPATH"] = str(Path(args.server_src) / "server")
    server = ServerProcess(data_dir, extra_args=("--durability", "none")).start()
    os.environ.pop("PYTHONPATH", None)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    url = server.base_url + "/v1/stream"
    try:
        run(args, server, url)
    finally:
        server.stop()


def run(args: argparse.Namespace, server: ServerProcess, url: str) -> None:
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    ui_port = free_port()
    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", str(ui_port))
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(DurableStreamDataSource)
    api = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"
    selections = {"one stream": {"streams": "one/all"}, "10,000 streams": {"pattern": "ten/*"}}

    def rest(path: str) -> list | dict:
        with urllib.request.urlopen(api + path, timeout=30) as response:
            return json.load(response)

    def job(options: dict[str, str]) -> dict[str, float]:
        group = f"breakdown-{time.monotonic_ns()}"
        spark.sparkContext.setJobGroup(group, "breakdown")
        before = snapshot(server.pid)
        started = time.time()
        spark.read.format("durastream").options(url=url, **options).load().write.format(
            "noop"
        ).mode("overwrite").save()
        ended = time.time()
        after = snapshot(server.pid)
        figures = {"wall": ended - started}
        for role, used in after.items():
            figures[f"cpu {role}"] = used - before.get(role, 0.0)
        jobs = [j for j in rest("/jobs") if j.get("jobGroup") == group]
        deadline = time.monotonic() + 10
        while jobs and "completionTime" not in jobs[0] and time.monotonic() < deadline:
            time.sleep(0.05)
            jobs = [j for j in rest("/jobs") if j.get("jobGroup") == group]
        if jobs:
            first = min(_epoch(j["submissionTime"]) for j in jobs)
            last = max(_epoch(j["completionTime"]) for j in jobs)
            figures["before the job (analysis + partitions())"] = first - started
            figures["the job (submit to done)"] = last - first
            figures["after the job"] = ended - last
            stages = [s for j in jobs for s in j["stageIds"]]
            run_ms = cpu_ns = tasks = 0
            for stage in stages:
                for attempt in rest(f"/stages/{stage}"):
                    run_ms += attempt.get("executorRunTime", 0)
                    cpu_ns += attempt.get("executorCpuTime", 0)
                    tasks += attempt.get("numCompleteTasks", 0)
            figures["task run time (executorRunTime)"] = run_ms / 1000
            figures["tasks"] = tasks
        return figures

    results: dict[str, list[dict[str, float]]] = {label: [] for label in selections}
    spies: list[subprocess.Popen] = []
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for label, options in selections.items():
            if round_ == 1 and args.spy and not spies:
                spies = start_spies(args.spy, server.pid)
            figures = job(options)
            if round_:
                results[label].append(figures)
    for spy in spies:
        spy.send_signal(2)
        spy.wait(timeout=120)
    spark.stop()
    keys: list[str] = []
    for rows in results.values():
        for row in rows:
            keys += [k for k in row if k not in keys]
    labels = list(results)
    print(f"\n## spark.read -> noop, median of {args.repeats} (load {os.getloadavg()})")
    print("| figure | " + " | ".join(labels) + " |")
    print("| --- |" + " ---: |" * len(labels))
    for key in sorted(keys, key=_order):
        cells = []
        for label in labels:
            values = [row.get(key, 0.0) for row in results[label]]
            cells.append(f"{statistics.median(values):.3f}")
        print(f"| {key} | " + " | ".join(cells) + " |")


def _order(key: str) -> tuple[int, str]:
    prefixes = ("wall", "before", "the job", "task", "after", "tasks", "cpu server", "cpu")
    for rank, prefix in enumerate(prefixes):
        if key.startswith(prefix):
            return rank, key
    return len(prefixes), key


def _epoch(text: str) -> float:
    """Spark's REST times, e.g. ``2026-11-27T19:40:01.123GMT``."""
    from datetime import datetime, timezone

    stamp = datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")
    return stamp.replace(tzinfo=timezone.utc).timestamp()


def start_spies(directory: str, server: int) -> list[subprocess.Popen]:
    """py-spy of the server (by thread) while the measured rounds run."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    return [
        subprocess.Popen(
            [spy, "record", "--pid", str(server), "--threads", "--format", "raw", "--rate", "200"]
            + ["--output", str(out / "server.txt"), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]


if __name__ == "__main__":
    main()
