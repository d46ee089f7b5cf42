"""Subscriptions against a real server process: webhooks to a local receiver, pull-wake, restarts.

Paths and subscription ids are unique per test (the session server is shared). Waiting is always
"poll until a condition holds, with a deadline".
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.server.subscriptions.receiver import Received, WebhookReceiver
from tests.support.server_process import ServerProcess

JSON = {"Content-Type": "application/json"}
SIGNATURE_RE = re.compile(r"^t=(\d+),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)$")


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Api:
    """Thin helpers over one server's stream and ``__ds`` URLs."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server

    def stream(self, path: str) -> str:
        return self.server.stream_url(path)

    def sub(self, sub_id: str, suffix: str = "") -> str:
        return self.server.stream_url(f"__ds/subscriptions/{sub_id}{suffix}")

    def create_stream(self, path: str, body: Any | None = None) -> None:
        data = json.dumps(body) if body is not None else b""
        response = requests.put(self.stream(path), data=data, headers=JSON)
        assert response.status_code in (200, 201), response.text

    def append(self, path: str, body: Any) -> str:
        response = requests.post(self.stream(path), data=json.dumps(body), headers=JSON)
        assert response.status_code in (200, 204), response.text
        return response.headers["Stream-Next-Offset"]

    def put_sub(self, sub_id: str, config: dict[str, Any]) -> requests.Response:
        return requests.put(self.sub(sub_id), data=json.dumps(config), headers=JSON)

    def get_sub(self, sub_id: str) -> dict[str, Any]:
        response = requests.get(self.sub(sub_id))
        assert response.status_code == 200, response.text
        return response.json()

    def acked(self, sub_id: str, path: str) -> str | None:
        for link in self.get_sub(sub_id)["streams"]:
            if link["path"] == path:
                return link["acked_offset"]
        return None

    def post(self, sub_id: str, action: str, body: dict[str, Any], token: str | None = None):
        headers = dict(JSON)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return requests.post(self.sub(sub_id, f"/{action}"), data=json.dumps(body), headers=headers)

    def wake_events(self, wake_stream: str) -> list[dict[str, Any]]:
        response = requests.get(self.stream(wake_stream), params={"offset": "-1"})
        assert response.status_code == 200, response.text
        return response.json()


def webhook_config(pattern: str, url: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "webhook",
        "pattern": pattern,
        "webhook": {"url": url},
        "lease_ttl_ms": 1000,
        **extra,
    }


def stream_entry(notification: Received, path: str) -> dict[str, Any]:
    return next(item for item in notification.body["streams"] if item["path"] == path)


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- webhooks -------------------------------------------------------------------------------------


def test_webhook_is_signed_with_a_published_key(api: Api, receiver: WebhookReceiver) -> None:
    prefix, sub_id = unique("sig"), unique("sub")
    created = api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url))
    assert created.status_code == 201
    signing = created.json()["webhook"]["signing"]
    assert signing["jwks_url"] == api.stream("__ds/jwks.json")
    jwks_response = requests.get(signing["jwks_url"])
    assert jwks_response.headers["Content-Type"].startswith("application/jwk-set+json")
    assert "max-age=300" in jwks_response.headers["Cache-Control"]
    api.create_stream(f"{prefix}/a", {"n": 1})

    notification = receiver.wait_for(1)
    match = SIGNATURE_RE.match(notification.signature or "")
    assert match is not None, notification.signature
    timestamp, kid, signature = match.groups()
    assert kid == signing["kid"]
    assert abs(int(timestamp) - time.time()) < 300
    jwk = next(key for key in jwks_response.json()["keys"] if key["kid"] == kid)
    public = Ed25519PublicKey.from_public_bytes(unb64(jwk["x"]))
    public.verify(unb64(signature), timestamp.encode() + b"." + notification.raw)  # raises if bad
    assert notification.body["subscription_id"] == sub_id
    assert notification.body["callback_url"] == api.sub(sub_id, "/callback")
    assert "webhook_secret" not in json.dumps(created.json())


