"""The wake / lease / generation state machine of sections 7 and 7.3, driven by a fake clock."""

from __future__ import annotations

import json

import pytest

from durastream_server.offsets import format_offset
from durastream_server.subscriptions.errors import (
    AlreadyClaimed,
    Fenced,
    InvalidField,
    NoPendingWork,
    Unauthorized,
    WrongSubscriptionType,
)
from durastream_server.subscriptions.model import (
    PULL_WAKE,
    START_OFFSET,
    WEBHOOK,
    StreamAck,
    SubscriptionConfig,
    WakeRequest,
)
from durastream_server.subscriptions.state import Subscription, Wake
from durastream_server.subscriptions.tokens import TokenClaims


def off(position: int) -> str:
    return format_offset(position)


def make(
    kind: str = WEBHOOK, *, ttl_ms: int = 1000, pattern: str | None = "events/*"
) -> Subscription:
    config = SubscriptionConfig(
        type=kind,  # type: ignore[arg-type]
        pattern=pattern,
        streams=(),
        webhook_url="https://hooks.example.com/x" if kind == WEBHOOK else None,
        wake_stream="wake/pool" if kind == PULL_WAKE else None,
        lease_ttl_ms=ttl_ms,
    )
    return Subscription(
        id="sub-1",
        incarnation="inc-1",
        config=config,
        created_at="2026-01-01T00:00:00.000Z",
    )


def claims_for(wake: Wake, use: str = "callback", **override: object) -> TokenClaims:
    values = {
        "subscription_id": "sub-1",
        "incarnation": "inc-1",
        "generation": wake.generation,
        "wake_id": wake.wake_id,
        "use": use,
        "expires_at": 1e12,
    }
    values.update(override)
    return TokenClaims(**values)  # type: ignore[arg-type]


def answer(wake: Wake, *, done: bool, acks: tuple[StreamAck, ...] = ()) -> WakeRequest:
    return WakeRequest(wake_id=wake.wake_id, generation=wake.generation, acks=acks, done=done)


def test_no_wake_without_pending_work() -> None:
    sub = make()
    sub.link_glob("events/a", off(5))
    assert sub.maybe_wake(0.0, {"events/a": off(5)}) is None
    assert sub.wake is None and sub.generation == 0


def test_each_wake_has_new_generation_and_id() -> None:
    sub = make()
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(10)}
    first = sub.maybe_wake(100.0, tails)
    assert first is not None and first.generation == 1
    assert first.lease_expires_at == pytest.approx(101.0)  # webhook lease starts at issue
    assert [s.to_json() for s in first.streams] == [
        {
            "path": "events/a",
            "link_type": "glob",
            "acked_offset": START_OFFSET,
            "tail_offset": off(10),
            "has_pending": True,
        }
    ]
    assert sub.maybe_wake(100.1, {"events/a": off(20)}) is None  # one wake in flight at a time
    tails["events/a"] = off(20)
    assert sub.auto_ack(first, tails) is True  # events after the snapshot remain pending
    assert sub.links["events/a"].acked_offset == off(10)
    second = sub.maybe_wake(100.2, tails)
    assert second is not None and second.generation == 2 and second.wake_id != first.wake_id


def test_callback_done_acks_then_replay_is_fenced() -> None:
    sub = make()
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(10)}
    wake = sub.maybe_wake(0.0, tails)
    assert wake is not None
    request = answer(wake, done=True, acks=(StreamAck("events/a", off(10)),))
    sub.fence(claims_for(wake), request, "callback", 0.5)
    assert sub.complete(request, 0.5, tails) is False
    assert sub.links["events/a"].acked_offset == off(10)
    with pytest.raises(Fenced):
        sub.fence(claims_for(wake), request, "callback", 0.6)


