"""Where a single-``PUT`` create's server CPU goes (issue 17: >= 5,000 creates/s, <= 200 us per create).

For each ``--server-src`` (this checkout when none is given), on a fresh data directory (fsync), ``--count``
creates with ``PUT`` alone by ``--clients`` lean keep-alive clients (``scale_bench``'s, as
``create_bench.py``), after 500 to warm up. The server runs under a small wrapper that records every
cyclic-GC collection (``gc.callbacks``: generation, CPU time, objects freed), so the figures are:

- creates/s, the server's CPU per create (all threads), the event loop thread's and the other threads'
  (the commit thread's round, the checkpoint's syncs), from ``/proc``;
- the collections during the measured window: how many per generation, their CPU per create, and how
  many objects they freed (cyclic garbage: what reference counting could not free);
- with ``--py-spy RATE``: ``py-spy record --gil`` of the server during the window (the thread holding
  the GIL, so the loop's Python and what it calls), its samples of the loop thread put in layers by the
  innermost frame that names one (``LAYERS``). py-spy slows the server: take shares from it, CPU from a
  run without it.

Run: ``python bench/put_breakdown.py --server-src /work/main --server-src . [--count 8000] [--py-spy 500]``
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from scale_bench import ScaleServer, raw_request, run_clients  # noqa: E402

# Runs the server with every collection recorded, written out at exit (SIGTERM: uvicorn shuts down).
WRAPPER = r"""
import atexit, gc, os, runpy, sys, time
events, started = [], [0.0]
def record(phase, info):
    if phase == "start":
        started[0] = time.thread_time()
    else:
        events.append((time.time(), info["generation"], time.thread_time() - started[0],
                       info["collected"]))
gc.callbacks.append(record)
def dump():
    with open(os.environ["GC_EVENTS"], "w") as out:
        out.write(repr(events))
atexit.register(dump)
sys.argv = ["durastream_server", *sys.argv[1:]]
runpy.run_module("durastream_server", run_name="__main__")
"""

# (layer, pattern of a py-spy frame): a sample counts for the first layer its innermost frame matches.
LAYERS = [
    (
        "answer write: the socket write, uvicorn's end of the cycle",
        r"RawResponder\.|on_response_complete",
    ),
    (
        "storage on the loop: header record, per-stream objects, the create's WAL hand-off",
        r"durastream_server/storage/",
    ),
    (
        "engine: create task, path lock, registry, change feed",
        r"durastream_server/(engine|subscriptions)/",
    ),
    (
        "protocol, HTTP layer: direct(), headers, path, request id, Request, parse, answer lines",
        r"durastream_server/(http/(app|handlers|parse|paths|requestid|cors|auth|responses|hosts|access)"
        r"|metrics|offsets)",
    ),
    (
        "HTTP machinery: uvicorn's httptools callbacks, the guard, fast-path hooks",
        r"uvicorn/protocols|http/(guard|fastpath)",
    ),
    (
        "asyncio machinery, uvloop's C (epoll, reads, callbacks)",
        r"asyncio/|uvicorn/(_compat|server)",
    ),
]


class WrappedServer(ScaleServer):
    """``ScaleServer`` started through ``WRAPPER``."""

    def __init__(self, data_dir: Path, server_src: str | None, events: Path) -> None:
        super().__init__(data_dir, server_src, ["--durability", "fsync"])
        self.events = events
        self.wrapper = data_dir.with_suffix(".wrapper.py")

    def spawn(self) -> float:
        self.wrapper.write_text(WRAPPER)
        env = dict(os.environ, GC_EVENTS=str(self.events))
        if self.server_src:
            env["PYTHONPATH"] = str(Path(self.server_src) / "server")
        cmd = [sys.executable, str(self.wrapper), "--data-dir", str(self.data_dir)]
        cmd += ["--port", str(self.port), "--log-level", "WARNING", *self.extra]
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process's lifetime
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        return started


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the main (event loop) thread and of all the other threads."""
    loop = other = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if tid == str(pid):
            loop += seconds
        else:
            other += seconds
    return loop, other


