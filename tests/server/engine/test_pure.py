"""Unit tests of the engine's pure parts: content types, JSON mode, producer rules, expiry, waiters."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from durastream_server.engine import contenttype, expiry, jsonmode, producers
from durastream_server.engine.waiters import WaitSet
from durastream_server.errors import (
    BadRequest,
    DuplicateMismatch,
    EmptyJsonArray,
    InvalidJson,
    NotFound,
    SequenceGap,
    StaleEpoch,
)
from durastream_server.storage.records import AppendEntry, ProducerTuple
from durastream_server.storage.state import EPOCH_DIGESTS, StreamState, apply_entry

# --------------------------------------------------------------------------- content types


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ("text/plain", "text/plain"),
        ("TEXT/Plain", "text/plain"),
        (" application/json ; charset=utf-8 ", "application/json; charset=utf-8"),
        ("application/json;charset=UTF-8;x=1", "application/json; charset=UTF-8; x=1"),
    ],
)
def test_content_type_normalization(raw: str, text: str) -> None:
    parsed = contenttype.parse(raw)
    assert parsed is not None
    assert parsed.text == text


@pytest.mark.parametrize(
    "raw", [None, "", "   ", "text", "text/", "/plain", "te xt/plain", "a/b/c"]
)
def test_invalid_content_types_parse_to_none(raw: str | None) -> None:
    assert contenttype.parse(raw) is None


def test_missing_or_invalid_content_type_defaults_to_octet_stream_on_create() -> None:
    assert contenttype.for_create(None) == "application/octet-stream"
    assert contenttype.for_create("nonsense") == "application/octet-stream"
    assert contenttype.for_create("Text/Plain") == "text/plain"


def test_hazard_37_parameter_only_differences_are_the_same_type() -> None:
    assert contenttype.same_type("application/json; charset=utf-8", "APPLICATION/JSON")
    assert contenttype.same_type("text/plain", "text/plain;charset=latin-1")
    assert not contenttype.same_type("text/plain", "application/json")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/json-patch+json", False),  # hazard 40: no substring tests
        ("application/ndjson", False),
        ("text/json", False),
    ],
)
def test_hazard_40_one_definition_of_json(value: str, expected: bool) -> None:
    assert contenttype.is_json(value) is expected


# --------------------------------------------------------------------------- JSON mode


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        (b'{"event": "created"}', [b'{"event": "created"}']),
        (b'[{"event": "a"}, {"event": "b"}]', [b'{"event": "a"}', b'{"event": "b"}']),
        (b"[[1,2], [3,4]]", [b"[1,2]", b"[3,4]"]),
        (b"[[[1,2,3]]]", [b"[[1,2,3]]"]),
        (b'  "text"  ', [b'"text"']),
        (b"42", [b"42"]),
        (b"null", [b"null"]),
        (b" [ 1 ,\n 2.50 , -0 , 1e400 ] ", [b"1", b"2.50", b"-0", b"1e400"]),
        ('["\u00e9", "\\ud83d\\ude00"]'.encode(), ['"\u00e9"'.encode(), b'"\\ud83d\\ude00"']),
    ],
)
def test_json_flattens_exactly_one_level_keeping_original_bytes(
    body: bytes, messages: list[bytes]
) -> None:
    assert list(jsonmode.split_messages(body, allow_empty_array=False)) == messages


def test_json_empty_array_is_rejected_on_post_and_allowed_on_put() -> None:
    with pytest.raises(EmptyJsonArray):
        jsonmode.split_messages(b" [ ] ", allow_empty_array=False)
    assert jsonmode.split_messages(b"[]", allow_empty_array=True) == ()
    assert jsonmode.split_messages(b"", allow_empty_array=False) == ()


@pytest.mark.parametrize(
    "body",
    [
        b"{ invalid json }",
        b"[1, 2",
        b"[1,]",
        b"[1] [2]",
        b"{} x",
        b"NaN",
        b"[Infinity]",
        b"[-Infinity]",
        b'"raw\ncontrol"',
        b"\xff\xfe",
        b"   ",
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_invalid_json_is_rejected(body: bytes) -> None:
    with pytest.raises(InvalidJson):
        jsonmode.split_messages(body, allow_empty_array=True)


def test_json_accepts_a_leading_bom() -> None:
    assert jsonmode.split_messages(b"\xef\xbb\xbf[1]", allow_empty_array=False) == (b"1",)


# --------------------------------------------------------------------------- producers


def _state_after(*tuples: tuple[str, int, int, bytes]) -> StreamState:
    state = StreamState(tail=0)
    for producer_id, epoch, seq, body in tuples:
        digest = producers.request_digest("text/plain", body, False)
        apply_entry(
            state,
            AppendEntry(
                position=state.tail,
                messages=(body,),
                timestamp_ms=1,
                producer=ProducerTuple(producer_id, epoch, seq),
                digest=digest,
            ),
        )
    return state


def _digest(body: bytes, closes: bool = False) -> bytes:
    return producers.request_digest("text/plain", body, closes)


def test_unknown_producer_must_start_at_zero() -> None:
    state = StreamState(tail=0)
    assert isinstance(
        producers.validate(state, ProducerTuple("p", 3, 0), _digest(b"x")), producers.Accept
    )
    with pytest.raises(SequenceGap) as err:
        producers.validate(state, ProducerTuple("p", 0, 4), _digest(b"x"))
    assert err.value.headers == {"Producer-Expected-Seq": "0", "Producer-Received-Seq": "4"}


def test_sequence_rules_within_an_epoch() -> None:
    state = _state_after(("p", 0, 0, b"a"), ("p", 0, 1, b"b"), ("p", 0, 2, b"c"))
    assert isinstance(producers.validate(state, ProducerTuple("p", 0, 3), b""), producers.Accept)
    duplicate = producers.validate(state, ProducerTuple("p", 0, 1), _digest(b"b"))
    assert duplicate == producers.Duplicate(epoch=0, highest_seq=2, verified=True)
    with pytest.raises(SequenceGap) as err:
        producers.validate(state, ProducerTuple("p", 0, 5), b"")
    assert err.value.headers["Producer-Expected-Seq"] == "3"
    assert err.value.headers["Producer-Received-Seq"] == "5"


def test_epoch_rules() -> None:
    state = _state_after(("p", 2, 0, b"a"))
    with pytest.raises(StaleEpoch) as err:
        producers.validate(state, ProducerTuple("p", 1, 0), b"")
    assert err.value.headers == {"Producer-Epoch": "2"}
    with pytest.raises(BadRequest):
        producers.validate(state, ProducerTuple("p", 3, 1), b"")
    assert isinstance(producers.validate(state, ProducerTuple("p", 3, 0), b""), producers.Accept)


def test_hazard_4_reused_tuple_with_different_payload_is_409() -> None:
    state = _state_after(("p", 0, 0, b"A"))
    with pytest.raises(DuplicateMismatch):
        producers.validate(state, ProducerTuple("p", 0, 0), _digest(b"B"))
    # Same bytes but now closing: a different request too.
    with pytest.raises(DuplicateMismatch):
        producers.validate(state, ProducerTuple("p", 0, 0), _digest(b"A", closes=True))


def test_every_seq_of_the_epoch_is_checked_not_only_the_last_64() -> None:
    """Issue 15 item 6: a reordered retry whose differing request is older than the last 64 seqs was a
    silent 204; every seq of the current epoch (up to EPOCH_DIGESTS) is checked now."""
    state = _state_after(*[("p", 0, seq, b"x%d" % seq) for seq in range(100)])
    with pytest.raises(DuplicateMismatch):
        producers.validate(state, ProducerTuple("p", 0, 0), _digest(b"different"))
    same = producers.validate(state, ProducerTuple("p", 0, 0), _digest(b"x0"))
    assert same == producers.Duplicate(epoch=0, highest_seq=99, verified=True)


def test_a_duplicate_older_than_the_digest_window_says_it_was_not_checked() -> None:
    """Past the bound the server cannot compare; its 204 says so (``verified=False``), and a client
    that must be loud (the Spark sink's ordered mode) fails on it."""
    count = 2 * EPOCH_DIGESTS + 10
    state = StreamState(tail=0)
    for seq in range(count):
        apply_entry(
            state,
            AppendEntry(
                position=state.tail,
                messages=(b"m",),
                timestamp_ms=1,
                producer=ProducerTuple("p", 0, seq),
                digest=_digest(b"%d" % seq),
            ),
        )
    kept = state.producers["p"]
    assert EPOCH_DIGESTS <= kept.digest_count <= 2 * EPOCH_DIGESTS
    old = producers.validate(state, ProducerTuple("p", 0, 0), _digest(b"different"))
    assert old == producers.Duplicate(epoch=0, highest_seq=count - 1, verified=False)
    recent = count - EPOCH_DIGESTS
    with pytest.raises(DuplicateMismatch):
        producers.validate(state, ProducerTuple("p", 0, recent), _digest(b"different"))


@pytest.mark.parametrize("legacy_size", [16, 20])
def test_digest_of_an_earlier_version_counts_as_forgotten(legacy_size: int) -> None:
    """Digests written by earlier versions (16-byte BLAKE2b, then 20-byte SHA-256) cannot be compared:
    a retry that spans the upgrade is a duplicate, as when the digest is no longer remembered."""
    assert len(_digest(b"x")) == producers.DIGEST_SIZE not in (16, 20)
    state = StreamState(tail=0)
    legacy = bytes(legacy_size)
    apply_entry(
        state,
        AppendEntry(
            position=0,
            messages=(b"x",),
            timestamp_ms=1,
            producer=ProducerTuple("p", 0, 0),
            digest=legacy,
        ),
    )
    decision = producers.validate(state, ProducerTuple("p", 0, 0), _digest(b"x"))
    assert decision == producers.Duplicate(epoch=0, highest_seq=0, verified=False)
    assert producers.differ(_digest(b"x"), _digest(b"y"))
    assert not producers.differ(_digest(b"x")[:8], _digest(b"x"))


def test_digest_ignores_content_type_parameters_but_not_essence() -> None:
    assert producers.request_digest("text/plain", b"x", False) != producers.request_digest(
        "application/json", b"x", False
    )
    assert producers.request_digest(None, b"", True) == producers.request_digest(None, b"", True)


def test_producer_tuple_syntax() -> None:
    with pytest.raises(BadRequest):
        producers.check_tuple_syntax(ProducerTuple("", 0, 0))
    with pytest.raises(BadRequest):
        producers.check_tuple_syntax(ProducerTuple("p", 2**53, 0))
    with pytest.raises(BadRequest):
        producers.check_tuple_syntax(ProducerTuple("p", 0, -1))
    producers.check_tuple_syntax(ProducerTuple("p", 2**53 - 1, 0))


def test_hazard_35_after_close_rules() -> None:
    state = _state_after(("p", 1, 0, b"a"), ("p", 1, 1, b"b"))
    with pytest.raises(StaleEpoch):
        producers.stale_or_duplicate_after_close(state, ProducerTuple("p", 0, 5))
    assert producers.stale_or_duplicate_after_close(
        state, ProducerTuple("p", 1, 0)
    ) == producers.Duplicate(epoch=1, highest_seq=1)
    assert producers.stale_or_duplicate_after_close(state, ProducerTuple("p", 1, 2)) is None
    assert producers.stale_or_duplicate_after_close(state, ProducerTuple("q", 0, 0)) is None


# --------------------------------------------------------------------------- expiry


def test_rfc3339_normalization_is_per_instant() -> None:
    moment = datetime(2030, 1, 2, 3, 4, 5, 123000, tzinfo=timezone.utc)
    same = moment.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert expiry.format_rfc3339(moment) == "2030-01-02T03:04:05.123Z"
    assert expiry.format_rfc3339(same) == expiry.format_rfc3339(moment)
    assert expiry.format_rfc3339(moment.replace(microsecond=0)) == "2030-01-02T03:04:05Z"
    assert expiry.format_rfc3339(moment.replace(microsecond=5)) == "2030-01-02T03:04:05.000005Z"
    assert expiry.parse_rfc3339(expiry.format_rfc3339(moment)) == moment
    with pytest.raises(ValueError):
        expiry.format_rfc3339(datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(999, 12, 31, tzinfo=timezone.utc), "0999-12-31T00:00:00Z"),  # strftime: "999"
        (datetime(1, 1, 1, tzinfo=timezone.utc), "0001-01-01T00:00:00Z"),
        (datetime.max.replace(tzinfo=timezone.utc), "9999-12-31T23:59:59.999999Z"),
        (
            datetime(1, 1, 1, tzinfo=timezone(-timedelta(hours=23, minutes=59))),
            "0001-01-01T23:59:00Z",
        ),
    ],
)
def test_rfc3339_text_always_parses_back(moment: datetime, text: str) -> None:
    """Years below 1000 are zero-padded (the text was "999-12-31...", which no start-up could read)."""
    assert expiry.format_rfc3339(moment) == text
    assert expiry.parse_rfc3339(text) == moment
    lifetime = expiry.requested(None, moment)
    assert lifetime.expires_at == text
    assert expiry.deadline(lifetime, 0) == moment.timestamp()


