"""Alternating A/B of two checkouts' servers on the small-append workload: server CPU per request.

``server_bench.py --only small`` runs this checkout's server against the reference and the floor; to
compare two versions of our own server in the same minutes (a shared, noisy machine), this runs
``server_bench.bench_small`` (64 idempotent producers on 64 JSON streams, one 200 B message per
request, fsync) against each checkout's server in turn, the order reversed every pair, each on a
fresh data directory, with ``PYTHONPATH=<checkout>/server``. The figure is the server's CPU per
request (all threads); the rates follow the machine's load.

Run: ``python bench/small_ab.py /work/main . [--pairs 6] [--seconds 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server_bench as sb  # noqa: E402


def run_once(checkout: Path, seconds: float) -> dict:
    """One ``bench_small`` round against ``checkout``'s server."""
    os.environ["PYTHONPATH"] = str(checkout / "server")
    workdir = Path(tempfile.mkdtemp(prefix="small-ab-"))
    server = sb.Server(sb.OURS, workdir)
    server.start()
    try:
        return asyncio.run(
            sb.bench_small(server, dataclasses.replace(sb.QUICK, small_seconds=seconds))
        )
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="checkout A (e.g. /work/main)")
    parser.add_argument("b", type=Path, help="checkout B (e.g. .)")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0, help="counted seconds per round")
    args = parser.parse_args()
    checkouts = [args.a.resolve(), args.b.resolve()]
    results: dict[Path, list[dict]] = {c: [] for c in checkouts}
    for pair in range(args.pairs):
        for checkout in checkouts if pair % 2 == 0 else checkouts[::-1]:
            result = run_once(checkout, args.seconds)
            results[checkout].append(result)
            print(
                f"pair {pair} {checkout}: {result['requests_per_s']:,.0f} requests/s, "
                f"{result['server_cpu_us_per_request']:.1f} us per request, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    cpu = {c: [r["server_cpu_us_per_request"] for r in results[c]] for c in checkouts}
    for checkout in checkouts:
        values = cpu[checkout]
        print(
            f"{checkout}: CPU per request median {statistics.median(values):.1f} us "
            f"({min(values):.1f}-{max(values):.1f})"
        )
    ratios = [b / a for a, b in zip(cpu[checkouts[0]], cpu[checkouts[1]], strict=True)]
    print(
        f"B / A per pair: {[round(r, 3) for r in ratios]}, median {statistics.median(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
