"""Server CPU per range of the packed task's multi-range read of many small streams, main's server
against this tree's, alternating (issue 16; docs/benchmarks.md "Many small streams", Run 6).

Reads the ``--small`` streams of a data directory made by ``fanout_bench.py --dir DIR`` through the
reader API (no Spark): planned once, then the one packed task read ``--rounds`` times against each
server, so the figure is the read alone (``fanout_bench.py --parts reader`` adds the planning's listing).

Run: ``python bench/multirange_cpu_bench.py --dir DIR --server-src MAIN - MAIN -``; the packed
streams of ``fanout_bench.py --variant=--packed-appends``: ``--data data1 --packed``. ``--spy DIR``
records each server with py-spy (``pip install py-spy``) while it reads, one collapsed-stack file a run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import fanout_bench as fb

SPY_RATE = 100  # py-spy samples a second (``--spy-rate``)


def read_rounds(
    data_dir: Path, src: str, rounds: int, packed: bool = False, spy: Path | None = None
) -> tuple[float, float, int]:
    """(seconds per read, server CPU seconds per read, ranges) of one server checkout."""
    # Packed streams are served as fanout_bench.py serves them (packed appends need fsync).
    extra = ("--packed-appends",) if packed else ("--durability", "none")
    server = fb.ServerProcess(data_dir, extra_args=extra)
    with fb.server_checkout(None if src == "-" else src):
        server.start()
    try:
        reader = fb.batch_reader(
            {"url": server.base_url + "/v1/stream", "pattern": "ten/*"}, fb.DEFAULT_SCHEMA
        )
        tasks = reader.partitions()
        ranges = 0
        for task in tasks:  # warm-up; counts the rows (10 per stream)
            ranges += sum(batch.num_rows for batch in reader.read(task))
        spying = None
        if spy is not None:
            spy.mkdir(parents=True, exist_ok=True)
            out = spy / f"{time.strftime('%H%M%S')}-{Path(src).name if src != '-' else 'tree'}.txt"
            py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            spying = subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(server.pid),
                    "--format",
                    "raw",
                    "--gil",
                    "--rate",
                    str(SPY_RATE),
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attaches
        cpu = fb.server_cpu_seconds(server.pid)
        started = time.perf_counter()
        for _ in range(rounds):
            for task in tasks:
                for _ in reader.read(task):
                    pass
        took = (time.perf_counter() - started) / rounds
        if spying is not None:
            spying.send_signal(2)
            spying.wait(timeout=30)
        return took, (fb.server_cpu_seconds(server.pid) - cpu) / rounds, ranges
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="a data directory made by fanout_bench.py")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-stream", type=int, default=10)
    parser.add_argument("--server-src", nargs="+", default=["-"])
    parser.add_argument("--data", default="data", help="the data directory under --dir")
    parser.add_argument("--packed", action="store_true", help="serve with --packed-appends")
    parser.add_argument("--spy", type=Path, help="py-spy each server's reads into this directory")
    parser.add_argument("--spy-rate", type=int, default=100, help="py-spy samples a second")
    args = parser.parse_args()
    global SPY_RATE
    SPY_RATE = args.spy_rate
    fb.server_process.STARTUP_TIMEOUT_SECONDS = 900.0
    print("| server | read s | server CPU s | server CPU per range (us) | load |")
    print("| --- | ---: | ---: | ---: | --- |")
    for src in args.server_src:
        took, cpu, rows = read_rounds(
            Path(args.dir) / args.data, src, args.rounds, args.packed, args.spy
        )
        ranges = rows // args.per_stream
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"| {src} | {took:.3f} | {cpu:.3f} | {cpu / ranges * 1e6:.1f} | {load} |")


if __name__ == "__main__":
    main()