@pytest.mark.parametrize(
    "moment",
    [
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(-timedelta(hours=23, minutes=59))),
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=23, minutes=59))),
    ],
)
def test_instants_outside_the_utc_range_are_rejected_before_formatting(moment: datetime) -> None:
    """Their UTC instant is in year 10000 or year 0: ``astimezone`` raises OverflowError."""
    with pytest.raises(ValueError, match="outside"):
        expiry.format_rfc3339(moment)
    with pytest.raises(BadRequest, match="Stream-Expires-At .* 0001-01-01T00:00:00Z to 9999"):
        expiry.requested(None, moment)


def test_requested_lifetime_validation() -> None:
    with pytest.raises(BadRequest):
        expiry.requested(10, datetime.now(timezone.utc))
    with pytest.raises(BadRequest):
        expiry.requested(-1, None)
    assert expiry.requested(None, None) == expiry.Lifetime()
    assert expiry.requested(0, None) == expiry.Lifetime(ttl_seconds=0)


def test_fork_lifetime_table() -> None:
    none = expiry.Lifetime()
    ttl = expiry.Lifetime(ttl_seconds=60)
    at = expiry.Lifetime(expires_at="2030-01-01T00:00:00Z")
    own_ttl = expiry.Lifetime(ttl_seconds=5)
    own_at = expiry.Lifetime(expires_at="2031-01-01T00:00:00Z")
    # (source, request) -> fork, the nine rows of the section 4.2 table
    assert expiry.for_fork(none, none) == none
    assert expiry.for_fork(none, own_ttl) == own_ttl
    assert expiry.for_fork(none, own_at) == own_at
    assert expiry.for_fork(ttl, none) == ttl
    assert expiry.for_fork(ttl, own_ttl) == own_ttl
    assert expiry.for_fork(ttl, own_at) == own_at
    assert expiry.for_fork(at, none) == at
    assert expiry.for_fork(at, own_ttl) == own_ttl
    assert expiry.for_fork(at, own_at) == own_at