def test_done_reply_acks_the_snapshot_and_new_data_wakes_again(
    api: Api, receiver: WebhookReceiver
) -> None:
    prefix, sub_id = unique("done"), unique("sub")
    receiver.respond(reply={"done": True})
    assert api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url)).status_code == 201
    path = f"{prefix}/s"
    api.create_stream(path, {"n": 1})
    first = receiver.wait_for(1)
    entry = stream_entry(first, path)
    assert entry["has_pending"] is True and entry["link_type"] == "glob"
    wait_until(lambda: api.acked(sub_id, path) == entry["tail_offset"], what="auto-ack")

    tail = api.append(path, {"n": 2})
    second = receiver.wait_for(2)
    assert second.body["generation"] == first.body["generation"] + 1
    assert second.body["wake_id"] != first.body["wake_id"]
    assert stream_entry(second, path)["acked_offset"] == entry["tail_offset"]
    assert stream_entry(second, path)["tail_offset"] == tail
    wait_until(lambda: api.acked(sub_id, path) == tail, what="second auto-ack")


def test_callback_auth_heartbeat_done_and_fencing(api: Api, receiver: WebhookReceiver) -> None:
    prefix, sub_id = unique("cb"), unique("sub")
    api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url, lease_ttl_ms=5000))
    path = f"{prefix}/s"
    api.create_stream(path, {"n": 1})
    note = receiver.wait_for(1).body
    tail = stream_entry(receiver.wait_for(1), path)["tail_offset"]
    base = {"wake_id": note["wake_id"], "generation": note["generation"]}

    missing = api.post(sub_id, "callback", {**base, "done": True})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "UNAUTHORIZED"
    forged = api.post(
        sub_id, "callback", {**base, "done": True}, token=note["callback_token"] + "x"
    )
    assert forged.status_code == 401
    wrong_gen = api.post(
        sub_id, "callback", {**base, "generation": note["generation"] + 1}, note["callback_token"]
    )
    assert wrong_gen.status_code == 409 and wrong_gen.json()["error"]["code"] == "FENCED"
    beyond = api.post(
        sub_id,
        "callback",
        {**base, "acks": [{"stream": path, "offset": "9" * 16 + "_" + "9" * 16}]},
        note["callback_token"],
    )
    assert beyond.status_code == 400 and beyond.json()["error"]["field"] == "acks[0].offset"

    heartbeat = api.post(sub_id, "callback", {**base, "done": False}, note["callback_token"])
    assert heartbeat.json() == {"ok": True, "next_wake": False}
    done = api.post(
        sub_id,
        "callback",
        {**base, "acks": [{"stream": path, "offset": tail}], "done": True},
        note["callback_token"],
    )
    assert done.status_code == 200 and done.json() == {"ok": True, "next_wake": False}
    assert api.acked(sub_id, path) == tail
    replay = api.post(sub_id, "callback", {**base, "done": True}, note["callback_token"])
    assert replay.status_code == 409 and replay.json()["error"]["code"] == "FENCED"


def test_done_with_work_left_reports_next_wake(api: Api, receiver: WebhookReceiver) -> None:
    prefix, sub_id = unique("next"), unique("sub")
    api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url, lease_ttl_ms=5000))
    path = f"{prefix}/s"
    api.create_stream(path, {"n": 1})
    note = receiver.wait_for(1).body
    api.append(path, {"n": 2})  # arrives after the snapshot
    done = api.post(
        sub_id,
        "callback",
        {
            "wake_id": note["wake_id"],
            "generation": note["generation"],
            "done": True,
            "acks": [{"stream": path, "offset": note["streams"][0]["tail_offset"]}],
        },
        note["callback_token"],
    )
    assert done.json() == {"ok": True, "next_wake": True}
    again = receiver.wait_for(2).body
    assert again["generation"] == note["generation"] + 1


def test_lease_expiry_redelivers_with_a_new_generation(api: Api, receiver: WebhookReceiver) -> None:
    prefix, sub_id = unique("lease"), unique("sub")
    api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url, lease_ttl_ms=1000))
    api.create_stream(f"{prefix}/s", {"n": 1})
    first = receiver.wait_for(1).body
    second = receiver.wait_for(2, timeout=5.0).body  # nobody called back within the 1 s lease
    assert second["generation"] > first["generation"]
    stale = api.post(
        sub_id,
        "callback",
        {"wake_id": first["wake_id"], "generation": first["generation"]},
        first["callback_token"],
    )
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "FENCED"
    requests.delete(api.sub(sub_id))


