"""``byte-positions`` (docs/extensions.md section 12): an offset's position counts the payload bytes before
it, so a range's payload bytes are ``position(E) - position(S)`` without asking the server.

The connector packs a batch's ranges into tasks from that difference alone, so it must hold for every
kind of stream and boundary: checked here against what the server itself says the range holds (a limit
lookup's ``bytes``, and the values a frames read of the range returns).
"""

from __future__ import annotations

import itertools

from durastream_spark.protocol.models import byte_span
from tests.server.extensions.support import (
    TEXT,
    append,
    create,
    fork,
    frames_range,
    lookup,
    position_of,
    token,
    unique,
)
from tests.support.server_process import ServerProcess


def boundaries(server: ServerProcess, path: str) -> list[str]:
    """Every message boundary of ``path``, from a frames read: each message's offset, and the tail."""
    frames, responses = frames_range(server, path, "-1")
    return [token(p) for p in frames.positions] + [responses[-1].headers["Stream-Next-Offset"]]


def assert_sizes_are_position_differences(server: ServerProcess, path: str) -> None:
    offsets = boundaries(server, path)
    assert len(offsets) > 3
    for start, end in itertools.combinations(offsets, 2):
        answer = lookup(server, path, offset=start, end=end)
        frames, _ = frames_range(server, path, start, end)
        size = position_of(end) - position_of(start)
        assert answer["bytes"] == size == sum(len(v) for v in frames.values), (start, end)
        assert byte_span(start, end) == size  # the client's reading of the tokens


def test_json_messages_of_any_size_count_their_stored_bytes(
    durastream_server: ServerProcess,
) -> None:
    path = unique("positions-json")
    create(durastream_server, path)
    append(durastream_server, path, b'[1, "two", {"three": [3]}]')  # whitespace between values
    append(durastream_server, path, '[  "\u00e9t\u00e9 \u2603" , null ]'.encode())
    append(
        durastream_server, path, b'[{"pad": "' + b"x" * 70_000 + b'"}, 7]'
    )  # past an index point
    assert_sizes_are_position_differences(durastream_server, path)


def test_byte_streams_and_forks_share_the_rule(durastream_server: ServerProcess) -> None:
    path = unique("positions-bytes")
    create(durastream_server, path, b"hello", content_type=TEXT)
    middle = append(durastream_server, path, b" world", content_type=TEXT)
    append(durastream_server, path, b"!" * 3000, content_type=TEXT)
    assert_sizes_are_position_differences(durastream_server, path)

    source = unique("positions-source")
    create(durastream_server, source, b"[1, 22, 333]")
    at = append(durastream_server, source, b'["four", "five"]')
    forked = fork(durastream_server, source, at)
    append(durastream_server, forked, b'[{"six": 6}, [7, 7]]')
    append(durastream_server, source, b'["after the fork"]')
    assert_sizes_are_position_differences(durastream_server, forked)
    assert position_of(middle) == len(b"hello world") and byte_span("-1", "-1") == 0


def test_tokens_that_are_not_positions_are_not_guessed() -> None:
    for text in ("now", "", "5", "0_5", "0000000000000000-0000000000000005", "x" * 33):
        assert byte_span("-1", text) is None and byte_span(text, token(5)) is None, text
    assert byte_span("-1", token(12345)) == 12345
    assert byte_span("-1", token(7)) == 7 and byte_span(token(3), token(7)) == 4
    other_generation = "0000000000000001_" + token(7)[17:]
    assert byte_span(token(3), other_generation) is None  # not comparable: ask the server
    assert byte_span(token(7), token(3)) is None
