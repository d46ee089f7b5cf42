"""What a stream's first ``POST`` does that a later one does not: the real server, its event loop's
thread under ``cProfile`` phase by phase, and the calls per request of two phases compared.

One server (fsync durability, packed creates: the defaults) and four phases of ``--count`` requests by
``--clients`` connections, as ``create_bench.py`` drives them: ``put`` (creates), ``first_post`` (one
``POST`` to each of those streams, their first append, in a phase of its own), ``post_again`` (one more
``POST`` to each: a later append) and ``put_post`` (new streams, each ``PUT`` then ``POST`` on one
connection, the issue's method). The server runs under a small wrapper that starts ``cProfile`` on
``SIGUSR1`` and stops and dumps it on the next one, so each phase has a profile of its own (the loop's
thread only: the commit and I/O threads are not in it), and records the cyclic GC's time per phase
(``gc.callbacks``). Each phase also reports the server's CPU per request without the profiler overhead
being meaningful in the comparison: read calls per request, not microseconds, from the profile.

Printed: per phase, requests/s and server / loop CPU per request (the profiler inflates both about 2x);
then the functions whose calls per request differ between ``--compare A B`` phases (default
``post_again first_post``: what a first append adds; ``put+first_post put_post``: what interleaving adds).

Run: ``python bench/append_phases_profile.py [--count 4000] [--compare post_again first_post]
[--compare put+first_post put_post] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from create_bench import loop_cpu  # noqa: E402
from create_profile import spawn_under  # noqa: E402
from scale_bench import ScaleServer, raw_request, run_clients  # noqa: E402

PHASES = ("put", "first_post", "post_again", "put_post")

# The server's wrapper: cProfile and GC time toggled by SIGUSR1, one dump per phase.
WRAPPER = """
import cProfile, gc, os, runpy, signal, sys, time
out = os.environ["PHASES_OUT"]
state = {"prof": None, "n": 0, "gc": 0.0, "t0": 0.0}
def on_gc(phase, info):
    if phase == "start":
        state["t0"] = time.thread_time()
    else:
        state["gc"] += time.thread_time() - state["t0"]
gc.callbacks.append(on_gc)
def toggle(sig, frame):
    if state["prof"] is None:
        state["gc"] = 0.0
        state["prof"] = cProfile.Profile()
        state["prof"].enable()
    else:
        state["prof"].disable()
        state["prof"].dump_stats(f"{out}.{state['n']}.prof")
        with open(f"{out}.{state['n']}.gc", "w") as f:
            f.write(repr(state["gc"]))
        state["prof"] = None
        state["n"] += 1
signal.signal(signal.SIGUSR1, toggle)
sys.argv = ["durastream_server", *sys.argv[1:]]
runpy.run_module("durastream_server", run_name="__main__", alter_sys=True)
"""


async def drive(server: ScaleServer, count: int, clients: int) -> dict[str, dict[str, float]]:
    async def put(conn, i: int, prefix: str = "a") -> None:  # noqa: ANN001
        status, _ = await conn.request(
            raw_request("PUT", f"{prefix}/s{i:06d}", content_type="application/json")
        )
        assert status == 201, status

    async def post(conn, i: int, prefix: str = "a") -> None:  # noqa: ANN001
        body = b'{"i":%d,"pad":"0123456789abcdef"}' % i
        status, _ = await conn.request(
            raw_request("POST", f"{prefix}/s{i:06d}", body, "application/json")
        )
        assert status in (200, 204), status

    async def put_post(conn, i: int) -> None:  # noqa: ANN001
        await put(conn, i, "b")
        await post(conn, i, "b")

    figures: dict[str, dict[str, float]] = {}
    for name, work in zip(PHASES, (put, post, post, put_post), strict=True):
        os.kill(server.pid, signal.SIGUSR1)  # profile on
        await asyncio.sleep(0.3)
        cpu0, loop0 = server.cpu(), loop_cpu(server.pid)
        started = time.perf_counter()
        await run_clients(server.port, clients, range(count), work)
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0.3)  # the phase's last round settled, inside its profile
        cpu, loop = server.cpu() - cpu0, loop_cpu(server.pid) - loop0
        os.kill(server.pid, signal.SIGUSR1)  # off and dumped
        await asyncio.sleep(1.0)
        figures[name] = {
            "per_s": round(count / elapsed),
            "server_cpu_us": round(1e6 * cpu / count),
            "loop_cpu_us": round(1e6 * loop / count),
        }
        print(name, figures[name], flush=True)
    return figures


def per_request(paths: list[Path], count: int) -> dict[str, tuple[float, float]]:
    """function -> (calls, profiled tottime us) per request, summed over ``paths``."""
    out: dict[str, tuple[float, float]] = {}
    for path in paths:
        for (file, line, fn), (_, calls, tottime, _, _) in pstats.Stats(str(path)).stats.items():
            key = f"{file.split('site-packages/')[-1].split('durastream_server/')[-1]}:{line}({fn})"
            was = out.get(key, (0.0, 0.0))
            out[key] = (was[0] + calls / count, was[1] + 1e6 * tottime / count)
    return out


def compare(base: str, other: str, dumps: dict[str, Path], count: int, top: int) -> None:
    """Print the functions whose calls per request differ between phases (``a+b``: summed)."""
    a = per_request([dumps[p] for p in base.split("+")], count)
    b = per_request([dumps[p] for p in other.split("+")], count)
    print(
        f"\n{other} against {base}: calls per request {sum(v[0] for v in a.values()):.1f} -> "
        f"{sum(v[0] for v in b.values()):.1f}; profiled loop time "
        f"{sum(v[1] for v in a.values()):.1f} -> {sum(v[1] for v in b.values()):.1f} us"
    )
    rows = sorted(
        ((b.get(k, (0, 0))[0] - a.get(k, (0, 0))[0], k) for k in set(a) | set(b)),
        key=lambda row: -abs(row[0]),
    )
    for delta, key in rows[:top]:
        if abs(delta) >= 0.05:
            print(f"  {delta:+7.2f} calls  {key}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=4000, help="requests per phase")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--compare",
        nargs=2,
        action="append",
        metavar=("BASE", "OTHER"),
        help="phases to compare (a+b sums two; repeatable; default post_again first_post)",
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--keep", type=Path, help="keep the profiles (PHASE.prof) in this directory"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="append-phases-") as workdir:
        out = Path(workdir) / "phase"
        wrapper = Path(workdir) / "wrapper.py"
        wrapper.write_text(WRAPPER)
        server = ScaleServer(Path(workdir) / "data", None, ["--durability", "fsync"])
        spawn_under(server, [str(wrapper)], {"PHASES_OUT": str(out)})
        try:
            server.wait_healthy()
            asyncio.run(drive(server, args.count, args.clients))
        finally:
            server.stop()
        dumps = {name: Path(f"{out}.{i}.prof") for i, name in enumerate(PHASES)}
        for i, name in enumerate(PHASES):
            gc_s = float(Path(f"{out}.{i}.gc").read_text())
            print(f"{name}: cyclic GC {1e6 * gc_s / args.count:.1f} us per request (profiled)")
        for base, other in args.compare or [("post_again", "first_post")]:
            compare(base, other, dumps, args.count, args.top)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for name, path in dumps.items():
                (args.keep / f"{name}.prof").write_bytes(path.read_bytes())


if __name__ == "__main__":
    main()
