"""Subscriptions (spec sections 6-7) on ``--workers 2`` (``shards/subscriptions.py``).

The one-process end-to-end tests (``tests/server/subscriptions/test_end_to_end.py``) run again here,
unchanged, against real ``--workers 2`` processes: their subscriptions are owned by either worker and
their streams hash to either shard. Then what only workers have: a subscription whose streams are on
both shards delivers (webhook and pull-wake, wake stream on the other shard than the owner), every
worker answers the same signing key and the same description, and a SIGKILLed worker (owner or not)
makes subscription requests 503 + ``Retry-After`` while it is down, never a partial answer, and loses
nothing acknowledged.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from durastream_server.shards.layout import shard_of
from tests.server.subscriptions.receiver import WebhookReceiver
from tests.server.subscriptions.test_end_to_end import (  # noqa: F401 (run again, here)
    Api,
    test_backfill_links_existing_streams_at_their_tail,
    test_bad_requests_name_the_field,
    test_callback_auth_heartbeat_done_and_fencing,
    test_claim_without_pending_work,
    test_config_mismatch_and_routing_errors,
    test_deleted_subscription_fails_in_flight_callbacks,
    test_done_reply_acks_the_snapshot_and_new_data_wakes_again,
    test_done_with_work_left_reports_next_wake,
    test_explicit_links_and_glob_precedence,
    test_failed_delivery_is_retried_and_status_reports_it,
    test_lease_expiry_redelivers_with_a_new_generation,
    test_pull_wake_events_claims_acks_and_release,
    test_pull_wake_lease_expiry_frees_the_claim,
    test_webhook_is_signed_with_a_published_key,
    unique,
    wait_until,
    webhook_config,
)
from tests.server.workers.test_listing import answer_while_a_worker_is_down
from tests.server.workers.test_workers import WORKERS, worker_of_shard, workers_of
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

JSON = {"Content-Type": "application/json"}


TOKEN = "workers-writer-0123456789abcdef"


@pytest.fixture(params=["open", "auth-token"])
def workers(request, server_factory, monkeypatch) -> ServerProcess:  # type: ignore[no-untyped-def]
    """``--workers 2``, without tokens and with ``--auth-token`` (every client request of the test,
    through ``requests``, then carries the token unless it sets its own ``Authorization``: a
    callback or claim token): the owners follow the other shard's streams with the workers' own
    credential (``shards/internal.py``)."""
    args = WORKERS
    if request.param == "auth-token":
        args = (*WORKERS, "--auth-token", TOKEN)
        send_by_default(monkeypatch, {"Authorization": f"Bearer {TOKEN}"})
    server = server_factory(extra_args=args)
    subscriptions_ready(server)
    return server


def send_by_default(monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]) -> None:
    """Every ``requests`` session (``requests.get`` and the like make one per call) sends
    ``headers`` unless a request names its own: an authenticated client, for tests written without
    one."""
    original = requests.Session.__init__

    def with_headers(session: requests.Session) -> None:
        original(session)
        session.headers.update(headers)

    monkeypatch.setattr(requests.Session, "__init__", with_headers)


def subscriptions_ready(server: ServerProcess) -> None:
    """Wait until both workers serve subscriptions: for a moment after a start each is still reading
    the other's streams and answers 503. A request about a subscription is served by its owner,
    whichever worker receives it: so one probe id owned by each."""
    probes = [server.stream_url(f"__ds/subscriptions/{_sub_of_shard('probe', k)}") for k in (0, 1)]

    def ready() -> bool:
        return all(requests.get(probe).status_code == 404 for probe in probes)

    poll_until(ready, "subscriptions served by both workers", timeout=30)


@pytest.fixture
def api(workers: ServerProcess) -> Api:
    return Api(workers)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as hook:
        yield hook


def _on_shards(prefix: str, shards: tuple[int, ...]) -> list[str]:
    """One fresh stream path under ``prefix`` for each of ``shards``, in that order."""
    found: list[str] = []
    n = 0
    for shard in shards:
        while shard_of(f"{prefix}/s{n}", 2) != shard:
            n += 1
        found.append(f"{prefix}/s{n}")
        n += 1
    return found


def _sub_of_shard(name: str, shard: int) -> str:
    while True:
        sub_id = unique(name)
        if shard_of(sub_id, 2) == shard:
            return sub_id


def _seen(notifications: list, paths: list[str]) -> dict[str, str]:
    """The latest tail each of ``paths`` was delivered with, over every notification."""
    tails: dict[str, str] = {}
    for received in notifications:
        for item in received.body["streams"]:
            if item["path"] in paths:
                tails[item["path"]] = max(tails.get(item["path"], ""), item["tail_offset"])
    return tails


@pytest.mark.parametrize("owner", [0, 1])
def test_a_webhook_delivers_streams_of_both_shards_from_its_owner(
    api: Api, receiver: WebhookReceiver, owner: int
) -> None:
    prefix = unique("both")
    existing, created = _on_shards(prefix, (0, 1)), _on_shards(prefix + "/late", (1, 0))
    for path in existing:
        api.create_stream(path, {"n": 0})
    sub_id = _sub_of_shard("sub", owner)
    receiver.respond(reply={"done": True})
    response = api.put_sub(sub_id, webhook_config(f"{prefix}/**", receiver.url))
    assert response.status_code == 201, response.text
    # backfilled at their tails, on both shards: nothing pending, nothing delivered
    links = {link["path"]: link for link in response.json()["streams"]}
    assert set(links) == set(existing)
    assert all(link["acked_offset"] != "-1" for link in links.values())

    tails = {path: api.append(path, {"n": 1}) for path in existing}
    for path in created:
        api.create_stream(path, {"n": 0})
        tails[path] = api.append(path, {"n": 1})
    wait_until(
        lambda: _seen(receiver.requests, list(tails)) == tails,
        timeout=15.0,
        what="every stream's last append delivered",
    )
    wait_until(
        lambda: all(api.acked(sub_id, path) == tail for path, tail in tails.items()),
        timeout=15.0,
        what="every done reply acked",
    )
    # any worker answers the same description (forwarded to the owner)
    assert api.get_sub(sub_id) == api.get_sub(sub_id) == api.get_sub(sub_id)


def test_every_worker_publishes_the_key_every_owner_signs_with(
    api: Api, receiver: WebhookReceiver
) -> None:
    kids = {requests.get(api.stream("__ds/jwks.json")).json()["keys"][0]["kid"] for _ in range(8)}
    assert len(kids) == 1
    for owner in (0, 1):
        prefix, sub_id = unique("kid"), _sub_of_shard("kid", owner)
        api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url))
        assert api.get_sub(sub_id)["webhook"]["signing"]["kid"] in kids
        api.create_stream(f"{prefix}/s", {"n": 1})
        got = receiver.wait_for(len(receiver.requests) + 1, timeout=10.0)
        assert got.signature is not None and f"kid={next(iter(kids))}" in got.signature


def test_pull_wake_with_its_wake_stream_on_the_other_shard(api: Api) -> None:
    owner = 0
    prefix = unique("pw")
    wake = next(p for p in _on_shards(prefix + "-wake", (1,)))
    api.create_stream(wake)
    sub_id = _sub_of_shard("pw", owner)
    config = {"type": "pull-wake", "pattern": f"{prefix}/*", "wake_stream": wake}
    created = api.put_sub(sub_id, config)
    assert created.status_code == 201, created.text
    paths = _on_shards(prefix, (0, 1))
    for path in paths:
        api.create_stream(path, {"n": 1})
    events = wait_until(lambda: api.wake_events(wake), timeout=10.0, what="a wake event")
    assert events[0]["subscription_id"] == sub_id
    # the other shard's stream may reach the owner a round trip later than its own: claim until a
    # wake names both pending (released otherwise), as a latency, never a loss
    wait_until(lambda: _claim_all(api, sub_id, paths), timeout=10.0, what="a claim of both")


def test_a_worker_down_is_503_and_nothing_acknowledged_is_lost(
    workers: ServerProcess, api: Api
) -> None:
    for owner in (0, 1):
        prefix, wake = unique("down"), unique("wake/pool")
        api.create_stream(wake, [])
        sub_id = _sub_of_shard("down", owner)  # the owner is chosen by the id
        config = {"type": "pull-wake", "pattern": f"{prefix}/*", "wake_stream": wake}
        assert api.put_sub(sub_id, {**config, "lease_ttl_ms": 600_000}).status_code == 201
        paths = _on_shards(prefix, (0, 1))
        for path in paths:
            api.create_stream(path, {"n": 1})
        claimed = wait_until(
            lambda sub_id=sub_id, paths=paths: _claim_all(api, sub_id, paths),
            timeout=10.0,
            what="a claim",
        )
        acks = [
            {"stream": item["path"], "offset": item["tail_offset"]} for item in claimed["streams"]
        ]
        done = api.post(
            sub_id,
            "ack",
            {
                "wake_id": claimed["wake_id"],
                "generation": claimed["generation"],
                "done": True,
                "acks": acks,
            },
            claimed["token"],
        )
        assert done.status_code == 200, done.text
        before = api.get_sub(sub_id)
        for down in (0, 1):
            answer = _answer_while_down(workers, f"__ds/subscriptions/{sub_id}", down)
            if down == owner or answer.status_code != 200:
                # the owner down: 503. Another worker down: the owner answers from its own state
                # (nothing of that shard can change meanwhile) unless it already noticed: 503 too.
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"] == "1"
                assert json.loads(answer.content)["error"]["code"] == "SHARD_UNAVAILABLE"
            else:
                assert answer.json() == before  # never a partial answer
            poll_until(
                lambda sub_id=sub_id: requests.get(api.sub(sub_id)).status_code == 200,
                "the subscription served again",
                timeout=60,
            )
            assert api.get_sub(sub_id) == before  # every ack kept, no link lost or added
        # both workers restarted: the owner follows both shards' streams again
        for path in paths:
            api.append(path, {"n": 3})
        wait_until(
            lambda sub_id=sub_id, paths=paths: _claim_all(api, sub_id, paths),
            timeout=15.0,
            what="a wake naming the streams of both restarted shards",
        )


def _answer_while_down(workers: ServerProcess, resource: str, down: int) -> requests.Response:
    """``answer_while_a_worker_is_down``, once more if its own ``/healthz`` look at the survivor had
    its connection reset (seen now and then right after the SIGKILL, in that shared helper's check,
    not in the answer under test)."""
    try:
        return answer_while_a_worker_is_down(workers, resource, {}, down)
    except requests.ConnectionError:
        poll_until(lambda: _healthy(workers), "both workers back", timeout=60)
        return answer_while_a_worker_is_down(workers, resource, {}, down)


def _healthy(server: ServerProcess) -> bool:
    try:
        return requests.get(server.base_url + "/healthz").status_code == 200
    except requests.ConnectionError:
        return False


def _claim_all(api: Api, sub_id: str, paths: list[str]) -> dict | None:
    """A claim whose wake names every one of ``paths`` as pending, else None (released)."""
    response = api.post(sub_id, "claim", {"worker": "w"})
    if response.status_code != 200:
        return None
    claimed = response.json()
    pending = {item["path"] for item in claimed["streams"] if item["has_pending"]}
    if set(paths) <= pending:
        return claimed
    api.post(
        sub_id,
        "release",
        {"wake_id": claimed["wake_id"], "generation": claimed["generation"]},
        claimed["token"],
    )
    return None


@pytest.mark.parametrize("moves", [(), ("--no-connection-handoff",)], ids=["handoff", "forwards"])
def test_with_auth_tokens_the_workers_credential_counts_only_on_their_sockets(
    server_factory,  # type: ignore[no-untyped-def]
    moves: tuple[str, ...],
) -> None:
    """The workers' credential (``shards/internal.py``): 0600 in their private directory, in no
    command line or environment, accepted only over their sockets: presented by a client it is
    401, whether its connection moves to the owner (hand-off) or is forwarded (the header dropped)."""
    server = server_factory(extra_args=(*WORKERS, "--auth-token", TOKEN, *moves))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    sockets = _shard_sockets(server)
    credential_file = sockets / "internal-token"
    assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(sockets.stat().st_mode) == 0o700
    secret = credential_file.read_text().strip()
    assert len(secret) >= 32
    for pid in (server.pid, *workers_of(server)):  # never in a command line or the environment
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert secret.encode() not in Path(f"/proc/{pid}/environ").read_bytes()

    prefix = unique("cred")
    streams = _on_shards(prefix, (0, 1))
    text = {**auth, "Content-Type": "text/plain"}
    for path in streams:
        assert requests.put(server.stream_url(path), headers=text).status_code == 201
    wake = f"{prefix}-wake"
    assert requests.put(server.stream_url(wake), headers=text).status_code == 201
    subs = [_sub_of_shard("cred", k) for k in (0, 1)]
    config = json.dumps({"type": "pull-wake", "pattern": f"{prefix}/*", "wake_stream": wake})
    for sub_id in subs:
        created = wait_until(
            lambda sub_id=sub_id: _put_sub_served(server, sub_id, config, auth),
            timeout=30.0,
            what="the subscription's owner following the other shard",
        )
        assert {link["path"] for link in created["streams"]} == set(streams)

    # Presented over TCP, in either header, it is nothing: 401, on streams of both shards (one of
    # them forwarded to its owner, which must not see it) and on subscriptions of both owners.
    targets = [*streams, *(f"__ds/subscriptions/{sub_id}" for sub_id in subs)]
    presented = ({"Authorization": f"Bearer {secret}"}, {"x-durastream-internal": secret})
    for headers in presented:
        for target in targets:
            for _ in range(4):  # new connections, which the kernel spreads over both workers
                answer = requests.get(server.stream_url(target), headers=headers)
                assert answer.status_code == 401, (target, headers.keys(), answer.text)
    # ...also on a kept-open connection alternating between the shards: moved to the other worker
    # (hand-off), or forwarded to it (the forward drops the header)
    with requests.Session() as session:
        for path in streams * 4:
            assert session.get(server.stream_url(path), headers=auth).status_code == 200
            answer = session.get(server.stream_url(path), headers=presented[1])
            assert answer.status_code == 401, answer.text
    # a client without the token: 401 everywhere
    for target in [*targets, "__ds/x-durastream/streams", "__ds/x-durastream/changes"]:
        assert requests.get(server.stream_url(target)).status_code == 401, target
    assert (
        requests.put(
            server.stream_url(f"__ds/subscriptions/{unique('x')}"), data=config
        ).status_code
        == 401
    )

    # delivery across shards works with it: a claim names both shards' streams after appends
    for path in streams:
        assert requests.post(server.stream_url(path), data=b"x", headers=text).status_code == 204
    for sub_id in subs:
        poll_until(
            lambda sub_id=sub_id: _claims_both(server, sub_id, streams, auth),
            "a claim naming both shards' streams",
            timeout=30,
        )
    # never in /metrics, never logged
    for _ in range(4):
        metrics = requests.get(server.base_url + "/metrics", headers=auth)
        assert metrics.status_code == 200 and secret not in metrics.text
    assert secret not in server.log_path.read_text(errors="replace")


def _shard_sockets(server: ServerProcess) -> Path:
    """The workers' private socket directory (``--shard-sockets`` of a worker's command line)."""
    pid = worker_of_shard(server, 0)
    assert pid is not None
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(os.fsdecode(args[args.index(b"--shard-sockets") + 1]))


def _put_sub_served(
    server: ServerProcess, sub_id: str, config: str, auth: dict[str, str]
) -> dict | None:
    """The created subscription, or None while its owner still reads the other shard (503)."""
    answer = requests.put(
        server.stream_url(f"__ds/subscriptions/{sub_id}"), data=config, headers={**JSON, **auth}
    )
    if answer.status_code == 503:
        return None
    assert answer.status_code == 201, answer.text
    return answer.json()


def _claims_both(
    server: ServerProcess, sub_id: str, paths: list[str], auth: dict[str, str]
) -> bool:
    url = server.stream_url(f"__ds/subscriptions/{sub_id}")
    answer = requests.post(
        url + "/claim", data=json.dumps({"worker": "w"}), headers={**JSON, **auth}
    )
    if answer.status_code != 200:
        return False
    claimed = answer.json()
    requests.post(
        url + "/release",
        data=json.dumps({"wake_id": claimed["wake_id"], "generation": claimed["generation"]}),
        headers={**JSON, "Authorization": f"Bearer {claimed['token']}"},
    )
    return set(paths) <= {item["path"] for item in claimed["streams"] if item["has_pending"]}
