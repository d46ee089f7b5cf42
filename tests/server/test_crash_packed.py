"""SIGKILL a real server around packed creates (decision 0010, ``storage/packs.py``), restart, check.

A ``PUT`` without a body (not a fork) is *packed*: acknowledged once its WAL entry is synced, with no
directory at all; at its checkpoint it is copied into ``packs/<generation>.pack``. Its first write
promotes it to a directory (``storage/promotion.py``). These tests kill the server before and after the
checkpoint, during promotions, and after the WAL file holding a delete (or a promotion) was retired while
the pack holding the original create is still kept: every acknowledged stream must come back once, with
its metadata and exactly its acknowledged data, and nothing deleted may come back.

The tests of step 1's promotion at the first write run with ``--no-packed-appends`` (with packed
appends, the default, a first small write keeps the stream packed); the last two test packed appends.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path

import requests

from durastream_server.storage import packs, wal
from tests.server.test_crash import JSON, _read_all_messages
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess, kill_under_load

CLIENTS = 6
ACKS = 150


def _pack_files(server: ServerProcess) -> list[Path]:
    directory = server.data_dir / packs.PACKS_DIR
    return sorted(directory.glob("*.pack")) if directory.is_dir() else []


def _wal_files(server: ServerProcess) -> list[Path]:
    return sorted((server.data_dir / wal.WAL_DIR).glob("*.wal"))


def _checkpointed(server: ServerProcess) -> None:
    """Until the idle checkpoint has retired every WAL file (polled, with a deadline)."""
    poll_until(lambda: not _wal_files(server), "the idle checkpoint", timeout=30)


def _put(server: ServerProcess, path: str, **headers: str) -> None:
    response = requests.put(
        server.stream_url(path), headers={"Content-Type": JSON, **headers}, timeout=10
    )
    assert response.status_code == 201, (path, response.status_code, response.text)


def _post(server: ServerProcess, path: str, body: str) -> None:
    response = requests.post(
        server.stream_url(path), data=body, headers={"Content-Type": JSON}, timeout=10
    )
    assert response.status_code in (200, 204), (path, response.status_code, response.text)


def _status(server: ServerProcess, path: str) -> int:
    return requests.head(server.stream_url(path), timeout=10).status_code


def _directories(server: ServerProcess) -> set[str]:
    return {p.name for p in (server.data_dir / "streams").iterdir()}


def _create_loop(base: str, client: int, stop: threading.Event, acked: list, unacked: list) -> None:
    n = 0
    with requests.Session() as session:
        while not stop.is_set():
            url = f"{base}/c{client}/{n}"
            headers = {"Content-Type": "text/plain" if n % 2 else JSON}
            if n % 3 == 0:
                headers["Stream-TTL"] = "3600"
            try:
                response = session.put(url, headers=headers, timeout=10)
            except requests.RequestException:
                unacked.append(url)
                return
            (acked if response.status_code == 201 else unacked).append(url)
            if response.status_code != 201:
                return
            n += 1


def test_sigkill_before_and_after_the_checkpoint_brings_every_packed_create_back(
    server_factory,
) -> None:
    server = server_factory()
    # After the checkpoint: the creates live in a pack, the WAL is empty.
    _put(server, "after/json")
    _put(server, "after/ttl", **{"Stream-TTL": "3600"})
    _put(server, "after/expires", **{"Stream-Expires-At": "2099-01-01T00:00:00Z"})
    requests.put(
        server.stream_url("after/text"), headers={"Content-Type": "text/plain"}, timeout=10
    ).raise_for_status()
    _checkpointed(server)
    assert _pack_files(server), "the WAL file holding live packed creates was not kept"
    assert not _directories(server), "a packed create made a directory"
    heads = {
        p: requests.head(server.stream_url(f"after/{p}"), timeout=10).headers
        for p in ("json", "ttl", "expires", "text")
    }
    server.kill()
    server.restart()
    for name, before in heads.items():
        after = requests.head(server.stream_url(f"after/{name}"), timeout=10)
        assert after.status_code == 200, name
        for key in ("Content-Type", "Stream-Next-Offset", "Stream-TTL", "Stream-Expires-At"):
            assert after.headers.get(key) == before.get(key), (name, key)
    assert _read_all_messages(server.stream_url("after/json")) == []
    # Before the checkpoint: killed while clients create (the WAL is live).
    acked: list[list[str]] = [[] for _ in range(CLIENTS)]
    unacked: list[list[str]] = [[] for _ in range(CLIENTS)]
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        futures = [
            pool.submit(_create_loop, server.stream_url("before"), c, stop, acked[c], unacked[c])
            for c in range(CLIENTS)
        ]
        kill_under_load(server, futures, stop, lambda: sum(map(len, acked)), ACKS, "packed creates")
    assert _wal_files(server), "no WAL under load"
    server.restart()
    health = server.health()
    assert health["quarantined"] == []
    for urls in acked:
        for n, url in enumerate(urls):
            response = requests.head(url, timeout=10)
            assert response.status_code == 200, url
            assert response.headers["Content-Type"].startswith("text/plain" if n % 2 else JSON)
            assert (response.headers.get("Stream-TTL") == "3600") == (n % 3 == 0), url
            assert response.headers["Stream-Next-Offset"] == heads["json"]["Stream-Next-Offset"]
    for urls in unacked:
        for url in urls:
            assert requests.head(url, timeout=10).status_code in (200, 404), url
    total = sum(map(len, acked))
    assert health["packed_streams"] >= total + 4
    assert not _directories(server)
    # None duplicated: a listing names each path once.
    listing = requests.get(server.base_url + "/v1/stream/", timeout=10)
    if listing.status_code == 200:
        paths = [entry["path"] for entry in listing.json().get("streams", [])]
        assert len(paths) == len(set(paths))


def test_a_deleted_or_promoted_packed_stream_stays_so_after_its_wal_file_is_retired(
    server_factory,
) -> None:
    server = server_factory(extra_args=("--no-packed-appends",))
    for name in ("keep", "gone", "grown", "grown-then-gone"):
        _put(server, f"t/{name}")
    _checkpointed(server)
    [pack] = _pack_files(server)
    requests.delete(server.stream_url("t/gone"), timeout=10).raise_for_status()
    _post(server, "t/grown", '{"n":1}')
    _post(server, "t/grown-then-gone", '{"n":2}')
    _checkpointed(server)  # the WAL file with the DROP and the promotions is retired
    requests.delete(server.stream_url("t/grown-then-gone"), timeout=10).raise_for_status()
    _checkpointed(server)  # ... and the one with the promoted stream's delete
    assert _pack_files(server) == [pack], "the pack went while a packed create in it is live"
    server.kill()
    server.restart()
    assert _status(server, "t/keep") == 200
    assert _status(server, "t/gone") == 404
    assert _status(server, "t/grown-then-gone") == 404
    assert _read_all_messages(server.stream_url("t/grown")) == [{"n": 1}]
    assert _read_all_messages(server.stream_url("t/keep")) == []
    # Once more, after a second restart (start-up itself retired nothing it should keep).
    server.kill()
    server.restart()
    assert _status(server, "t/gone") == 404 and _status(server, "t/grown-then-gone") == 404
    assert _read_all_messages(server.stream_url("t/grown")) == [{"n": 1}]


def _promote_loop(
    server: ServerProcess, names: list[str], stop: threading.Event, acked: list, unacked: list
) -> None:
    with requests.Session() as session:
        for name in names:
            if stop.is_set():
                return
            try:
                response = session.post(
                    server.stream_url(name),
                    data=f'{{"p":"{name}"}}',
                    headers={"Content-Type": JSON},
                    timeout=10,
                )
            except requests.RequestException:
                unacked.append(name)
                return
            (acked if response.status_code in (200, 204) else unacked).append(name)


def test_sigkill_during_promotions_leaves_each_stream_once_with_its_write_or_without_it(
    server_factory,
) -> None:
    server = server_factory(extra_args=("--no-packed-appends",))
    names = [f"p/{c}/{n}" for c in range(CLIENTS) for n in range(120)]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda name: _put(server, name), names))
    acked: list[list[str]] = [[] for _ in range(CLIENTS)]
    unacked: list[list[str]] = [[] for _ in range(CLIENTS)]
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        futures = [
            pool.submit(
                _promote_loop, server, names[c * 120 : (c + 1) * 120], stop, acked[c], unacked[c]
            )
            for c in range(CLIENTS)
        ]
        kill_under_load(server, futures, stop, lambda: sum(map(len, acked)), 200, "promotions")
    server.restart()
    assert server.health()["quarantined"] == []
    acked_names = {n for names_ in acked for n in names_}
    for name in names:
        messages = _read_all_messages(server.stream_url(name))
        if name in acked_names:
            assert messages == [{"p": name}], name
        else:
            assert messages in ([], [{"p": name}]), name
    assert not list((server.data_dir / "staging").iterdir())
    # Every promoted stream has exactly one directory, and the rest none.
    directories = _directories(server)
    assert len(directories) >= len(acked_names)
    assert len(directories) + server.health()["packed_streams"] == len(names)


def test_a_pack_whose_streams_are_all_promoted_or_deleted_is_removed(server_factory) -> None:
    server = server_factory(extra_args=("--no-packed-appends",))
    for name in ("a", "b", "c"):
        _put(server, f"r/{name}")
    _checkpointed(server)
    assert len(_pack_files(server)) == 1
    poll_until(lambda: server.health()["packs_bytes"] > 0, "the pack in /healthz", timeout=30)
    requests.delete(server.stream_url("r/a"), timeout=10).raise_for_status()
    _post(server, "r/b", '{"b":1}')
    _post(server, "r/c", '{"c":1}')
    # The pack goes first, then its sidecars (``.dead``, ``.idx``), each its own unlink: wait for all.
    poll_until(
        lambda: not list((server.data_dir / packs.PACKS_DIR).iterdir()),
        "the empty pack and its sidecars to be removed",
        timeout=30,
    )
    poll_until(
        lambda: (server.health()["packs_bytes"], server.health()["packed_streams"]) == (0, 0),
        "/healthz to report no pack",
        timeout=30,
    )
    server.kill()
    server.restart()
    assert _status(server, "r/a") == 404
    assert _read_all_messages(server.stream_url("r/b")) == [{"b": 1}]


def _post_loop(
    server: ServerProcess,
    names: list[str],
    stop: threading.Event,
    acked: list,
    request: Callable[[str, int], tuple[str, dict[str, str], int]],
) -> None:
    """POST to ``names`` in turn until ``stop``: ``request(name, n)`` gives the body, the headers and
    what to record; ``acked``: (name, record) of each answered one."""
    n = 0
    with requests.Session() as session:
        while not stop.is_set():
            name = names[n % len(names)]
            body, headers, record = request(name, n)
            try:
                response = session.post(
                    server.stream_url(name),
                    data=body,
                    headers={"Content-Type": JSON, **headers},
                    timeout=10,
                )
            except requests.RequestException:
                return
            if response.status_code not in (200, 204):
                return
            acked.append((name, record))
            n += 1


def _append_loop(
    server: ServerProcess, names: list[str], stop: threading.Event, acked: list
) -> None:
    """Append to ``names`` in turn (about 2 KB each) until ``stop``; ``acked``: (name, n) answered."""
    padding = "x" * 2000
    _post_loop(server, names, stop, acked, lambda _, n: (f'{{"n":{n},"pad":"{padding}"}}', {}, n))


def test_one_unused_packed_stream_keeps_only_its_entry_through_checkpoints_and_a_sigkill(
    server_factory,
) -> None:
    """Streams created together with one that is never written, then appended to through several
    checkpoints (128 promoted segment files each) and SIGKILLed: the unused stream keeps only its own
    entry in packs/ (the WAL files it was created in held everyone's appends, and were kept whole
    before), and every acknowledged append comes back once."""
    server = server_factory(extra_args=("--no-packed-appends",))
    names = [f"u/{c}/{n}" for c in range(CLIENTS) for n in range(60)]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda name: _put(server, name), names[: len(names) // 2]))
        _put(server, "u/unused")
        list(pool.map(lambda name: _put(server, name), names[len(names) // 2 :]))
    acked: list[list[tuple[str, int]]] = [[] for _ in range(CLIENTS)]
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        futures = [
            pool.submit(_append_loop, server, names[c * 60 : (c + 1) * 60], stop, acked[c])
            for c in range(CLIENTS)
        ]
        # Each client's first 60 appends promote its streams: 360 segment files, ~3 checkpoints.
        kill_under_load(server, futures, stop, lambda: sum(map(len, acked)), 1200, "appends")
    server.restart()
    assert server.health()["quarantined"] == []
    assert _status(server, "u/unused") == 200
    assert _read_all_messages(server.stream_url("u/unused")) == []
    assert server.health()["packed_streams"] == 1
    assert sum(p.stat().st_size for p in (server.data_dir / packs.PACKS_DIR).iterdir()) < 4096
    for c in range(CLIENTS):
        for name in names[c * 60 : (c + 1) * 60]:
            got = [m["n"] for m in _read_all_messages(server.stream_url(name))]
            assert len(got) == len(set(got)), name  # nothing twice
            wanted = [n for stream, n in acked[c] if stream == name]
            assert got[: len(wanted)] == wanted, name  # every acknowledged append, in order


def _producer_headers(name: str, seq: int) -> dict[str, str]:
    return {"Producer-Id": f"p-{name}", "Producer-Epoch": "0", "Producer-Seq": str(seq)}


def _packed_append_loop(
    server: ServerProcess, names: list[str], stop: threading.Event, acked: list
) -> None:
    """Small producer appends to ``names`` in turn until ``stop``; ``acked``: (name, seq)."""

    def request(name: str, n: int) -> tuple[str, dict[str, str], int]:
        seq = n // len(names)
        return f'{{"n":{seq}}}', _producer_headers(name, seq), seq

    _post_loop(server, names, stop, acked, request)


def test_sigkill_before_and_after_the_checkpoint_keeps_every_acknowledged_packed_append(
    server_factory,
) -> None:
    """``--packed-appends`` (decision 0010 step 2): small appends to streams created empty stay
    packed records (no directory). SIGKILLed under load (records in the live WAL file), restarted,
    then checkpointed (records carried into packs) and SIGKILLed again: every acknowledged append
    comes back once, in order, the streams stay packed, and a retried append is a duplicate."""
    server = server_factory(extra_args=("--packed-appends",))
    names = [f"pa/{c}/{n}" for c in range(CLIENTS) for n in range(20)]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda name: _put(server, name), names))
    acked: list[list[tuple[str, int]]] = [[] for _ in range(CLIENTS)]
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        futures = [
            pool.submit(_packed_append_loop, server, names[c * 20 : (c + 1) * 20], stop, acked[c])
            for c in range(CLIENTS)
        ]
        kill_under_load(server, futures, stop, lambda: sum(map(len, acked)), 600, "appends")

    def check() -> None:
        assert server.health()["quarantined"] == []
        assert not _directories(server), "a small packed stream got a directory"
        for c in range(CLIENTS):
            for name in names[c * 20 : (c + 1) * 20]:
                got = [m["n"] for m in _read_all_messages(server.stream_url(name))]
                wanted = [seq for stream, seq in acked[c] if stream == name]
                assert got[: len(wanted)] == wanted, name  # every acknowledged append, in order
                assert got == list(range(len(got))), name  # nothing twice, nothing invented

    server.restart()
    check()
    _checkpointed(server)  # the replayed records are in packs now, the WAL is empty
    assert _pack_files(server)
    server.kill()
    server.restart()
    check()
    name = names[0]
    last = len(_read_all_messages(server.stream_url(name))) - 1
    retry = requests.post(
        server.stream_url(name),
        data=f'{{"n":{last}}}',
        headers={"Content-Type": JSON, **_producer_headers(name, last)},
        timeout=10,
    )
    assert retry.status_code == 204, retry.text  # a duplicate: not written again
    assert len(_read_all_messages(server.stream_url(name))) == last + 1


def test_sigkill_while_checkpoints_merge_packed_extents_keeps_every_acknowledged_append(
    server_factory,
) -> None:
    """Step 2c (merging a stream's pack extents): rounds of one small append to each of 60 packed
    streams, each round followed by its (idle) checkpoint, which carries every stream's records: past
    a few rounds the checkpoints merge the streams' older pack entries into the new pack and void them
    (sidecar lines). Once a merge was seen, the server is SIGKILLed as soon as a round's checkpoint
    has renamed its new pack in (before, during or after its sidecar lines and the WAL file's removal),
    restarted, and that three times: every acknowledged append comes back once, in order, and the
    streams stay packed."""
    server = server_factory(extra_args=("--packed-appends",))
    names = [f"pm/{n}" for n in range(60)]
    acked: dict[str, list[int]] = {name: [] for name in names}
    merged = threading.Event()

    def append_round(pool: concurrent.futures.Executor, seq: int) -> None:
        def one(name: str) -> None:
            response = requests.post(
                server.stream_url(name),
                data=f'{{"n":{seq}}}',
                headers={"Content-Type": JSON, **_producer_headers(name, seq)},
                timeout=10,
            )
            assert response.status_code in (200, 204), (name, response.text)
            acked[name].append(seq)

        list(pool.map(one, names))

    def checkpoint_done() -> bool:
        if list((server.data_dir / packs.PACKS_DIR).glob("*.dead")):
            merged.set()  # no drops here: a sidecar line is a merge's
        return not _wal_files(server)

    def check() -> None:
        assert server.health()["quarantined"] == []
        assert not _directories(server), "a small packed stream got a directory"
        for name in names:
            got = [m["n"] for m in _read_all_messages(server.stream_url(name))]
            assert got == acked[name], name  # every acknowledged append, once, in order

    seq = 0
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda name: _put(server, name), names))
        while not merged.is_set():
            assert seq < 40, "no checkpoint merged pack extents"
            append_round(pool, seq)
            seq += 1
            poll_until(checkpoint_done, "the idle checkpoint", timeout=30)
        for _ in range(3):
            before = {p.name for p in _pack_files(server)}
            append_round(pool, seq)
            seq += 1
            poll_until(
                lambda before=before: {p.name for p in _pack_files(server)} - before,
                "the checkpoint's new pack",
                timeout=30,
            )
            server.kill()
            server.restart()
            check()
    _checkpointed(server)
    server.kill()
    server.restart()
    check()


def test_a_stream_crossing_the_packed_threshold_is_promoted_and_reads_back_across_a_sigkill(
    server_factory,
) -> None:
    """``--packed-threshold`` (here 4 KiB): a packed stream whose records would pass it is promoted to
    a directory of its own, with its packed records (some carried into a pack by a checkpoint, some
    in the live WAL file); one that stays below it keeps none. Its messages read back the same
    before and after a SIGKILL and restart, and it keeps taking appends (now into its directory)."""
    server = server_factory(extra_args=("--packed-appends", "--packed-threshold", "4k"))
    _put(server, "grow")
    _put(server, "small")
    body = '{"pad":"' + "x" * 200 + '","n":%d}'
    for seq in range(8):  # ~1.8 KiB: stays packed
        _post(server, "grow", body % seq)
    _post(server, "small", body % 0)
    _checkpointed(server)  # those records are in a pack now
    assert not _directories(server)
    for seq in range(8, 24):  # passes 4 KiB on the way: promoted
        _post(server, "grow", body % seq)
    assert len(_directories(server)) == 1, "the growing stream was not promoted"
    grown = _read_all_messages(server.stream_url("grow"))
    assert [m["n"] for m in grown] == list(range(24))
    small = _read_all_messages(server.stream_url("small"))
    server.kill()
    server.restart()
    assert server.health()["quarantined"] == []
    assert _read_all_messages(server.stream_url("grow")) == grown
    assert _read_all_messages(server.stream_url("small")) == small
    assert len(_directories(server)) == 1  # the small one is still packed
    _post(server, "grow", body % 24)
    assert [m["n"] for m in _read_all_messages(server.stream_url("grow"))] == list(range(25))


def test_a_damaged_last_pack_entry_quarantines_its_stream_across_sigkills(server_factory) -> None:
    """The pack index (decision 0010, "Step 2: the pack index"): after a SIGKILL, one byte flipped in
    the *last* packed entry of one stream (its id is under the failed CRC) quarantines that stream,
    by the index's word: 5xx for its path (never its records before the damage), listed by
    ``/healthz``, at every later start-up; the other streams of the same pack serve whole."""
    from durastream_server.storage import packindex

    server = server_factory()
    names = [f"idx/{n}" for n in range(3)]
    for name in names:
        _put(server, name)
    for n in range(2):
        for name in names:
            _post(server, name, f'{{"n":{n}}}')
    _checkpointed(server)
    server.kill()
    directory = server.data_dir / packs.PACKS_DIR
    indexed = {}  # pack -> its index's rows
    for found in _pack_files(server):
        rows = packindex.read(directory, int(found.name.split(".")[0]), found.stat().st_size)
        assert rows is not None, found
        indexed[found] = rows
    [victim_id] = {
        r.log_id for rs in indexed.values() for r in rs if r.path and r.path.endswith(names[1])
    }
    pack, victim = [
        (found, r)
        for found, rs in indexed.items()
        for r in rs
        if r.log_id == victim_id and r.kind == wal.Kind.PACKED_RECORDS
    ][-1]  # its last records entry
    data = bytearray(pack.read_bytes())
    data[victim.offset + victim.length - 3] ^= 0xFF  # inside its last record
    pack.write_bytes(bytes(data))
    for _ in range(2):
        server.restart()
        served = {}
        for name in names:
            response = requests.get(server.stream_url(name), params={"offset": "-1"}, timeout=10)
            served[name] = response.status_code
            if response.status_code == 200:
                assert [m["n"] for m in response.json()] == [0, 1], name
        assert served == {names[0]: 200, names[1]: served[names[1]], names[2]: 200}
        assert served[names[1]] >= 500, served
        assert [q["path"] for q in server.health()["quarantined"]] == [names[1]]
        server.kill()
