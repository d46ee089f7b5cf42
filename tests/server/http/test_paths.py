"""Routing and the request-path -> stream-path mapping (unit level; see test_server_behaviour for HTTP)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durastream_server.http.paths import (
    InvalidPath,
    RouteKind,
    forked_from_path,
    route,
    stream_path,
)


def test_routes() -> None:
    assert route(b"/healthz").kind is RouteKind.HEALTH
    assert route(b"/v1/stream/a/b").kind is RouteKind.STREAM
    assert route(b"/v1/stream/a/b").target == "a/b"
    assert route(b"/elsewhere").kind is RouteKind.NOT_FOUND
    assert route(b"/v1/streamx/a").kind is RouteKind.NOT_FOUND


def test_reserved_prefix_is_routed_before_streams_with_the_raw_rest() -> None:
    sub = route(b"/v1/stream/__ds/subscriptions/sub-1/streams/events%2Fx")
    assert sub.kind is RouteKind.SUBSCRIPTIONS
    assert sub.target == "subscriptions/sub-1/streams/events%2Fx"
    assert route(b"/v1/stream/__ds").kind is RouteKind.SUBSCRIPTIONS
    assert route(b"/v1/stream/%5F%5Fds/jwks.json").kind is RouteKind.SUBSCRIPTIONS
    # Only the first segment is reserved.
    assert route(b"/v1/stream/app/__ds").kind is RouteKind.STREAM


def test_slash_and_escaped_slash_are_different_streams() -> None:
    assert stream_path(b"a/b") == "a/b"
    assert stream_path(b"a%2Fb") == "a%2Fb"
    assert stream_path(b"a%2fb") == "a%2Fb"
    assert stream_path(b"a/b") != stream_path(b"a%2Fb")


def test_equivalent_encodings_are_the_same_stream() -> None:
    assert stream_path(b"%41bc") == stream_path(b"Abc") == "Abc"
    assert stream_path(b"caf%C3%A9") == stream_path("café".encode()) == "café"
    assert stream_path(b"100%25") == "100%25"  # a literal percent sign stays escaped
    assert stream_path(b"a%20b") == "a b"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"a//b",
        b"a/",
        b"/a",
        b".",
        b"..",
        b"a/./b",
        b"a/../b",
        b"a/%2E%2E/b",
        b"a/%2e",
        b"a%00b",
        b"a%zz",
        b"a%4",
        b"a%",
        b"%C3%28",  # not UTF-8
        b"x" * 5000,
    ],
)
def test_invalid_paths(raw: bytes) -> None:
    with pytest.raises(InvalidPath):
        stream_path(raw)


def test_root_without_a_path_is_invalid() -> None:
    with pytest.raises(InvalidPath):
        route(b"/v1/stream/")
    with pytest.raises(InvalidPath):
        route(b"/v1/stream")


def test_forked_from_accepts_url_path_full_url_and_relative_path() -> None:
    assert forked_from_path("/v1/stream/src/a") == "src/a"
    assert forked_from_path("http://host:1/v1/stream/src/a") == "src/a"
    assert forked_from_path("src/a") == "src/a"
    assert forked_from_path("/v1/stream/a%2Fb") == "a%2Fb"
    with pytest.raises(InvalidPath):
        forked_from_path("/other/src")
    with pytest.raises(InvalidPath):
        forked_from_path("/v1/stream/")


@given(st.binary(max_size=40) | st.text(alphabet="ab/.%2F41\x00é ?", max_size=12).map(str.encode))
def test_a_plain_path_taken_as_it_is_is_what_decoding_it_makes(raw: bytes) -> None:
    """``stream_path`` takes a path without ``%``, ``.``, NUL or non-ASCII bytes as it is; for every
    input it answers (or refuses) exactly as the segment-by-segment decoding does."""
    from durastream_server.http import paths

    try:
        expected: str | type[InvalidPath] = paths._decoded_path(raw) if raw else InvalidPath
    except InvalidPath:
        expected = InvalidPath
    try:
        got: str | type[InvalidPath] = paths.stream_path(raw)
    except InvalidPath:
        got = InvalidPath
    assert got == expected
