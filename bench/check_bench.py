"""Throughput of ``durastream-server check``: fill a data directory through a real server (many small
streams and a few large ones), stop it, and time the check (docs/server.md, "Checking a data directory").

    python bench/check_bench.py --small-streams 2000 --large-streams 4 --large-mib 64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests.support.server_process import ServerProcess

TEXT = {"Content-Type": "text/plain"}


def fill(server: ServerProcess, small: int, large: int, large_mib: int) -> None:
    session = requests.Session()

    def small_stream(i: int) -> None:
        url = server.stream_url(f"small/{i}")
        session.put(url, headers=TEXT, timeout=30)
        for _ in range(10):
            session.post(url, data=b"m" * 200, headers=TEXT, timeout=30)

    def large_stream(i: int) -> None:
        url = server.stream_url(f"large/{i}")
        requests.put(url, headers=TEXT, timeout=30)
        chunk = os.urandom(1024 * 1024)
        for _ in range(large_mib):
            requests.post(url, data=chunk, headers=TEXT, timeout=60)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(small_stream, range(small)))
        list(pool.map(large_stream, range(large)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small-streams", type=int, default=2000)
    parser.add_argument("--large-streams", type=int, default=4)
    parser.add_argument("--large-mib", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "data")
        server.start()
        try:
            fill(server, args.small_streams, args.large_streams, args.large_mib)
        finally:
            server.terminate()
        started = time.perf_counter()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "durastream_server",
                "check",
                "--json",
                "--data-dir",
                str(server.data_dir),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - started
        report = json.loads(result.stdout)
        mb = report["bytes_read"] / 1e6
        print(
            f"check: exit {result.returncode}, {len(report['streams'])} streams, {mb:.0f} MB; "
            f"{report['seconds']:.2f} s reading ({mb / report['seconds']:.0f} MB/s), "
            f"{wall:.2f} s wall with start-up; load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
