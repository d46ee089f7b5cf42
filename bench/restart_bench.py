"""Restart after SIGKILL with many streams (issue 17): how soon the server serves, before and after.

One data directory of ``--streams`` one-message JSON streams (``scale/sNNNNNN``, made in this process
through the engine with ``--durability none``, as ``fanout_bench.py`` does; ``--dir`` reuses one), copied
once per server so both start from the same bytes. For each server (``--baseline-src``, e.g. a checkout of
main, then this tree): start, wait until every stream is recovered, SIGKILL; then ``--rounds`` times:
start, and measure the seconds (and the server's CPU seconds) until ``/healthz`` answers, until the first of ``--reads`` random streams
has read back its message, until all of them have, and (when ``/healthz`` reports ``recovering``) until
every stream is recovered; RSS then (after a few idle seconds), also after the first start, and per stream
above the same server's RSS on an empty directory; SIGKILL again. The load average is printed beside
each round.

A full run (``--streams 100000``) saves ``bench/results/restart.json`` and renders
``docs/img/bench-restart.png`` (``bench/charts.py``).

Run: ``python bench/restart_bench.py --baseline-src /work/main [--streams 100000] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from server_bench import cpu_seconds, free_port, rss_bytes  # noqa: E402

MiB = 1 << 20


def stream_path(i: int) -> str:
    return f"scale/s{i:06d}"


async def populate(root: Path, streams: int) -> None:
    from durastream_server.engine.api import CreateRequest
    from durastream_server.engine.engine import Engine
    from durastream_server.storage import DataDir, Durability, StorageConfig

    data = await DataDir.open(StorageConfig(root=root, durability=Durability.NONE))
    engine = Engine(data, sweep_interval=0)
    await engine.start()
    try:
        for first in range(0, streams, 64):
            await asyncio.gather(
                *(
                    engine.create(
                        CreateRequest(
                            path=stream_path(i),
                            content_type="application/json",
                            body=b'[{"i":%d}]' % i,
                        )
                    )
                    for i in range(first, min(streams, first + 64))
                )
            )
    finally:
        await engine.close()
        await data.close()


def _exchange(port: int, raw: bytes, timeout: float) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def health(port: int) -> dict | None:
    try:
        status, body = _exchange(
            port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 5
        )
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


def read_message(port: int, i: int) -> None:
    raw = (
        f"GET /v1/stream/{stream_path(i)}?offset=-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    status, body = _exchange(port, raw, 600)
    if status != 200 or json.loads(body)[0]["i"] != i:
        raise RuntimeError(f"read of {stream_path(i)} after restart: {status} {body[:200]!r}")


class Server:
    def __init__(self, src: str | None, data_dir: Path) -> None:
        self.src = src
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        env = dict(os.environ)
        if self.src:
            env["PYTHONPATH"] = str(Path(self.src) / "server")
        log = open(self.data_dir.with_suffix(".log"), "ab")  # noqa: SIM115 - the child's lifetime
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "durastream_server", "--data-dir", str(self.data_dir)]
            + ["--port", str(self.port), "--log-level", "WARNING"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return started

    def wait(self, predicate, timeout: float = 1200) -> float:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited, see {self.data_dir.with_suffix('.log')}")
            found = health(self.port)
            if found is not None and predicate(found):
                return time.perf_counter()
            time.sleep(0.01)
        raise RuntimeError("server not ready in time")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


SETTLE_SECONDS = 3.0  # idle time before an RSS reading


def settled_rss(server: Server) -> int:
    time.sleep(SETTLE_SECONDS)
    return rss_bytes(server.proc.pid)  # type: ignore[union-attr]


def empty_rss(src: str | None, work: Path) -> int:
    """RSS of the same server on an empty data directory (what idle streams are counted above)."""
    server = Server(src, work / ("baseline-empty" if src else "ours-empty"))
    server.data_dir.mkdir()
    server.start()
    server.wait(lambda h: not h.get("recovering"))
    rss = settled_rss(server)
    server.kill()
    return rss


def one_restart(server: Server, streams: int, reads: int, seed: int, empty: int) -> dict:
    started = server.start()
    healthy = server.wait(lambda h: True)
    cpu_healthy = cpu_seconds(server.proc.pid)  # type: ignore[union-attr]
    rng = random.Random(seed)
    first = None
    for _ in range(reads):
        read_message(server.port, rng.randrange(streams))
        first = first or time.perf_counter()
    read_all = time.perf_counter()
    recovered = server.wait(lambda h: not h.get("recovering"))
    cpu_recovered = cpu_seconds(server.proc.pid)  # type: ignore[union-attr]
    figures = {
        "healthz_seconds": healthy - started,
        # The server's own CPU until then: the robust figure on a loaded machine.
        "healthz_cpu_seconds": cpu_healthy,
        "first_read_seconds": (first or read_all) - started,
        "reads_done_seconds": read_all - started,
        "all_recovered_seconds": recovered - started,
        "all_recovered_cpu_seconds": cpu_recovered,
        "load": os.getloadavg()[0],
    }
    rss = settled_rss(server)
    figures["rss_mib"] = rss / MiB
    figures["rss_per_stream_bytes"] = (rss - empty) / streams
    server.kill()
    print(json.dumps({"src": server.src or "this tree", **figures}), flush=True)
    return figures


def bench(src: str | None, origin: Path, work: Path, args: argparse.Namespace) -> dict:
    data_dir = work / ("baseline" if src else "ours")
    shutil.copytree(origin, data_dir, symlinks=True)
    empty = empty_rss(src, work)
    server = Server(src, data_dir)
    started = server.start()
    server.wait(lambda h: not h.get("recovering"))
    first_start = time.perf_counter() - started
    rss = settled_rss(server)
    server.kill()
    start_figures = {
        "first_start_seconds": first_start,
        "empty_rss_mib": empty / MiB,
        "rss_mib": rss / MiB,
        "rss_per_stream_bytes": (rss - empty) / args.streams,
        "load": os.getloadavg()[0],
    }
    print(json.dumps({"src": src or "this tree", "start": start_figures}), flush=True)
    rounds = [one_restart(server, args.streams, args.reads, n, empty) for n in range(args.rounds)]
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {**start_figures, "rounds": rounds, "median": medians}


def chart_figures(results: dict) -> dict:
    base, ours = results["baseline"]["median"], results["ours"]["median"]
    groups = [
        {"label": label, "values": {"this server": ours[key], "before": base[key]}}
        for label, key in (
            ("/healthz answers", "healthz_seconds"),
            ("first read", "first_read_seconds"),
            ("all recovered", "all_recovered_seconds"),
        )
    ]
    return {
        "title": "Restart after SIGKILL (bench/restart_bench.py)",
        "panels": [
            {
                "title": f"{results['streams']:,} streams: seconds after the restart",
                "unit": "seconds",
                "higher_is_better": False,
                "ours": ["this server"],
                "baselines": ["before"],
                "groups": groups,
            },
            {
                "title": "the server's CPU seconds (robust on a loaded machine)",
                "unit": "CPU seconds",
                "higher_is_better": False,
                "ours": ["this server"],
                "baselines": ["before"],
                "groups": [
                    {"label": label, "values": {"this server": ours[key], "before": base[key]}}
                    for label, key in (
                        ("until /healthz", "healthz_cpu_seconds"),
                        ("until all recovered", "all_recovered_cpu_seconds"),
                    )
                ],
            },
        ],
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--baseline-src", required=True, help="checkout of the server before")
    parser.add_argument("--dir", default=None, help="data directory to reuse (made if missing)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        work = Path(tmp)
        origin = Path(args.dir) if args.dir else work / "origin"
        if not (origin / "streams").is_dir():
            asyncio.run(populate(origin, args.streams))
        results = {
            "streams": args.streams,
            "baseline": bench(args.baseline_src, origin, work, args),
            "ours": bench(None, origin, work, args),
        }
        # Before the copies are removed (minutes, for 200,000 directories on a loaded machine).
        print(json.dumps(results, indent=1), flush=True)
        import charts

        charts.record(
            "restart",
            chart_figures(results),
            full=args.streams >= 100_000,
            command=" ".join(sys.argv),
        )


if __name__ == "__main__":
    main()