@pytest.mark.parametrize(
    ("claim_override", "request_override", "error"),
    [
        ({"generation": 0}, {}, Fenced),
        ({}, {"generation": 0}, Fenced),
        ({"wake_id": "w_other"}, {}, Fenced),
        ({}, {"wake_id": "w_other"}, Fenced),
        ({"incarnation": "inc-0"}, {}, Fenced),
        ({"subscription_id": "sub-2"}, {}, Unauthorized),
        ({"use": "claim"}, {}, Unauthorized),
    ],
)
def test_fencing_requires_every_field_to_match(
    claim_override: dict[str, object], request_override: dict[str, object], error: type[Exception]
) -> None:
    sub = make()
    sub.link_glob("events/a", START_OFFSET)
    wake = sub.maybe_wake(0.0, {"events/a": off(1)})
    assert wake is not None
    fields = {"wake_id": wake.wake_id, "generation": wake.generation, **request_override}
    request = WakeRequest(**fields)  # type: ignore[arg-type]
    with pytest.raises(error):
        sub.fence(claims_for(wake, **claim_override), request, "callback", 0.1)
    assert sub.wake is wake  # a rejected request changes nothing


def test_heartbeat_extends_the_lease_and_expiry_rewakes() -> None:
    sub = make(ttl_ms=1000)
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(3)}
    wake = sub.maybe_wake(0.0, tails)
    assert wake is not None
    sub.fence(claims_for(wake), answer(wake, done=False), "callback", 0.9)
    assert sub.complete(answer(wake, done=False), 0.9, tails) is False
    assert wake.lease_expires_at == pytest.approx(1.9)
    assert sub.expire(1.5) is False
    assert sub.next_deadline() == pytest.approx(1.9)
    assert sub.expire(1.9) is True and sub.wake is None
    with pytest.raises(Fenced):
        sub.fence(claims_for(wake), answer(wake, done=False), "callback", 2.0)
    again = sub.maybe_wake(2.0, tails)
    assert again is not None and again.generation == 2


def test_pull_wake_claim_lease_and_already_claimed() -> None:
    sub = make(PULL_WAKE, ttl_ms=2000)
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(4)}
    announced = sub.maybe_wake(10.0, tails)
    assert announced is not None and announced.lease_expires_at is None  # no lease until claimed
    assert sub.expire(10_000.0) is False  # an unclaimed wake does not expire
    wake = sub.claim("worker-1", 11.0, tails)
    assert wake is announced and wake.holder == "worker-1"
    assert wake.lease_expires_at == pytest.approx(13.0)
    with pytest.raises(AlreadyClaimed) as info:
        sub.claim("worker-2", 12.0, tails)
    assert info.value.details == {"current_holder": "worker-1", "generation": 1}
    # Lease expiry frees the subscription; the next claim is a new generation.
    taken = sub.claim("worker-2", 13.5, tails)
    assert taken.holder == "worker-2" and taken.generation == 2
    with pytest.raises(Fenced):
        sub.fence(claims_for(wake, "claim"), answer(wake, done=True), "claim", 13.6)


def test_pull_wake_ack_done_and_release() -> None:
    sub = make(PULL_WAKE)
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(4)}
    wake = sub.claim("w", 0.0, tails)
    request = answer(wake, done=True, acks=(StreamAck("events/a", off(4)),))
    sub.fence(claims_for(wake, "claim"), request, "claim", 0.1)
    assert sub.complete(request, 0.1, tails) is False
    with pytest.raises(NoPendingWork):
        sub.claim("w", 0.2, tails)
    tails["events/a"] = off(9)
    second = sub.claim("w", 0.3, tails)
    assert second.generation == 2
    sub.fence(claims_for(second, "claim"), answer(second, done=False), "claim", 0.4)
    assert sub.release(tails) is True  # work still pending: the service re-wakes
    assert sub.links["events/a"].acked_offset == off(4)
    third = sub.maybe_wake(0.5, tails)
    assert third is not None and third.generation == 3


def test_claim_is_only_for_pull_wake() -> None:
    sub = make(WEBHOOK)
    with pytest.raises(WrongSubscriptionType):
        sub.claim("w", 0.0, {})


def test_acks_are_validated_all_or_nothing_and_never_regress() -> None:
    sub = make()
    sub.link_glob("events/a", START_OFFSET)
    sub.link_glob("events/b", off(5))
    tails = {"events/a": off(10), "events/b": off(8)}
    with pytest.raises(InvalidField) as info:
        sub.apply_acks([StreamAck("events/a", off(3)), StreamAck("events/b", off(9))], tails)
    assert info.value.field == "acks[1].offset"
    assert sub.links["events/a"].acked_offset == START_OFFSET  # nothing applied
    with pytest.raises(InvalidField):
        sub.apply_acks([StreamAck("events/a", "0_3")], tails)
    sub.apply_acks(
        [
            StreamAck("events/a", off(3)),
            StreamAck("events/b", off(2)),
            StreamAck("events/zzz", off(1)),
        ],
        tails,
    )
    assert sub.links["events/a"].acked_offset == off(3)
    assert sub.links["events/b"].acked_offset == off(5)  # cursors only move forward
    assert "events/zzz" not in sub.links


