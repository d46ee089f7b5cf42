"""Header and query parsing: strict syntax, so malformed values never reach the engine."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from durastream_server.errors import BadRequest
from durastream_server.http import parse
from durastream_server.storage.records import ProducerTuple


def test_header_map_lowercases_and_combines_repeats() -> None:
    headers = parse.header_map([(b"Content-Type", b"text/plain"), (b"X-A", b"1"), (b"x-a", b"2")])
    assert headers == {"content-type": "text/plain", "x-a": "1, 2"}


def test_header_map_takes_any_iterable_and_combines_repeats_after_other_names() -> None:
    # Not a list (the fast comprehension needs a length), and a repeat far from its first value.
    raw = ((name, value) for name, value in [(b"A", b"1"), (b"b", b"2"), (b"a", b"3")])
    assert parse.header_map(raw) == {"a": "1, 3", "b": "2"}
    assert parse.header_map(()) == {}


def test_producer_id_length_is_counted_in_bytes() -> None:
    at_limit = {"producer-epoch": "0", "producer-seq": "0"}
    assert parse.producer({**at_limit, "producer-id": "\xe9" * parse.MAX_PRODUCER_ID_BYTES})
    with pytest.raises(BadRequest, match="longer than"):
        parse.producer({**at_limit, "producer-id": "x" * (parse.MAX_PRODUCER_ID_BYTES + 1)})
    with pytest.raises(BadRequest, match="missing Producer-Epoch"):
        parse.producer({"producer-id": "p", "producer-seq": "0"})


def test_header_map_keeps_every_byte() -> None:
    headers = parse.header_map([(b"stream-seq", bytes([0x7F, 0x80, 0xFF]))])
    assert headers["stream-seq"].encode("latin-1") == bytes([0x7F, 0x80, 0xFF])


@pytest.mark.parametrize(("value", "closed"), [("true", True), ("TRUE", True), ("True", True)])
def test_stream_closed_true_case_insensitively(value: str, closed: bool) -> None:
    assert parse.stream_closed({"stream-closed": value}) is closed


@pytest.mark.parametrize("value", ["false", "yes", "1", "", "truee", "t"])
def test_stream_closed_anything_else_is_absent(value: str) -> None:
    assert parse.stream_closed({"stream-closed": value}) is False
    assert parse.stream_closed({}) is False


@pytest.mark.parametrize(("text", "seconds"), [("0", 0), ("1", 1), ("3600", 3600)])
def test_ttl_accepts_canonical_integers(text: str, seconds: int) -> None:
    assert parse.ttl_seconds(text) == seconds


@pytest.mark.parametrize(
    "text", ["+3600", "03600", "3600.0", "3.6e3", "1e3", "-1", "abc", "", " ", "0x10", "10" * 20]
)
def test_ttl_rejects_everything_else(text: str) -> None:
    with pytest.raises(BadRequest):
        parse.ttl_seconds(text)


def test_expires_at_accepts_rfc3339_forms() -> None:
    expected = datetime(2030, 1, 2, 3, 4, 5, 123000, tzinfo=timezone.utc)
    assert parse.expires_at("2030-01-02T03:04:05.123Z") == expected
    assert parse.expires_at("2030-01-02T03:04:05.123+00:00") == expected
    assert parse.expires_at("2030-01-02t03:04:05.123456789z") == expected.replace(
        microsecond=123456
    )
    later = parse.expires_at("2030-01-02T05:04:05+02:00")
    assert later is not None and later.utcoffset() == timedelta(hours=2)
    assert later == datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "text",
    [
        "not-a-timestamp",
        "2030-01-02",
        "2030-01-02T03:04:05",  # no offset: ambiguous, rejected
        "2030-13-02T03:04:05Z",
        "2030-01-02T25:04:05Z",
        "2030-01-02 03:04:05Z",
        "1735689600",
    ],
)
def test_expires_at_rejects_non_rfc3339(text: str) -> None:
    with pytest.raises(BadRequest):
        parse.expires_at(text)


@pytest.mark.parametrize(
    "text",
    [
        "9999-12-31T23:59:59-23:59",  # year 10000 in UTC
        "0001-01-01T00:00:00+23:59",  # year 0 in UTC
        "0000-01-01T00:00:00Z",
        "999-12-31T00:00:00Z",
        "2030-01-01T00:00:00+24:00",
        "\u0661\u0669\u0667\u0660-01-01T00:00:00Z",  # Arabic-Indic digits are not RFC 3339 digits
    ],
)
def test_expires_at_outside_the_range_names_header_value_and_range(text: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse.expires_at(text)
    message = caught.value.message
    assert "Stream-Expires-At" in message and repr(text) in message
    assert "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z" in message


def test_expires_at_accepts_the_ends_of_the_range() -> None:
    assert parse.expires_at("0001-01-01T00:00:00Z") == datetime(1, 1, 1, tzinfo=timezone.utc)
    assert parse.expires_at("9999-12-31T23:59:59.999999Z") == datetime.max.replace(
        tzinfo=timezone.utc
    )
    assert parse.expires_at("0999-12-31T00:00:00Z") == datetime(999, 12, 31, tzinfo=timezone.utc)


def _producer_headers(pid: str = "p", epoch: str = "0", seq: str = "0") -> dict[str, str]:
    return {"producer-id": pid, "producer-epoch": epoch, "producer-seq": seq}


def test_producer_parses_all_three_headers() -> None:
    assert parse.producer(_producer_headers("svc-1", "3", "17")) == ProducerTuple("svc-1", 3, 17)
    assert parse.producer({}) is None
    assert parse.producer(_producer_headers(epoch=str(2**53 - 1))) == ProducerTuple(
        "p", 2**53 - 1, 0
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"producer-id": "p"},
        {"producer-epoch": "0"},
        {"producer-id": "p", "producer-epoch": "0"},
        _producer_headers(pid=""),
        _producer_headers(epoch="1abc"),
        _producer_headers(epoch="0xyz"),
        _producer_headers(epoch="1e3"),
        _producer_headers(epoch="-1"),
        _producer_headers(seq="+1"),
        _producer_headers(seq="1.0"),
        _producer_headers(seq=str(2**53)),
        _producer_headers(seq="9" * 5000),  # would trip int()'s digit limit if not bounded first
        _producer_headers(pid="x" * 2000),
    ],
)
def test_producer_rejects_malformed_headers(headers: dict[str, str]) -> None:
    with pytest.raises(BadRequest):
        parse.producer(headers)


def test_create_request_maps_headers() -> None:
    request = parse.create_request(
        "a/b",
        {
            "content-type": "application/json",
            "stream-ttl": "60",
            "stream-closed": "TRUE",
            "stream-forked-from": "/v1/stream/src/x",
            "stream-fork-offset": "0000000000000000_0000000000000004",
            "stream-fork-sub-offset": "2",
        },
        b"[]",
    )
    assert request.path == "a/b"
    assert request.content_type == "application/json"
    assert request.ttl_seconds == 60
    assert request.closed is True
    assert request.forked_from == "src/x"
    assert request.fork_offset == "0000000000000000_0000000000000004"
    assert request.fork_sub_offset == 2
    assert request.body == b"[]"


def test_create_request_without_content_type_leaves_the_default_to_the_engine() -> None:
    assert parse.create_request("s", {}, b"").content_type is None
    assert parse.create_request("s", {"content-type": "  "}, b"").content_type is None


@pytest.mark.parametrize("raw", ["json", "application/json/x", "text /plain", "a/b/c", "/plain"])
@pytest.mark.parametrize("fork", [False, True])
def test_a_create_with_a_malformed_content_type_is_refused_naming_it(raw: str, fork: bool) -> None:
    """Not given the default: ``json`` would otherwise make a binary stream the writer never asked for
    (a fork's invalid type is refused too, rather than taken as "inherit")."""
    headers = {"content-type": raw}
    if fork:
        headers["stream-forked-from"] = "/v1/stream/src"
    with pytest.raises(BadRequest) as refused:
        parse.create_request("s", headers, b"")
    assert repr(raw) in str(refused.value) and "type/subtype" in str(refused.value)


@pytest.mark.parametrize(
    "headers",
    [
        {"stream-ttl": "60", "stream-expires-at": "2030-01-01T00:00:00Z"},
        {"stream-fork-offset": "0000000000000000_0000000000000000"},
        {"stream-fork-sub-offset": "0"},
        {"stream-forked-from": "/v1/stream/src", "stream-fork-offset": "0_5"},
        {"stream-forked-from": "/v1/stream/src", "stream-fork-offset": "-1"},
        {"stream-forked-from": "/v1/stream/src", "stream-fork-sub-offset": "05"},
        {"stream-forked-from": "/v1/stream/src", "stream-fork-sub-offset": "-1"},
        {"stream-forked-from": "/v1/stream/src", "stream-fork-sub-offset": "1.5"},
        {"stream-forked-from": "/elsewhere/src"},
        {"stream-forked-from": "/v1/stream/a/../b"},
    ],
)
def test_create_request_rejects_malformed_headers(headers: dict[str, str]) -> None:
    with pytest.raises(BadRequest):
        parse.create_request("s", headers, b"")


def test_append_request_rules() -> None:
    plain = parse.append_request("s", {"content-type": "text/plain", "stream-seq": "007"}, b"x")
    assert (plain.content_type, plain.stream_seq, plain.close, plain.producer) == (
        "text/plain",
        "007",
        False,
        None,
    )
    close_only = parse.append_request(
        "s", {"content-type": "application/json", "stream-closed": "true"}, b""
    )
    assert close_only.close is True
    assert close_only.content_type is None  # an empty close is never judged by its content type
    with pytest.raises(BadRequest):
        parse.append_request("s", {"content-type": "text/plain"}, b"")  # empty without close
    with pytest.raises(BadRequest):
        parse.append_request("s", {}, b"data")  # body without a content type


@pytest.mark.parametrize(
    ("query", "offset", "live", "cursor"),
    [
        (b"", "-1", None, None),
        (b"offset=-1", "-1", None, None),
        (b"offset=now&live=long-poll&cursor=123", "now", "long-poll", "123"),
        (
            b"live=sse&offset=0000000000000000_0000000000000007",
            "0000000000000000_0000000000000007",
            "sse",
            None,
        ),
        (b"offset=-1&foo=bar&baz", "-1", None, None),
    ],
)
def test_read_params(query: bytes, offset: str, live: str | None, cursor: str | None) -> None:
    params = parse.read_params(query)
    assert (params.offset, params.live, params.cursor) == (offset, live, cursor)
    assert params.sse_base64 is False


@pytest.mark.parametrize(
    "query",
    [
        b"offset=",
        b"offset=a&offset=b",
        b"offset=0,1",
        b"offset=0%201",
        b"offset=0_5",
        b"offset=..%2Fx",
        b"offset=%00",
        b"live=long-poll",
        b"live=sse",
        b"offset=-1&live=poll",
        b"offset=-1&live=sse&live=sse",
        b"&".join([b"k=v"] * 100),
    ],
)
def test_read_params_rejects(query: bytes) -> None:
    with pytest.raises(BadRequest):
        parse.read_params(query)


def test_read_params_sse_base64_opt_in() -> None:
    assert parse.read_params(b"offset=-1&live=sse&sse_encoding=base64").sse_base64 is True
    assert parse.read_params(b"offset=-1&live=sse&sse_encoding=text").sse_base64 is False
