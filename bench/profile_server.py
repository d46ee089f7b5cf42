"""Profile our server under one of the benchmark workloads with py-spy, and summarise where time goes.

py-spy is a profiling tool only (``.venv/bin/pip install py-spy``), not a dependency of the project.
It samples the server process from outside, so the server runs unmodified; the workload is the same
client code as ``server_bench.py``.

Run: ``python bench/profile_server.py append|read|longpoll|rss [--quick] [--out DIR]``. It prints the
functions with the most samples, by self time and inclusive, and leaves the raw collapsed stacks (and a
speedscope file to open in a browser) in ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server_bench as sb  # noqa: E402


def summarise(collapsed: Path, top: int) -> str:
    """Self and inclusive sample counts per function from py-spy's collapsed ("raw") output."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        # The first frame names the thread (py-spy --threads).
        frames = [f for f in stack.split(";")[1:] if f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    out = [f"{total} samples (non-idle)", "", "self:"]
    out += [f"  {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(top)]
    out += ["", "inclusive:"]
    out += [f"  {100 * c / total:5.1f}%  {f}" for f, c in inclusive.most_common(top)]
    return "\n".join(out)


async def workload(name: str, server: sb.Server, sizes: sb.Sizes) -> dict:
    func, _ = sb.BENCHMARKS[name]
    return await func(server, sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=sorted(sb.BENCHMARKS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "durastream-prof")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (Python CPU time, not threads blocked in fsync)",
    )
    parser.add_argument("--ours-args", default="", help="extra arguments for our server, quoted")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        sys.exit("py-spy is not installed: .venv/bin/pip install py-spy")
    sizes = sb.QUICK if args.quick else sb.FULL
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="durastream-prof-"))
    server = sb.Server(sb.OURS, workdir, tuple(args.ours_args.split()))
    server.start()
    collapsed = args.out / f"{args.bench}.txt"
    spy = subprocess.Popen(
        [py_spy, "record", "--pid", str(server.pid), "--rate", str(args.rate), "--format", "raw"]
        + ["--threads", "--output", str(collapsed), "--nonblocking"]
        + (["--gil"] if args.gil else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    try:
        result = asyncio.run(workload(args.bench, server, sizes))
    finally:
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(timeout=60)
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print({k: round(v, 2) for k, v in result.items() if isinstance(v, float)})
    print(summarise(collapsed, args.top))
    print(f"\ncollapsed stacks: {collapsed}")


if __name__ == "__main__":
    main()
