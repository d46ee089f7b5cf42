"""The server CPU of creates and of bulk requests' entries in process (no HTTP), for one or more checkouts.

For each ``--server-src`` (this checkout when none is given), in a fresh process on a fresh data
directory, on uvloop as the server runs:

``create``, ``create again``  ``--count`` creates through ``Engine.create`` (64 in flight, as a bulk
    ``ensure`` ran them), then the same paths again (existing streams);
``ensure``  one bulk ``ensure`` of ``--bulk`` new streams through ``bulk.serve_ensure`` (the body parse,
    the entries, the answer document: all of it but the socket);
``ensure racing``  two bulk ``ensure`` of ``--bulk`` other new streams at once, as a routed sink's two
    tasks ensure the same streams (figures per entry of both);
``commits new``  one bulk ``commits`` of an inline commit (10 rows) to each of those streams: their first
    data (the routed sink's request after its ``ensure``), two producers (the sink's two partitions)
    taking turns, so the entries' headers come in two sets as the sink's do;
``commits existing``  another to each of them, streams that now have data (a later batch, or the sink's
    second partition).

Figures per create or entry: the loop thread's CPU (``time.thread_time``: HTTP-less request handling,
engine, record encoding, futures) and the process's (``time.process_time``: plus the commit thread's round
and the I/O threads' syncs), the cyclic GC's CPU (``gc.callbacks``, in whichever thread collected; part of
the other two) and its collections by generation, and the wall seconds. The heap is frozen after start-up,
as the server freezes it. ``--packed-appends`` opens the data directory with packed appends (decision 0010
step 2), as the server's flag does. Checkouts alternate ``--repeat`` times; compare them in
the same run. ``--profile PREFIX`` writes a cProfile of each phase (loop thread) to
``PREFIX-<phase>.prof`` of the first checkout's first run, and prints each phase's Python calls per
create or entry (what a new stream makes, function by function: ``pstats`` on the file).

Run: ``python bench/engine_create_cpu.py --server-src /work/main --server-src . [--count 5000] [--bulk 2000]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import asyncio, cProfile, gc, json, sys, tempfile, time
from pathlib import Path
from durastream_server.engine.engine import Engine
from durastream_server.engine.api import CreateRequest
from durastream_server.http import bulk
from durastream_server.http.handlers import Request
from durastream_server.storage.datadir import DataDir, StorageConfig, Durability

COUNT, BULK, DURABILITY, PROFILE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
PACKED = sys.argv[5] == "packed"
MAX_BODY = 64 * 1024 * 1024

def request(body, content_type):
    sent = []
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    async def send(message):
        sent.append(message)
    headers = {"content-type": content_type, "content-length": str(len(body))}
    return Request(method="POST", raw_path=b"/v1/stream/__ds/x-durastream/x", query_string=b"",
                   headers=headers, scheme="http", server=None, receive=receive, send=send)

def commits_body(paths, key, seq):
    return bulk.encode_requests([
        (path, {"Content-Type": "application/json", "Durastream-Commit-Key": key,
                "Producer-Id": f"w{i % 2}", "Producer-Epoch": "0", "Producer-Seq": str(seq)},
         json.dumps([{"i": i, "n": n, "pad": "0123456789abcdef"} for n in range(10)]).encode())
        for i, path in enumerate(paths)])

GC = {"seconds": 0.0, "collections": [0, 0, 0], "started": 0.0}

def on_gc(phase, info):
    # The cyclic GC's CPU in the thread it runs in, and its collections by generation.
    if phase == "start":
        GC["started"] = time.thread_time()
    else:
        GC["seconds"] += time.thread_time() - GC["started"]
        GC["collections"][info["generation"]] += 1

gc.callbacks.append(on_gc)

def timed(figures, name, count):
    class Timer:
        def __enter__(self):
            self.profile = cProfile.Profile() if PROFILE else None
            self.g0, GC["collections"] = GC["seconds"], [0, 0, 0]
            self.t0, self.c0, self.p0 = time.perf_counter(), time.thread_time(), time.process_time()
            if self.profile: self.profile.enable()
        def __exit__(self, *exc):
            if self.profile:
                self.profile.disable()
            wall = time.perf_counter() - self.t0
            loop, proc = time.thread_time() - self.c0, time.process_time() - self.p0
            figures[name] = {"loop_cpu_us": round(1e6 * loop / count, 1),
                             "process_cpu_us": round(1e6 * proc / count, 1), "seconds": round(wall, 3),
                             "gc_cpu_us": round(1e6 * (GC["seconds"] - self.g0) / count, 1),
                             "collections": GC["collections"]}
            if self.profile:
                self.profile.dump_stats(f"{PROFILE}-{name.replace(' ', '_')}.prof")
                self.profile.create_stats()
                calls = sum(row[1] for row in self.profile.stats.values())
                figures[name]["profiled_calls_per_item"] = round(calls / count, 1)
    return Timer()

async def main():
    figures = {}
    with tempfile.TemporaryDirectory(prefix="engine-create-") as root:
        extra = {"packed_appends": True} if PACKED else {}
        config = StorageConfig(root=Path(root), durability=Durability(DURABILITY), **extra)
        data = await DataDir.open(config)
        engine = Engine(data, sweep_interval=0)
        await engine.start()
        gc.collect()
        gc.freeze()  # as the server does once it listens (server.py)
        try:
            for name in ("create", "create again") if COUNT else ():
                queue = iter(range(COUNT))

                async def worker():
                    for i in queue:
                        await engine.create(CreateRequest(path=f"c/s{i:06d}", content_type="application/json"))

                with timed(figures, name, COUNT):
                    await asyncio.gather(*(worker() for _ in range(64)))
            if BULK:
                paths = [f"b/s{i:06d}" for i in range(BULK)]
                body = json.dumps({"streams": paths, "content_type": "application/json"}).encode()
                with timed(figures, "ensure", BULK):
                    answer = await bulk.serve_ensure(engine, request(body, "application/json"), MAX_BODY)
                assert all(r.get("created") for r in answer["results"]), answer["results"][:3]
                racing = [f"r/s{i:06d}" for i in range(BULK)]
                body = json.dumps({"streams": racing, "content_type": "application/json"}).encode()
                with timed(figures, "ensure racing", 2 * BULK):
                    answers = await asyncio.gather(*(
                        bulk.serve_ensure(engine, request(body, "application/json"), MAX_BODY)
                        for _ in range(2)))
                made = [r.get("created") for answer in answers for r in answer["results"]]
                assert made.count(True) == BULK and made.count(False) == BULK, made[:3]
                for name, key, seq in (("commits new", "k0", 0), ("commits existing", "k1", 1)):
                    body = commits_body(paths, key, seq)
                    with timed(figures, name, BULK):
                        answer = await bulk.serve_commits(engine, request(body, bulk.CONTENT_TYPE), MAX_BODY)
                    assert all(r["status"] == 200 for r in answer["results"]), answer["results"][:3]
        finally:
            await engine.close()
            await data.close()
    print(json.dumps(figures))

import uvloop
uvloop.install()  # as the server runs
asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-src", action="append")
    parser.add_argument("--count", type=int, default=5000, help="creates (0: skip)")
    parser.add_argument("--bulk", type=int, default=0, help="entries of the bulk phases (0: skip)")
    parser.add_argument("--durability", choices=("fsync", "none"), default="fsync")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="", help="cProfile each phase to PREFIX-<phase>.prof")
    parser.add_argument(
        "--packed-appends",
        action="store_true",
        help="the data directory with packed appends (decision 0010 step 2), as --packed-appends",
    )
    args = parser.parse_args()
    sources = args.server_src or [str(Path(__file__).resolve().parents[1])]
    for rep in range(args.repeat):
        for src in sources if rep % 2 == 0 else sources[::-1]:
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve() / "server"))
            profile = args.profile if rep == 0 and src == sources[0] else ""
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    str(args.count),
                    str(args.bulk),
                    args.durability,
                    profile,
                    "packed" if args.packed_appends else "",
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            print(src, json.dumps(json.loads(out)), f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