def test_expiry_deadlines() -> None:
    ttl = expiry.Lifetime(ttl_seconds=10)
    assert not expiry.is_expired(ttl, last_access=100.0, now=109.9)
    assert expiry.is_expired(ttl, last_access=100.0, now=110.0)
    at = expiry.Lifetime(
        expires_at=expiry.format_rfc3339(datetime.fromtimestamp(500, timezone.utc))
    )
    assert not expiry.is_expired(at, last_access=0.0, now=499.0)
    assert expiry.is_expired(at, last_access=1000.0, now=500.0)  # access does not extend Expires-At
    assert not expiry.is_expired(expiry.Lifetime(), last_access=0.0, now=1e12)


# --------------------------------------------------------------------------- waiters


def test_waitset_wakes_times_out_fails_and_shuts_down() -> None:
    async def scenario() -> None:
        waits = WaitSet()
        flag = {"ready": False}
        task = asyncio.create_task(waits.wait_until(lambda: flag["ready"], 5))
        await asyncio.sleep(0)
        waits.notify()  # spurious wake: condition still false, keeps waiting
        await asyncio.sleep(0)
        assert not task.done()
        flag["ready"] = True
        waits.notify()
        assert await task is True

        assert await waits.wait_until(lambda: False, 0.01) is False

        task = asyncio.create_task(waits.wait_until(lambda: False, 5))
        await asyncio.sleep(0)
        waits.shutdown()
        assert await task is False

        failing = WaitSet()
        task = asyncio.create_task(failing.wait_until(lambda: False, 5))
        await asyncio.sleep(0)
        failing.fail(lambda: NotFound("gone"))
        with pytest.raises(NotFound):
            await task
        with pytest.raises(NotFound):  # later waiters fail at once
            await failing.wait_until(lambda: True, 5)
        assert len(failing) == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("essence", ["application/json", "text/plain", "application/x-ünïcode"])
@pytest.mark.parametrize("body", [b"x", b'{"n":1}', b"\x00" * 3000, bytes(range(256)) * 4])
def test_the_one_piece_append_digest_is_request_digest(essence: str, body: bytes) -> None:
    """``append_digest`` (the small append's one-frame path) hashes the same bytes in one piece."""
    expected = producers.request_digest(essence, body, False)
    assert producers.append_digest(essence, body) == expected
    assert producers.append_digest(essence, body) == expected  # its cached prefix
    assert producers.append_digest(essence, body + b"!") != expected