def test_delivery_failure_schedules_retry_and_status() -> None:
    sub = make()
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(1)}
    wake = sub.maybe_wake(0.0, tails)
    assert wake is not None
    assert sub.delivery_failed(wake, 0.1, 2.0) is True
    assert sub.status == "failed" and sub.wake is None
    assert sub.next_deadline() == pytest.approx(2.1)
    assert sub.maybe_wake(1.0, tails) is None  # waits out the backoff
    assert sub.retry_due(1.0) is False and sub.retry_due(2.1) is True
    retry = sub.maybe_wake(2.1, tails)
    assert retry is not None and retry.generation == 2
    assert sub.status == "failed"  # until an attempt succeeds
    sub.delivery_succeeded(retry)
    assert sub.status == "active" and retry.announced


def test_stale_delivery_outcomes_are_ignored() -> None:
    sub = make()
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(1)}
    wake = sub.maybe_wake(0.0, tails)
    assert wake is not None
    sub.expire(5.0)
    assert sub.delivery_failed(wake, 5.0, 1.0) is False and sub.status == "active"
    assert sub.auto_ack(wake, tails) is False
    assert sub.links["events/a"].acked_offset == START_OFFSET


def test_deleted_subscription_moves_no_cursor() -> None:
    sub = make()
    sub.link_glob("events/a", START_OFFSET)
    tails = {"events/a": off(1)}
    wake = sub.maybe_wake(0.0, tails)
    assert wake is not None
    sub.deleted = True
    assert sub.auto_ack(wake, tails) is False
    assert sub.links["events/a"].acked_offset == START_OFFSET
    assert sub.maybe_wake(1.0, tails) is None


def test_link_types_explicit_precedence_and_deletion() -> None:
    sub = make()
    assert sub.link_glob("events/a", off(1)) is True
    assert sub.link_explicit("events/a", off(9)) is True
    assert sub.links["events/a"].link_type == "explicit"
    assert sub.links["events/a"].acked_offset == off(1)  # an existing cursor is kept
    assert sub.unlink_explicit("events/a") is True
    assert sub.links["events/a"].link_type == "glob"  # the glob link remains
    assert sub.unlink_explicit("events/a") is False  # idempotent
    sub.link_explicit("manual/x", off(4))
    assert sub.stream_deleted("manual/x") is True
    assert sub.links["manual/x"].acked_offset == START_OFFSET  # rewound for a re-created stream
    assert sub.stream_deleted("events/a") is True
    assert "events/a" not in sub.links


def test_own_wake_stream_is_never_watched() -> None:
    sub = make(PULL_WAKE, pattern="**")
    assert sub.wants("events/a") is True
    assert sub.wants("wake/pool") is False


def test_state_round_trip() -> None:
    sub = make(PULL_WAKE)
    sub.link_glob("events/a", START_OFFSET)
    sub.link_explicit("manual/b", off(2))
    wake = sub.claim("w", 5.0, {"events/a": off(3)})
    restored = Subscription.from_state(json.loads(json.dumps(sub.to_state())))
    assert restored.to_state() == sub.to_state()
    assert restored.wake is not None and restored.wake.holder == "w"
    assert restored.wake.wake_id == wake.wake_id
    assert restored.config_hash == sub.config_hash


def test_response_shape() -> None:
    sub = make()
    sub.link_explicit("manual/a", START_OFFSET)
    body = sub.to_json(signing={"alg": "ed25519", "kid": "ds_x", "jwks_url": "u"})
    assert body["id"] == body["subscription_id"] == "sub-1"
    assert body["webhook"] == {
        "url": "https://hooks.example.com/x",
        "signing": {"alg": "ed25519", "kid": "ds_x", "jwks_url": "u"},
    }
    assert body["streams"] == [
        {"path": "manual/a", "link_type": "explicit", "acked_offset": START_OFFSET}
    ]
    assert body["status"] == "active" and body["wake_stream"] is None
    assert "secret" not in json.dumps(body)