def layers(raw: Path) -> dict[str, float]:
    """Shares of the loop thread's py-spy samples by layer (``LAYERS``)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if "MainThread" not in frames[0] or len(frames) < 2:
            continue
        for frame in reversed(frames[1:]):
            layer = next((name for name, rx in LAYERS if re.search(rx, frame)), None)
            if layer is not None:
                counts[layer] += int(count)
                break
        else:
            counts["other: stdlib (json, ...), sortedcontainers"] += int(count)
    total = sum(counts.values()) or 1
    return {name: round(count / total, 3) for name, count in counts.most_common()}


async def measure(src: str | None, args: argparse.Namespace, workdir: Path) -> dict:
    events = workdir / "gc-events"
    server = WrappedServer(workdir / "data", src, events)
    spy = None
    try:
        server.spawn()
        await asyncio.to_thread(server.wait_healthy)

        async def put(conn, i: int) -> None:  # noqa: ANN001
            status, _ = await conn.request(
                raw_request("PUT", f"put/s{i:06d}", content_type="application/json")
            )
            if status != 201:
                raise RuntimeError(f"PUT: HTTP {status}")

        await run_clients(server.port, args.clients, range(500), put)
        if args.py_spy:
            spy = subprocess.Popen(
                [args.py_spy_bin, "record", "--gil", "--threads", "-r", str(args.py_spy)]
                + ["-f", "raw", "-o", str(workdir / "spy.raw"), "--pid", str(server.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(1.0)
        loop0, other0 = thread_cpu(server.pid)
        began = time.time()
        elapsed = await run_clients(server.port, args.clients, range(1000, 1000 + args.count), put)
        ended = time.time()
        loop1, other1 = thread_cpu(server.pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
    finally:
        server.stop()
    n = args.count
    window = [e for e in ast.literal_eval(events.read_text()) if began <= e[0] <= ended]
    collections_ = {
        f"gen{g}": {
            "collections": sum(1 for e in window if e[1] == g),
            "cpu_us_per_create": round(1e6 * sum(e[2] for e in window if e[1] == g) / n, 1),
            "objects_freed": sum(e[3] for e in window if e[1] == g),
        }
        for g in (0, 1, 2)
    }
    figures = {
        "creates_per_s": round(n / elapsed),
        "server_cpu_us_per_create": round(1e6 * (loop1 - loop0 + other1 - other0) / n),
        "loop_cpu_us_per_create": round(1e6 * (loop1 - loop0) / n),
        "other_threads_cpu_us_per_create": round(1e6 * (other1 - other0) / n),
        "gc_cpu_us_per_create": round(sum(c["cpu_us_per_create"] for c in collections_.values())),
        "gc": collections_,
        "load": round(os.getloadavg()[0], 2),
    }
    if spy is not None and (workdir / "spy.raw").exists():
        figures["py_spy_layers"] = layers(workdir / "spy.raw")
        if args.spy_out:  # the raw samples, for a look by function
            shutil.copy(workdir / "spy.raw", f"{args.spy_out}.{time.strftime('%H%M%S')}.raw")
    return figures


async def run(args: argparse.Namespace) -> None:
    sources = args.server_src or [None]
    order = [s for rep in range(args.repeat) for s in (sources if rep % 2 == 0 else sources[::-1])]
    for src in order:
        with tempfile.TemporaryDirectory(prefix="put-breakdown-") as workdir:
            figures = await measure(src and str(Path(src).resolve()), args, Path(workdir))
        print(src or "this checkout", figures, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server-src", action="append", help="checkout whose server to run")
    parser.add_argument("--count", type=int, default=8000, help="creates measured")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1, help="alternating runs")
    parser.add_argument("--py-spy", type=int, default=0, help="also profile at this many Hz")
    parser.add_argument(
        "--py-spy-bin",
        default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
    )
    parser.add_argument("--spy-out", help="keep py-spy's raw samples as <this>.<time>.raw")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
