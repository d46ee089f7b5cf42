"""``bench/server_bench.py``'s small-append benchmarks, run small against our server: every one of the
64 producers' requests must be answered 200 (the benchmark raises otherwise) and each stream must then
hold exactly the messages its producers were told were appended. No timing is asserted; the figures
come from the full runs (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import server_bench as sb  # noqa: E402

TINY = dataclasses.replace(sb.QUICK, small_seconds=0.3)


@pytest.mark.parametrize(("streams", "messages"), [(sb.SMALL_PRODUCERS, 1), (1, 8)])
def test_small_appends_benchmark_runs_and_every_acknowledged_message_is_stored(
    tmp_path: Path, streams: int, messages: int
) -> None:
    server = sb.Server(sb.OURS, tmp_path)
    server.start()
    try:
        result = asyncio.run(
            sb.bench_small_appends(server, TINY, streams=streams, messages=messages)
        )
        assert result["messages_per_s"] > 0
        stored = 0
        for i in range(streams):
            batch = _read_all(f"http://127.0.0.1:{server.port}/v1/stream/bench-small-{i:03d}")
            keys = [(m["producer"], m["i"]) for m in batch]
            assert all(len(json.dumps(m, separators=(",", ":"))) == 200 for m in batch)
            stored += len(batch)
            assert {p % streams for p, _ in keys} <= {i}  # producer p writes stream p % streams
        # Every request of the warm-up and the counted phase was acknowledged and is there, once.
        assert stored % messages == 0 and stored >= messages * sb.SMALL_PRODUCERS
    finally:
        server.stop()


def _read_all(url: str) -> list[dict]:
    messages: list[dict] = []
    offset = "-1"
    while True:
        with urllib.request.urlopen(f"{url}?offset={offset}", timeout=30) as response:
            messages += json.loads(response.read())
            offset = response.headers["Stream-Next-Offset"]
            if response.headers.get("Stream-Up-To-Date") == "true":
                return messages
