"""SIGKILL a real server while clients create streams (``PUT`` with a body), restart it, and check them.

Creates ride the shared commit rounds (``storage/committer.py``): a create is acknowledged once its first
segment is synced in the write-ahead log, and its directory is made afterwards, unsynced. So the kill lands
with acknowledged creates whose directories and segments exist only because of the WAL (their checkpoint
has not run). Every acknowledged create must be there after the restart with its body, once; an
unacknowledged one either whole or absent (404), never half; nothing is quarantined; and a round also plays
a power loss: the new streams' directories are taken away, and the start-up replay must make them again.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
from pathlib import Path

import requests

from durastream_server.storage import wal
from tests.server.test_crash import JSON, _read_all_messages
from tests.support.server_process import kill_under_load

CLIENTS = 8
ACKS_PER_ROUND = 200


def _create_loop(
    base: str, client: int, stop: threading.Event, acked: list[str], unacked: list[str]
) -> None:
    n = 0
    with requests.Session() as session:
        while not stop.is_set():
            url = f"{base}/crash/creates/c{client}/{n}"
            try:
                response = session.put(
                    url,
                    data=f'{{"c":{client},"n":{n}}}',
                    headers={"Content-Type": JSON},
                    timeout=10,
                )
            except requests.RequestException:
                unacked.append(url)
                return
            if response.status_code != 201:
                unacked.append(url)
                return
            acked.append(url)
            n += 1


def _check(url: str, *, acknowledged: bool) -> None:
    response = requests.head(url, timeout=10)
    if response.status_code == 404 and not acknowledged:
        return
    assert response.status_code == 200, (url, response.status_code)
    client, n = url.rsplit("/c", 1)[1].split("/")
    assert _read_all_messages(url) == [{"c": int(client), "n": int(n)}], url


def _lose_new_directories(data_dir: Path) -> int:
    """A power loss after the WAL sync and before any checkpoint: the new streams' names are gone."""
    streams = data_dir / "streams"
    lost = 0
    for generation in wal.generations(data_dir / wal.WAL_DIR):
        path = data_dir / wal.WAL_DIR / wal.wal_name(generation)
        for log_id, _, _, _, kind in wal.read_kinds(path, generation):
            if kind == wal.Kind.CREATE and (streams / log_id).exists():
                shutil.rmtree(streams / log_id)
                lost += 1
    return lost


def test_sigkill_during_concurrent_creates(server_factory) -> None:
    # Creates with a body that make a directory: without packed appends (with them, a small body
    # is a packed create: tests/server/test_crash_put_body.py).
    server = server_factory(extra_args=("--no-packed-appends",))
    for round_ in range(2):
        acked: list[list[str]] = [[] for _ in range(CLIENTS)]
        unacked: list[list[str]] = [[] for _ in range(CLIENTS)]
        stop = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            futures = [
                pool.submit(
                    _create_loop, server.stream_url(f"r{round_}"), c, stop, acked[c], unacked[c]
                )
                for c in range(CLIENTS)
            ]
            kill_under_load(
                server,
                futures,
                stop,
                lambda acked=acked: sum(map(len, acked)),
                ACKS_PER_ROUND,
                "creates",
            )
        assert list((server.data_dir / wal.WAL_DIR).glob("*.wal")), "no WAL under load"
        if round_ == 1:
            assert _lose_new_directories(server.data_dir) >= 1
        server.restart()
        assert server.health()["quarantined"] == []
        for urls in acked:
            for url in urls:
                _check(url, acknowledged=True)
        for urls in unacked:
            for url in urls:
                _check(url, acknowledged=False)
