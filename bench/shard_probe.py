"""What more than one server process buys on this machine: issue 17's small appends against N shards.

Issue 17 asks how the server would use more than one core (docs/decisions/0009-more-than-one-core.md).
This probe measures the direction: the ``small`` benchmark of ``server_bench.py`` (64 idempotent
producers, each on its own JSON stream, one 200 B message per request, one request in flight, fsync
durability) served by 1 and by N processes, each process owning the streams of its shard (its own data
directory and port; the client routes each producer to its stream's shard, as a front or a shard map
would, without the front's own cost). The floor (``bench/uvicorn_floor.py``, a trivial uvicorn app, no
disk) is measured the same way, with the same client, in the same rounds, so the figures say how much
of any gain is the server's and how much the machine allows at all (the client shares the cores).

Figures per configuration: appends/s (all shards together), server CPU per request (every shard
process's CPU, all threads), and the client's CPU per request.

With ``--workers``: the server's own ``--workers 1`` against ``--workers N`` instead (decision 0009's first
step): one port, the kernel spreading the producers' connections over the workers, a request for
another worker's stream forwarded to it (``shards/router.py``) or its connection handed to it
(``shards/handoff.py``). Server CPU counts the parent and every worker. ``--server-src DIR`` (repeatable,
with ``--workers``) runs the server of another checkout too (``PYTHONPATH=DIR/server``), e.g. main's
forward against this checkout's hand-off, in the same rounds.

Run: ``.venv/bin/python bench/shard_probe.py [--shards 2] [--seconds 8] [--rounds 2] [--workers
[--server-src /work/main --server-src .]]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server_bench as sb  # noqa: E402


async def small_on_shards(servers: list[sb.Server], seconds: float) -> dict:
    """``server_bench.bench_small`` over several processes: producer p writes stream p, which lives
    on shard p % len(servers)."""
    loop = asyncio.get_running_loop()
    producers: list[sb.SmallProducer] = []
    for p in range(sb.SMALL_PRODUCERS):
        server = servers[p % len(servers)]
        path = f"/v1/stream/bench-small-{p:03d}"
        await sb.create_stream(server, path, "application/json")
        body = sb.small_messages_body(p, 1)
        _, protocol = await loop.create_connection(
            lambda server=server, path=path, body=body, p=p: sb.SmallProducer(
                server.port, path, f"small-{p}", body, 1
            ),
            "127.0.0.1",
            server.port,
        )
        producers.append(protocol)

    elapsed, cpu, client = await sb.run_small_producers(producers, servers, seconds)
    requests = sum(len(p.latencies) for p in producers)
    return {
        "requests_per_s": requests / elapsed,
        "server_cpu_us_per_request": 1e6 * cpu / max(1, requests),
        "server_cores": cpu / elapsed,
        "client_cpu_us_per_request": 1e6 * client / max(1, requests),
    }


def run_one(
    kind: str, shards: int, seconds: float, workdir: Path, workers: bool = False, src: str = "."
) -> dict:
    if workers:  # one server with --workers N: its own routing, on one port
        servers = [sb.Server(kind, workdir, ("--workers", str(shards)))]
    else:
        servers = [sb.Server(kind, workdir) for _ in range(shards)]
    saved = os.environ.get("PYTHONPATH")
    try:
        # the server (and its workers, which inherit the environment) from checkout ``src``
        os.environ["PYTHONPATH"] = str(Path(src).resolve() / "server")
        for server in servers:
            server.start()
        return asyncio.run(small_on_shards(servers, seconds))
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--workers",
        action="store_true",
        help="ours with --workers 1 against --workers N (the server routes), no floor",
    )
    parser.add_argument(
        "--server-src",
        action="append",
        help="with --workers: the checkout whose server to run (repeatable; default: this one)",
    )
    args = parser.parse_args()
    kinds = (sb.OURS,) if args.workers else (sb.OURS, sb.FLOOR)
    sources = args.server_src if args.workers and args.server_src else ["."]
    configs = [(kind, n, src) for kind in kinds for src in sources for n in (1, args.shards)]
    results: dict[tuple[str, int, str], list[dict]] = {c: [] for c in configs}
    workdir = Path(tempfile.mkdtemp(prefix="durastream-shards-"))
    try:
        for round_no in range(args.rounds):
            order = configs if round_no % 2 == 0 else configs[::-1]
            for kind, n, src in order:
                result = run_one(kind, n, args.seconds, workdir, args.workers, src)
                results[(kind, n, src)].append(result)
                print(
                    f"round {round_no + 1}: {kind} ({src}) x{n}: "
                    + ", ".join(f"{k} {v:,.1f}" for k, v in result.items()),
                    flush=True,
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(
        "| server (checkout) | processes (--workers if given) | appends/s | server CPU us/request | cores busy | client CPU us/request |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, n, src in configs:
        runs = results[(kind, n, src)]

        def med(key: str, runs: list[dict] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        print(
            f"| {kind} ({src}) | {n} | {med('requests_per_s'):,.0f} | {med('server_cpu_us_per_request'):.0f}"
            f" | {med('server_cores'):.2f} | {med('client_cpu_us_per_request'):.0f} |"
        )


if __name__ == "__main__":
    main()