def test_failed_delivery_is_retried_and_status_reports_it(
    api: Api, receiver: WebhookReceiver
) -> None:
    prefix, sub_id = unique("retry"), unique("sub")
    receiver.respond(status=500)
    api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url, lease_ttl_ms=10_000))
    path = f"{prefix}/s"
    api.create_stream(path, {"n": 1})
    receiver.wait_for(1)
    wait_until(lambda: api.get_sub(sub_id)["status"] == "failed", what="status failed")
    receiver.respond(reply={"done": True})
    retried = receiver.wait_for(2, timeout=5.0)  # first backoff is 1 s +-20%
    assert retried.body["generation"] == receiver.requests[0].body["generation"] + 1
    tail = stream_entry(retried, path)["tail_offset"]
    wait_until(
        lambda: (
            (body := api.get_sub(sub_id))["status"] == "active"
            and any(s["acked_offset"] == tail for s in body["streams"])
        ),
        what="recovery",
    )


def test_deleted_subscription_fails_in_flight_callbacks(
    api: Api, receiver: WebhookReceiver
) -> None:
    prefix, sub_id = unique("del"), unique("sub")
    api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url, lease_ttl_ms=5000))
    path = f"{prefix}/s"
    api.create_stream(path, {"n": 1})
    note = receiver.wait_for(1).body
    assert requests.delete(api.sub(sub_id)).status_code == 204
    body = {
        "wake_id": note["wake_id"],
        "generation": note["generation"],
        "done": True,
        "acks": [{"stream": path, "offset": note["streams"][0]["tail_offset"]}],
    }
    gone = api.post(sub_id, "callback", body, note["callback_token"])
    assert gone.status_code == 404
    # Same id re-created: the old token belongs to the deleted incarnation.
    api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url, lease_ttl_ms=5000))
    fenced = api.post(sub_id, "callback", body, note["callback_token"])
    assert fenced.status_code == 409 and fenced.json()["error"]["code"] == "FENCED"
    assert (
        api.acked(sub_id, path) == note["streams"][0]["tail_offset"]
    )  # backfilled at tail, not acked
    requests.delete(api.sub(sub_id))


# -- membership -----------------------------------------------------------------------------------


def test_backfill_links_existing_streams_at_their_tail(api: Api, receiver: WebhookReceiver) -> None:
    prefix, sub_id = unique("fill"), unique("sub")
    api.create_stream(f"{prefix}/old", {"n": 1})
    tail = api.append(f"{prefix}/old", {"n": 2})
    api.create_stream(f"{prefix}/deeper/no", {"n": 1})
    api.put_sub(sub_id, webhook_config(f"{prefix}/*", receiver.url))
    links = api.get_sub(sub_id)["streams"]
    assert links == [{"path": f"{prefix}/old", "link_type": "glob", "acked_offset": tail}]
    # Nothing is pending, so nothing is delivered; a later stream's creating data is pending.
    api.create_stream(f"{prefix}/new", {"n": 1})
    note = receiver.wait_for(1)
    assert [s["path"] for s in note.body["streams"] if s["has_pending"]] == [f"{prefix}/new"]
    assert len(receiver.requests) == 1


def test_explicit_links_and_glob_precedence(api: Api, receiver: WebhookReceiver) -> None:
    prefix, sub_id = unique("links"), unique("sub")
    both = f"{prefix}/both"
    api.create_stream(both)
    config = webhook_config(f"{prefix}/*", receiver.url, streams=[both, "elsewhere/x"])
    assert api.put_sub(sub_id, config).status_code == 201
    types = {s["path"]: s["link_type"] for s in api.get_sub(sub_id)["streams"]}
    assert types == {both: "explicit", "elsewhere/x": "explicit"}

    add = requests.post(api.sub(sub_id, "/streams"), json={"streams": ["other/y", "other/y"]})
    assert add.status_code == 204
    for path in (both, "other/y", "other/y"):
        remove = requests.delete(api.sub(sub_id, "/streams/" + quote(path, safe="")))
        assert remove.status_code == 204  # idempotent
    types = {s["path"]: s["link_type"] for s in api.get_sub(sub_id)["streams"]}
    assert types == {both: "glob", "elsewhere/x": "explicit"}
    # The explicit links added later do not change the configuration: re-confirmation still works.
    assert api.put_sub(sub_id, config).status_code == 200


