"""SIGKILL a real server while producers append to many streams at once, restart it, and check every stream.

This is the load the shared write-ahead log exists for (``storage/wal.py``, ``storage/committer.py``): small
appends of many streams made durable by one WAL sync per commit round, their segment files synced only by
later checkpoints. Under steady load no checkpoint runs, so the kill always lands with a WAL file holding
acknowledged appends whose segment bytes were never synced. Each round checks, per stream: every
acknowledged append is present exactly once, an unacknowledged one at most once, retries of acknowledged
appends are duplicates (204), per-producer sequences have no gap.

The second round also plays a power loss: a process crash leaves the page cache (the segments whole), so
the test cuts every segment file back to where the WAL's entries for it begin, which is what the disk may
hold when nothing after the last checkpoint reached it. The start-up replay must put it all back.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from pathlib import Path

import pytest
import requests

from durastream_server.storage import wal
from durastream_server.storage.segments import segment_name
from tests.server.test_crash import JSON, _producer_loop, _read_all_messages
from tests.support.server_process import kill_under_load

STREAMS = 12
ACKS_PER_ROUND = 240


def _lose_what_the_wal_holds(data_dir: Path) -> int:
    """Truncate each segment file to the first byte any WAL entry puts there; the number of files cut."""
    starts: dict[Path, int] = {}
    directory = data_dir / wal.WAL_DIR
    for generation in wal.generations(directory):
        for log_id, segment, offset, _ in wal.read_entries(
            directory / wal.wal_name(generation), generation
        ):
            path = data_dir / "streams" / log_id / segment_name(segment)
            starts[path] = min(offset, starts.get(path, offset))
    for path, offset in starts.items():
        assert os.path.getsize(path) > offset
        os.truncate(path, offset)
    return len(starts)


def _retry(url: str, pid: str, seq: int, body: str) -> int:
    headers = {
        "Content-Type": JSON,
        "Producer-Id": pid,
        "Producer-Epoch": "0",
        "Producer-Seq": str(seq),
    }
    return requests.post(url, data=body, headers=headers, timeout=10).status_code


@pytest.mark.parametrize(
    "extra", [(), ("--no-packed-appends",)], ids=["packed-appends", "directories"]
)
def test_sigkill_during_appends_to_many_streams(server_factory, extra: tuple[str, ...]) -> None:
    """Both layouts: with packed appends (the default) the small appends are WAL entries only (no
    segment to cut at the power loss: the WAL file and packs are the synced truth); with
    ``--no-packed-appends`` each stream has its directory and the WAL puts its segments back."""
    server = server_factory(extra_args=extra)
    urls = [server.stream_url(f"crash/many/{n}") for n in range(STREAMS)]
    for url in urls:
        assert requests.put(url, headers={"Content-Type": JSON}).status_code == 201
    everything: dict[str, list] = {url: [] for url in urls}  # (pid, seq, body) acked or retried
    for round_ in range(3):
        acked: dict[str, list] = {url: [] for url in urls}
        unacked: dict[str, list] = {url: [] for url in urls}
        stop = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            futures = [
                pool.submit(_producer_loop, url, f"r{round_}s{n}", stop, acked[url], unacked[url])
                for n, url in enumerate(urls)
            ]
            kill_under_load(
                server,
                futures,
                stop,
                lambda acked=acked: sum(map(len, acked.values())),
                ACKS_PER_ROUND,
                "appends",
            )
        assert list((server.data_dir / wal.WAL_DIR).glob("*.wal")), "no WAL under load"
        if round_ == 1:
            cut = _lose_what_the_wal_holds(server.data_dir)
            assert cut >= 1 if extra else cut == 0
        server.restart()

        for url in urls:
            for pid, seq, body in acked[url][-3:]:
                assert _retry(url, pid, seq, body) == 204, (url, pid, seq)
            for pid, seq, body in unacked[url]:
                assert _retry(url, pid, seq, body) in (200, 204), (url, pid, seq)
            everything[url] += acked[url] + unacked[url]
            keys = [(m["p"], m["seq"]) for m in _read_all_messages(url)]
            assert len(keys) == len(set(keys)), f"duplicate message in {url} after the crash"
            missing = {(pid, seq) for pid, seq, _ in everything[url]} - set(keys)
            assert not missing, f"acknowledged or retried appends lost in {url}: {sorted(missing)}"
            for pid in {p for p, _ in keys}:
                seqs = [s for p, s in keys if p == pid]
                assert seqs == list(range(len(seqs))), (url, pid)
