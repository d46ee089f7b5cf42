"""Forks across shards on ``--workers 2`` (``shards/forks.py``): created in their source's shard.

A fork whose path hashes to the other shard than its source's is created in its source's shard; its
home (the shard its path hashes to) records where it lives, durably, and forwards its requests there.
The same sequence of requests (creates, forks, forks of forks homed in either shard, appends, reads,
listing, change feed, multi-range reads, bulk ``ensure`` and ``commits``, deletes of source and fork,
a path created again) runs against one process and
against ``--workers 2``; every answer (status, body, offsets, error code) must be the same. Then each
worker is SIGKILLed in turn, and the whole server restarted: every fork is still found and reads the
same.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from durastream_server.http import bulk
from durastream_server.shards.layout import shard_of
from tests.server.subscriptions.test_end_to_end import Api, unique, wait_until
from tests.server.workers.test_bulk import _inline, _post
from tests.server.workers.test_multirange import _walk
from tests.server.workers.test_subscriptions import _claim_all, _sub_of_shard, subscriptions_ready
from tests.server.workers.test_workers import WORKERS, kill_and_await_workers, worker_of_shard
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

TEXT = {"Content-Type": "text/plain"}


def _of_shard(prefix: str, shard: int) -> str:
    while True:
        path = f"{prefix}/{uuid.uuid4().hex[:8]}"
        if shard_of(path, 2) == shard:
            return path


def _layout() -> dict[str, str]:
    """A source in shard 0, its fork homed in shard 1, forks of that fork homed in each shard."""
    prefix = f"fk-{uuid.uuid4().hex[:8]}"
    return {
        "prefix": prefix,
        "source": _of_shard(prefix, 0),
        "fork": _of_shard(prefix, 1),
        "fork_of_fork_home_0": _of_shard(prefix, 0),
        "fork_of_fork_home_1": _of_shard(prefix, 1),
        "missing": _of_shard(prefix, 1),
        "orphan": _of_shard(prefix, 1),
        "ensured": _of_shard(prefix, 1),
    }


def _seen(answer: requests.Response) -> tuple[Any, ...]:
    """What must match one process: status, body (an error's code, not its wording), offset."""
    body: Any = answer.content
    if answer.status_code >= 400 and answer.content:
        body = json.loads(answer.content)["error"]["code"]
    return answer.status_code, body, answer.headers.get("Stream-Next-Offset")


def _scenario(server: ServerProcess, at: dict[str, str]) -> list[tuple[Any, ...]]:
    url = server.stream_url
    source, fork = at["source"], at["fork"]

    def put_fork(path: str, of: str, **headers: str) -> requests.Response:
        return requests.put(
            url(path), headers={**TEXT, "Stream-Forked-From": f"/v1/stream/{of}", **headers}
        )

    def read(path: str) -> requests.Response:
        return requests.get(url(path), params={"offset": "-1"})

    seen = [
        _seen(requests.put(url(source), data=b"abc", headers=TEXT)),
        _seen(requests.post(url(source), data=b"def", headers=TEXT)),
        _seen(put_fork(fork, source)),
        _seen(read(fork)),
        _seen(requests.head(url(fork))),
        _seen(requests.post(url(fork), data=b"ghi", headers=TEXT)),
        _seen(requests.post(url(source), data=b"jkl", headers=TEXT)),
        _seen(read(fork)),
        _seen(read(source)),
        _seen(put_fork(fork, source)),  # the same create again: idempotent
        _seen(put_fork(at["fork_of_fork_home_0"], fork)),
        _seen(put_fork(at["fork_of_fork_home_1"], fork)),
        _seen(read(at["fork_of_fork_home_0"])),
        _seen(read(at["fork_of_fork_home_1"])),
        _seen(put_fork(at["missing"], f"{at['prefix']}/no-such-source")),
        _seen(put_fork(at["orphan"], source, **{"Content-Type": "application/json"})),
        _seen(read(at["orphan"])),
    ]
    # from new connections (the kernel spreads them over both workers): the same answer each time
    seen += [("from any worker", len({_seen(read(fork)) for _ in range(8)}))]
    listing = requests.get(
        url("__ds/x-durastream/streams"), params={"prefix": at["prefix"] + "/"}
    ).json()
    seen.append(("listed", [item["path"] for item in listing["streams"]]))
    seen.append(("changed", sorted(_changed_paths(server, {"prefix": at["prefix"] + "/"}))))
    chosen = [fork, at["fork_of_fork_home_1"], source]
    selection = requests.post(url("__ds/x-durastream/selections"), json={"streams": chosen}).json()[
        "selection"
    ]
    seen.append(("selected", sorted(_changed_paths(server, {"selection": selection}))))
    # requests naming many streams are split by where each lives: the fork's part goes to its holder
    deeper = at["fork_of_fork_home_1"]
    tails = {p: requests.head(url(p)).headers["Stream-Next-Offset"] for p in (fork, source, deeper)}
    ranges = [{"path": p, "offset": "-1", "end": tail} for p, tail in tails.items()]
    seen.append(("reads", _walk(server, ranges, "frames")))
    ensured = _post(
        server,
        "ensure",
        json={"streams": [fork, at["ensured"]], "content_type": TEXT["Content-Type"]},
    )
    seen.append(("ensure", ensured.status_code, ensured.json()))
    commits = _post(server, "commits", data=bulk.encode_requests([_inline(fork, b"+bulk", "p-f")]))
    seen.append(("commits", commits.status_code, commits.json()))
    seen.append(_seen(read(fork)))
    seen += [
        _seen(requests.delete(url(source))),
        _seen(read(source)),
        _seen(read(fork)),  # kept for its forks
        _seen(requests.delete(url(fork))),
        _seen(read(fork)),
        _seen(read(at["fork_of_fork_home_1"])),
        _seen(requests.put(url(fork), data=b"new", headers=TEXT)),  # the path again, not a fork
        _seen(requests.post(url(fork), data=b"!", headers=TEXT)),
        _seen(read(fork)),
    ]
    listing = requests.get(
        url("__ds/x-durastream/streams"), params={"prefix": at["prefix"] + "/"}
    ).json()
    seen.append(("listed after", [item["path"] for item in listing["streams"]]))
    return seen


def _changed_paths(server: ServerProcess, query: dict[str, str]) -> list[str]:
    """Every path the change feed names for ``query``, paging until ``more`` is false."""
    found: list[str] = []
    params = dict(query)
    while True:
        page = requests.get(server.stream_url("__ds/x-durastream/changes"), params=params).json()
        found += [change["path"] for change in page["changes"]]
        if not page["more"]:
            return found
        params["since"] = page["cursor"]


def test_forks_across_shards_answer_as_one_process(server_factory) -> None:  # type: ignore[no-untyped-def]
    at = _layout()
    one = _scenario(server_factory(), at)
    workers = server_factory(extra_args=WORKERS)
    assert _scenario(workers, at) == one
    assert one[2][0] == 201 and one[3][1] == b"abcdef"  # the scenario did fork


def test_placement_survives_sigkill_of_either_worker_and_a_restart(server_factory) -> None:  # type: ignore[no-untyped-def]
    at = _layout()
    workers = server_factory(extra_args=WORKERS)
    url = workers.stream_url
    source, fork, deeper = at["source"], at["fork"], at["fork_of_fork_home_0"]
    assert requests.put(url(source), data=b"abc", headers=TEXT).status_code == 201
    for path, of in ((fork, source), (deeper, fork)):
        created = requests.put(
            url(path), headers={**TEXT, "Stream-Forked-From": f"/v1/stream/{of}"}
        )
        assert created.status_code == 201, created.text
    assert requests.post(url(fork), data=b"+f", headers=TEXT).status_code == 204
    expected = {source: b"abc", fork: b"abc+f", deeper: b"abc"}

    def reads_back() -> bool:
        try:
            return all(
                requests.get(url(path), params={"offset": "-1"}).content == body
                for path, body in expected.items()
            )
        except requests.ConnectionError:
            return False

    for shard in (0, 1):  # the fork's home (1), then the shard holding it (0)
        pid = worker_of_shard(workers, 1 - shard)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        poll_until(
            reads_back, f"every fork read back after shard {1 - shard}'s SIGKILL", timeout=60
        )
    kill_and_await_workers(workers)  # not restart(): an orphan could answer, then reset
    workers.start()
    poll_until(reads_back, "every fork read back after a restart", timeout=60)
    # the fork's path still lives in its source's shard: appended to, read from any worker
    assert requests.post(url(fork), data=b"!", headers=TEXT).status_code == 204
    for _ in range(6):
        assert requests.get(url(fork), params={"offset": "-1"}).content == b"abc+f!"


def test_a_subscription_keeps_a_fork_held_in_another_shard_than_its_home(server_factory) -> None:  # type: ignore[no-untyped-def]
    """The owner (shard 0) holds the fork (homed in shard 1) itself: the other shard's snapshots,
    at start and after its worker is SIGKILLed, must not take the fork for deleted."""
    at = _layout()
    workers = server_factory(extra_args=WORKERS)
    subscriptions_ready(workers)
    api = Api(workers)
    source, fork = at["source"], at["fork"]
    api.create_stream(source, {"n": 0})
    created = requests.put(
        workers.stream_url(fork),
        headers={"Content-Type": "application/json", "Stream-Forked-From": f"/v1/stream/{source}"},
    )
    assert created.status_code == 201, created.text
    wake = unique("wake/forks")
    api.create_stream(wake, [])
    sub_id = _sub_of_shard("forks", 0)
    config = {"type": "pull-wake", "pattern": f"{at['prefix']}/*", "wake_stream": wake}
    assert api.put_sub(sub_id, {**config, "lease_ttl_ms": 600_000}).status_code == 201
    tail = api.append(fork, {"n": 1})
    claimed = wait_until(
        lambda: _claim_all(api, sub_id, [fork]), timeout=15.0, what="a claim naming the fork"
    )
    acks = [{"stream": item["path"], "offset": item["tail_offset"]} for item in claimed["streams"]]
    body = {"wake_id": claimed["wake_id"], "generation": claimed["generation"], "done": True}
    done = api.post(sub_id, "ack", {**body, "acks": acks}, claimed["token"])
    assert done.status_code == 200, done.text
    assert api.acked(sub_id, fork) == tail
    pid = worker_of_shard(workers, 1)  # the fork's home: its snapshot is read again
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    def served_again() -> bool:
        try:
            answered = requests.get(api.sub(sub_id)).status_code == 200
        except requests.ConnectionError:  # a connection the SIGKILLed worker held
            return False
        return answered and worker_of_shard(workers, 1) not in (None, pid)

    poll_until(served_again, "the subscription served again", timeout=60)
    subscriptions_ready(workers)
    assert api.acked(sub_id, fork) == tail  # still linked, its ack kept


def test_with_auth_tokens_a_fork_across_shards_needs_the_clients_token(server_factory) -> None:  # type: ignore[no-untyped-def]
    at = _layout()
    token = "forks-writer-0123456789abcdef"
    workers = server_factory(extra_args=(*WORKERS, "--auth-token", token))
    url = workers.stream_url
    auth = {**TEXT, "Authorization": f"Bearer {token}"}
    source, fork = at["source"], at["fork"]
    assert requests.put(url(source), data=b"abc", headers=auth).status_code == 201
    forked_from = {"Stream-Forked-From": f"/v1/stream/{source}"}
    refused = requests.put(url(fork), headers={**TEXT, **forked_from})
    assert refused.status_code == 401, refused.text
    table = workers.data_dir / "shards" / "1" / "meta" / "fork-placements"  # the fork's home's
    assert not table.exists()  # a client without a token places nothing
    created = requests.put(url(fork), headers={**auth, **forked_from})
    assert created.status_code == 201, created.text
    assert json.loads(table.read_text())["placements"] == {fork: 0}
    for _ in range(4):  # from either worker
        assert requests.get(url(fork), params={"offset": "-1"}, headers=auth).content == b"abc"
        assert requests.get(url(fork), params={"offset": "-1"}).status_code == 401


# -- a plain PUT of a fork's path racing with the fork's create at its home ---------------------------

PAUSE_HOOK = Path(__file__).with_name(
    "placement_pause"
)  # its sitecustomize wraps the placement write
PLAIN = {"Content-Type": "application/octet-stream"}  # another configuration than the fork's


def _paused_placements(monkeypatch: pytest.MonkeyPatch, control: Path) -> None:
    """Start servers whose workers pause a fork's placement write until ``control/release``."""
    control.mkdir()
    path = os.pathsep.join(filter(None, (str(PAUSE_HOOK), os.environ.get("PYTHONPATH"))))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("DURASTREAM_TEST_PLACEMENT_PAUSE", str(control))


def _one_process_outcomes(server: ServerProcess, prefix: str) -> set[tuple[Any, ...]]:
    """What one process answers to the plain PUT and the fork create of one path, in each order:
    (PUT's status, fork's status, what a GET of the path serves, its content type)."""
    url = server.stream_url
    source = f"{prefix}/source"
    assert requests.put(url(source), data=b"abc", headers=TEXT).status_code == 201
    outcomes = set()
    for order in ("put", "fork"):
        path = f"{prefix}/{order}-first"
        answers: dict[str, tuple[Any, ...]] = {}
        for step in (order, "fork" if order == "put" else "put"):
            if step == "put":
                answers["put"] = _seen(requests.put(url(path), data=b"plain", headers=PLAIN))[:2]
            else:
                forked = {**TEXT, "Stream-Forked-From": f"/v1/stream/{source}"}
                answers["fork"] = _seen(requests.put(url(path), headers=forked))[:2]
        outcomes.add(_outcome(server, path, answers["put"], answers["fork"]))
    return outcomes


def _outcome(
    server: ServerProcess, path: str, put: tuple[Any, ...], fork: tuple[Any, ...]
) -> tuple[Any, ...]:
    """The PUT's and the fork's (status, error code), what a GET serves and its content type."""
    read = requests.get(server.stream_url(path), params={"offset": "-1"})
    return put, fork, read.content, read.headers.get("Content-Type")


def _race(
    server: ServerProcess,
    source: str,
    path: str,
    *,
    forked: Callable[[], None] = lambda: None,
    put: Callable[[Future[requests.Response]], None] = lambda _: None,
) -> tuple[Any, ...]:
    """The fork create of ``path`` and a plain PUT of it, concurrently: ``forked`` runs once the
    fork's create is sent, ``put`` once the PUT is (with its future), then both answers are awaited."""
    url = server.stream_url
    fork_headers = {**TEXT, "Stream-Forked-From": f"/v1/stream/{source}"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        fork = pool.submit(requests.put, url(path), headers=fork_headers)
        forked()
        plain = pool.submit(requests.put, url(path), data=b"plain", headers=PLAIN)
        put(plain)
        fork_answer, put_answer = _seen(fork.result())[:2], _seen(plain.result())[:2]
    return _outcome(server, path, put_answer, fork_answer)


def test_a_put_racing_a_fork_create_at_its_home_answers_as_one_process(  # type: ignore[no-untyped-def]
    server_factory, monkeypatch, tmp_path
) -> None:
    """The fork's home pauses between its check that it holds no such path and the placement
    write; a plain PUT of the path arrives meanwhile. Before the fix both were created (201, 201:
    the PUT at the home, the fork in its source's shard, the home's stream shadowed); one process
    answers one of them 409, and a GET serves the winner's stream."""
    prefix = f"fk-race-{uuid.uuid4().hex[:8]}"
    expected = _one_process_outcomes(server_factory(), prefix)
    assert {(put[0], fork[0]) for put, fork, *_ in expected} == {(201, 409), (409, 201)}
    control = tmp_path / "control"
    _paused_placements(monkeypatch, control)
    workers = server_factory(extra_args=WORKERS)
    source, path = _of_shard(prefix, 0), _of_shard(prefix, 1)
    assert requests.put(workers.stream_url(source), data=b"abc", headers=TEXT).status_code == 201

    def paused() -> None:  # the fork's home is paused before its placement write
        poll_until(lambda: any(control.glob("paused-*")), "the placement paused", timeout=30)

    def raced(plain: Future[requests.Response]) -> None:
        # The PUT gets a moment (before the fix it was answered 201 in it; now it waits for the
        # path's create lock); whatever it does meanwhile, the answers must be one process's.
        _finished_within(plain.done, seconds=2.0)
        (control / "release").touch()

    seen = _race(workers, source, path, forked=paused, put=raced)
    assert seen in expected, (seen, expected)
    for _ in range(6):  # from either worker: the same stream
        assert _outcome(workers, path, *seen[:2]) == seen


def test_a_bulk_ensure_racing_a_fork_create_at_its_home_creates_the_path_once(  # type: ignore[no-untyped-def]
    server_factory, monkeypatch, tmp_path
) -> None:
    """The same pause, with a bulk ``ensure`` of the path instead of a PUT (its batch at the home):
    one of them creates it; the ensure answers the fork as it is or, its create having raced, PUT's
    409 (decision 0008); the fork is 409 if the ensure made it first. Never both created."""
    control = tmp_path / "control"
    _paused_placements(monkeypatch, control)
    workers = server_factory(extra_args=WORKERS)
    prefix = f"fk-ensure-{uuid.uuid4().hex[:8]}"
    source, path = _of_shard(prefix, 0), _of_shard(prefix, 1)
    assert requests.put(workers.stream_url(source), data=b"abc", headers=TEXT).status_code == 201
    forked = {**TEXT, "Stream-Forked-From": f"/v1/stream/{source}"}
    ensure = {"streams": [path], "content_type": PLAIN["Content-Type"]}
    with ThreadPoolExecutor(max_workers=2) as pool:
        fork = pool.submit(requests.put, workers.stream_url(path), headers=forked)
        poll_until(lambda: any(control.glob("paused-*")), "the placement paused", timeout=30)
        ensured = pool.submit(_post, workers, "ensure", json=ensure)
        _finished_within(ensured.done, seconds=2.0)
        (control / "release").touch()
        fork_status, entry = fork.result().status_code, ensured.result().json()["results"][0]
    read = requests.get(workers.stream_url(path), params={"offset": "-1"})
    if entry.get("created"):
        assert fork_status == 409, entry
        assert (read.content, read.headers["Content-Type"]) == (b"", PLAIN["Content-Type"])
    else:
        assert fork_status == 201, entry
        assert entry.get("status") == 409 or entry.get("content_type") == TEXT["Content-Type"]
        assert (read.content, read.headers["Content-Type"]) == (b"abc", TEXT["Content-Type"])


def test_many_rounds_of_a_put_racing_a_fork_create_answer_as_one_process(  # type: ignore[no-untyped-def]
    server_factory,
) -> None:
    """Without a pause: rounds of the same race, each answered as one process in some order."""
    prefix = f"fk-rounds-{uuid.uuid4().hex[:8]}"
    expected = _one_process_outcomes(server_factory(), prefix)
    workers = server_factory(extra_args=WORKERS)
    source = _of_shard(prefix, 0)
    assert requests.put(workers.stream_url(source), data=b"abc", headers=TEXT).status_code == 201
    for _ in range(RACE_ROUNDS):
        path = _of_shard(prefix, 1)
        seen = _race(workers, source, path)
        assert seen in expected, (seen, expected)


def test_sigkill_between_the_placement_write_and_the_forwarded_create(  # type: ignore[no-untyped-def]
    server_factory, monkeypatch, tmp_path
) -> None:
    """The home SIGKILLed with the placement durable but the fork not yet created in its source's
    shard: the client got no 201, and the path answers as one process on which that create never
    happened: 404, then a plain PUT creates it (201) and a fork create of it is 409, from either
    worker and after a restart."""
    control = tmp_path / "control"
    _paused_placements(monkeypatch, control)
    (control / "after").touch()
    workers = server_factory(extra_args=WORKERS)
    url = workers.stream_url
    prefix = f"fk-kill-{uuid.uuid4().hex[:8]}"
    source, path = _of_shard(prefix, 0), _of_shard(prefix, 1)
    assert requests.put(url(source), data=b"abc", headers=TEXT).status_code == 201
    forked = {**TEXT, "Stream-Forked-From": f"/v1/stream/{source}"}
    with ThreadPoolExecutor(max_workers=1) as pool:
        fork = pool.submit(requests.put, url(path), headers=forked)
        poll_until(lambda: any(control.glob("paused-*")), "the placement written", timeout=30)
        table = workers.data_dir / "shards" / "1" / "meta" / "fork-placements"
        assert json.loads(table.read_text())["placements"] == {path: 0}
        home = worker_of_shard(workers, 1)
        assert home is not None
        os.kill(home, signal.SIGKILL)
        (control / "release").touch()  # the restarted worker is not paused
        try:
            answered = fork.result().status_code
        except requests.ConnectionError:
            answered = None
    assert answered != 201  # never acknowledged

    def answers(status: int) -> Callable[[], bool]:
        def check() -> bool:
            try:
                return requests.get(url(path), params={"offset": "-1"}).status_code == status
            except requests.ConnectionError:
                return False

        return check

    poll_until(answers(404), "the path not found after the home's SIGKILL", timeout=60)
    assert requests.put(url(path), data=b"plain", headers=PLAIN).status_code == 201
    assert requests.put(url(path), headers=forked).status_code == 409
    workers.stop()  # SIGTERM: the supervisor waits for its workers (a SIGKILL of it would not)
    workers.start()
    poll_until(answers(200), "the path read back after a restart", timeout=60)
    for _ in range(6):
        read = requests.get(url(path), params={"offset": "-1"})
        assert (read.content, read.headers["Content-Type"]) == (b"plain", PLAIN["Content-Type"])
    assert requests.put(url(path), headers=forked).status_code == 409


RACE_ROUNDS = 30


def _finished_within(done: Callable[[], bool], *, seconds: float) -> None:
    """Give a racing request up to ``seconds`` (not a synchronisation: the test's assertions hold
    whatever happens in it)."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
