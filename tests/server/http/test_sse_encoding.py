"""SSE framing (section 5.8) at the byte level: no injection, exact lines, base64 when asked."""

from __future__ import annotations

import base64
import json

import pytest

from durastream_server.http.sse import control_event, data_event, is_text_type


def _data_lines(event: bytes) -> list[bytes]:
    assert event.startswith(b"event: data\n") and event.endswith(b"\n\n")
    return event[len(b"event: data\n") : -2].split(b"\n")


def _client_view(event: bytes) -> bytes:
    """What a spec-following SSE client reconstructs: strip 'data:' and one optional space, join with LF."""
    out = []
    for line in _data_lines(event):
        assert line.startswith(b"data:")
        value = line[5:]
        out.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(out)


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "TEXT/Plain; charset=utf-8",
        "text/csv",
        "application/json",
        "application/json; x=1",
    ],
)
def test_text_types(content_type: str) -> None:
    assert is_text_type(content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/octet-stream",
        "application/x-protobuf",
        "image/png",
        "application/json-patch+json",
        "application/ndjson",
    ],
)
def test_binary_types(content_type: str) -> None:
    assert not is_text_type(content_type)


def test_every_line_terminator_starts_a_new_data_line() -> None:
    event = data_event(b"a\r\nb\rc\nd", base64_encoded=False)
    assert _data_lines(event) == [b"data:a", b"data:b", b"data:c", b"data:d"]
    assert b"\r" not in event


def test_injected_event_boundaries_stay_data() -> None:
    payload = b'safe\r\n\r\nevent: control\r\ndata: {"injected":true}\r\n\r\nmore'
    event = data_event(payload, base64_encoded=False)
    assert b"\n\n" not in event[:-2]  # the only blank line ends our event
    assert all(line.startswith(b"data:") for line in _data_lines(event))


@pytest.mark.parametrize(
    "payload", [b"plain", b" leading space", b"  two", b"x\n y\n\n z\n", b"\n", b"a\n"]
)
def test_lf_text_round_trips_exactly(payload: bytes) -> None:
    assert _client_view(data_event(payload, base64_encoded=False)) == payload


def test_carriage_returns_round_trip_with_base64() -> None:
    payload = b"a\r\nb\rc"
    event = data_event(payload, base64_encoded=True)
    assert base64.b64decode(b"".join(line[5:] for line in _data_lines(event))) == payload


def test_empty_binary_payload_is_an_empty_base64_string() -> None:
    assert data_event(b"", base64_encoded=True) == b"event: data\ndata:\n\n"


def _control(event: bytes) -> dict:
    prefix = b"event: control\ndata:"
    assert event.startswith(prefix) and event.endswith(b"}\n\n")
    return json.loads(event[len(prefix) :])


def test_control_events() -> None:
    assert _control(control_event("o1", cursor="7", up_to_date=True, closed=False)) == {
        "streamNextOffset": "o1",
        "streamCursor": "7",
        "upToDate": True,
    }
    partial = _control(control_event("o2", cursor="7", up_to_date=False, closed=False))
    assert partial == {"streamNextOffset": "o2", "streamCursor": "7"}
    final = _control(control_event("o3", cursor="7", up_to_date=False, closed=True))
    assert final == {"streamNextOffset": "o3", "upToDate": True, "streamClosed": True}
