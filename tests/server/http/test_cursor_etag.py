"""Cursor generation (section 10.1) and ETag / If-None-Match matching (hazard 41)."""

from __future__ import annotations

import random

import pytest

from durastream_server.http.cursor import (
    CURSOR_EPOCH,
    INTERVAL_SECONDS,
    current_interval,
    next_cursor,
)
from durastream_server.http.etag import if_none_match, make_etag


def test_cursor_is_the_interval_number() -> None:
    now = CURSOR_EPOCH + 1000 * INTERVAL_SECONDS + 5
    assert current_interval(now) == 1000
    assert next_cursor(None, clock=lambda: now) == "1000"
    assert next_cursor("999", clock=lambda: now) == "1000"  # an old cursor: the current interval


def test_cursor_at_or_past_now_moves_strictly_forward_with_jitter() -> None:
    now = CURSOR_EPOCH + 1000 * INTERVAL_SECONDS
    rng = random.Random(7)
    for client in ("1000", "1001", "5000"):
        for _ in range(200):
            cursor = int(next_cursor(client, clock=lambda: now, rng=rng))
            assert int(client) < cursor <= int(client) + 3600 // INTERVAL_SECONDS


@pytest.mark.parametrize("junk", ["", "abc", "-5", "1e3", "١٢٣", "9" * 40])
def test_junk_client_cursor_is_ignored(junk: str) -> None:
    now = CURSOR_EPOCH + 42 * INTERVAL_SECONDS
    assert next_cursor(junk, clock=lambda: now) == "42"


def test_etag_shape_and_closure_marker() -> None:
    open_tag = make_etag("id", "a", "b", closed=False)
    closed_tag = make_etag("id", "a", "b", closed=True)
    assert open_tag == '"id:a:b"'
    assert closed_tag == '"id:a:b:c"'
    assert open_tag != closed_tag


def test_if_none_match() -> None:
    etag = '"id:a:b"'
    assert if_none_match(etag, etag)
    assert if_none_match(f'W/"x", {etag}', etag)
    assert if_none_match(f'"x",W/{etag}', etag)
    assert if_none_match("*", etag)
    assert if_none_match("id:a:b", etag)  # lenient: an unquoted tag from a sloppy client
    assert not if_none_match('"id:a:b:c"', etag)
    assert not if_none_match('"wrong-etag"', etag)
    assert not if_none_match("", etag)
    assert not if_none_match(None, etag)
    assert not if_none_match('"a,b"', '"a"')  # commas inside quotes do not split