# -- pull-wake ------------------------------------------------------------------------------------


def pull_setup(api: Api, ttl_ms: int = 1000) -> tuple[str, str, str]:
    prefix, sub_id, wake = unique("pull"), unique("sub"), unique("wake/pool")
    api.create_stream(wake, [])
    config = {
        "type": "pull-wake",
        "pattern": f"{prefix}/*",
        "wake_stream": wake,
        "lease_ttl_ms": ttl_ms,
    }
    assert api.put_sub(sub_id, config).status_code == 201
    return prefix, sub_id, wake


def test_pull_wake_events_claims_acks_and_release(api: Api) -> None:
    prefix, sub_id, wake = pull_setup(api, ttl_ms=10_000)
    path = f"{prefix}/s"
    api.create_stream(path, {"n": 1})
    events = wait_until(lambda: api.wake_events(wake), what="wake event")
    assert events == [
        {
            "type": "wake",
            "subscription_id": sub_id,
            "stream": path,
            "generation": 1,
            "ts": events[0]["ts"],
        }
    ]
    claim = api.post(sub_id, "claim", {"worker": "w1"})
    assert claim.status_code == 200
    claimed = claim.json()
    assert claimed["generation"] == 1 and claimed["lease_ttl_ms"] == 10_000
    busy = api.post(sub_id, "claim", {"worker": "w2"})
    assert busy.status_code == 409
    assert busy.json()["error"] | {"message": ""} == {
        "code": "ALREADY_CLAIMED",
        "current_holder": "w1",
        "generation": 1,
        "message": "",
    }
    base = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
    tail = claimed["streams"][0]["tail_offset"]
    heartbeat = api.post(
        sub_id, "ack", {**base, "acks": [{"stream": path, "offset": tail}]}, claimed["token"]
    )
    assert heartbeat.json() == {"ok": True, "next_wake": False}
    assert api.acked(sub_id, path) == tail  # acks without done still move the cursor

    api.append(path, {"n": 2})
    release = api.post(sub_id, "release", base, claimed["token"])
    assert release.status_code == 204
    # Work is still pending after the release: a new wake event follows.
    wait_until(lambda: len(api.wake_events(wake)) == 2, what="second wake event")
    assert api.wake_events(wake)[1]["generation"] == 2
    stale = api.post(sub_id, "release", base, claimed["token"])
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "FENCED"
    webhook_only = api.post(sub_id, "callback", base, claimed["token"])
    assert webhook_only.status_code == 409


def test_pull_wake_lease_expiry_frees_the_claim(api: Api) -> None:
    prefix, sub_id, _ = pull_setup(api, ttl_ms=1000)
    api.create_stream(f"{prefix}/s", {"n": 1})
    first = api.post(sub_id, "claim", {"worker": "w1"}).json()
    second = wait_until(
        lambda: (r := api.post(sub_id, "claim", {"worker": "w2"})).status_code == 200 and r.json(),
        timeout=5.0,
        what="claim after lease expiry",
    )
    assert second["generation"] > first["generation"]
    late = api.post(
        sub_id,
        "ack",
        {"wake_id": first["wake_id"], "generation": first["generation"], "done": True},
        first["token"],
    )
    assert late.status_code == 409 and late.json()["error"]["code"] == "FENCED"


def test_claim_without_pending_work(api: Api) -> None:
    _, sub_id, _ = pull_setup(api)
    response = api.post(sub_id, "claim", {"worker": "w"})
    assert response.status_code == 409 and response.json()["error"]["code"] == "NO_PENDING_WORK"


# -- validation and routing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        (b"{nope", 400, "INVALID_JSON", None),
        (json.dumps({"pattern": "a/*"}).encode(), 400, "BAD_REQUEST", "type"),
        (
            json.dumps({"type": "pull-wake", "wake_stream": "w"}).encode(),
            400,
            "BAD_REQUEST",
            "pattern",
        ),
        (
            json.dumps(
                {"type": "pull-wake", "pattern": "a/*", "wake_stream": "w", "lease_ttl_ms": 10}
            ).encode(),
            400,
            "BAD_REQUEST",
            "lease_ttl_ms",
        ),
        (
            json.dumps(
                {"type": "webhook", "pattern": "a/*", "webhook": {"url": "http://169.254.169.254/"}}
            ).encode(),
            400,
            "WEBHOOK_URL_REJECTED",
            "webhook.url",
        ),
    ],
)
def test_bad_requests_name_the_field(
    api: Api, body: bytes, status: int, code: str, field: str | None
) -> None:
    response = requests.put(api.sub(unique("bad")), data=body, headers=JSON)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert error.get("field") == field


def test_config_mismatch_and_routing_errors(api: Api, receiver: WebhookReceiver) -> None:
    sub_id = unique("sub")
    assert api.put_sub(sub_id, webhook_config("m/*", receiver.url)).status_code == 201
    mismatch = api.put_sub(sub_id, webhook_config("m/**", receiver.url))
    assert mismatch.status_code == 409
    assert requests.get(api.sub(unique("missing"))).status_code == 404
    assert requests.post(api.sub(sub_id)).status_code == 405
    assert requests.get(api.stream("__ds/nothing-here")).status_code == 404
    assert requests.delete(api.sub(sub_id)).status_code == 204
    assert requests.get(api.sub(sub_id)).status_code == 404


# -- restart --------------------------------------------------------------------------------------


def test_state_keys_and_tokens_survive_a_crash(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory()
    api = Api(server)
    prefix, sub_id, wake = pull_setup(api, ttl_ms=600_000)
    path = f"{prefix}/s"
    api.create_stream(path, {"n": 1})
    claimed = api.post(sub_id, "claim", {"worker": "w1"}).json()
    kid = requests.get(api.stream("__ds/jwks.json")).json()["keys"][0]["kid"]
    before = api.get_sub(sub_id)

    server.kill()
    server.restart()

    assert api.get_sub(sub_id) == before
    assert requests.get(api.stream("__ds/jwks.json")).json()["keys"][0]["kid"] == kid
    busy = api.post(sub_id, "claim", {"worker": "w2"})
    assert busy.status_code == 409 and busy.json()["error"]["current_holder"] == "w1"
    tail = claimed["streams"][0]["tail_offset"]
    done = api.post(
        sub_id,
        "ack",
        {
            "wake_id": claimed["wake_id"],
            "generation": claimed["generation"],
            "done": True,
            "acks": [{"stream": path, "offset": tail}],
        },
        claimed["token"],
    )
    assert done.status_code == 200 and done.json() == {"ok": True, "next_wake": False}
    assert api.acked(sub_id, path) == tail
    config = {
        "type": "pull-wake",
        "pattern": f"{prefix}/*",
        "wake_stream": wake,
        "lease_ttl_ms": 600_000,
    }
    assert api.put_sub(sub_id, config).status_code == 200


def test_webhook_retry_schedule_survives_a_restart(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory()
    api = Api(server)
    with WebhookReceiver(status=503) as hook:
        prefix, sub_id = unique("rs"), unique("sub")
        api.put_sub(sub_id, webhook_config(f"{prefix}/*", hook.url, lease_ttl_ms=10_000))
        api.create_stream(f"{prefix}/s", {"n": 1})
        hook.wait_for(1)
        wait_until(lambda: api.get_sub(sub_id)["status"] == "failed", what="status failed")
        server.terminate()
        hook.respond(reply={"done": True})
        server.restart()
        hook.wait_for(2, timeout=10.0)  # the persisted retry is still due after the restart
        wait_until(
            lambda: api.get_sub(sub_id)["status"] == "active", what="recovered after restart"
        )
