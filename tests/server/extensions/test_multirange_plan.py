"""The multi-range read's group planning (``Engine.plan_group``) and its batch paths.

``plan_group`` plans the common range (an unforked, idle stream with no expiry, read from ``-1`` or
a canonical token to its durable tail) inline, and hands every other range to ``plan_messages``.
Each test mixes ranges of both kinds in one group, so a wrong inline decision shows as an answer
that differs from the range's single read. The frames body of a group of runs is built by
``frames._encode_only_runs``: the same bytes as the general encoder.
"""

from __future__ import annotations

import random
from pathlib import Path

import requests

from durastream_server.http import frames
from durastream_server.offsets import format_offset
from durastream_server.storage.records import MessageRun
from tests.server.extensions.support import TIMEOUT, unique
from tests.server.extensions.test_multirange import decode_multi, post
from tests.server.extensions.test_multirange_batch import (
    _messages,
    _post,
    _put,
    _same_as_single_reads,
    _single,
)
from tests.server.test_hazards import kill_when_synced
from tests.support.server_process import ServerProcess

JSON = "application/json"


def _planned_apart(server: ServerProcess) -> list[dict[str, str]]:
    """Ranges among plain ones that ``plan_group`` must not plan inline: a stream with a TTL, one
    with an Expires-At, ``offset=now``, an end before the tail (a boundary the index knows, and one
    inside a message), a start beyond the end, and a fork."""
    session = requests.Session()
    ranges: list[dict[str, str]] = []
    plain = []
    for i in range(40):
        path = unique(f"plan-{i}")
        if i % 2:
            tail = _put(session, server, path, _messages(i, 2))
        else:
            _put(session, server, path)
            tail = _post(session, server, path, _messages(i, 3))
        plain.append({"path": path, "offset": "-1", "end": tail})
    ttl = unique("plan-ttl")
    response = session.put(
        server.stream_url(ttl),
        data=_messages(1, 2),
        headers={"Content-Type": JSON, "Stream-TTL": "3600"},
        timeout=TIMEOUT,
    )
    assert response.status_code == 201, response.text
    expires = unique("plan-expires")
    response = session.put(
        server.stream_url(expires),
        data=_messages(2, 2),
        headers={"Content-Type": JSON, "Stream-Expires-At": "2099-01-01T00:00:00Z"},
        timeout=TIMEOUT,
    )
    assert response.status_code == 201, response.text
    two = plain[3]
    first_end = two["end"]
    longer = _post(session, server, two["path"], _messages(3, 4))
    fork = unique("plan-fork")
    response = session.put(
        server.stream_url(fork),
        headers={
            "Content-Type": JSON,
            "Stream-Forked-From": "/v1/stream/" + plain[5]["path"],
        },
        timeout=TIMEOUT,
    )
    assert response.status_code == 201, response.text
    fork_tail = response.headers["Stream-Next-Offset"]

    def tail(path: str) -> str:
        return session.head(server.stream_url(path), timeout=TIMEOUT).headers["Stream-Next-Offset"]

    special = [
        {"path": ttl, "offset": "-1", "end": tail(ttl)},
        {"path": expires, "offset": "-1", "end": tail(expires)},
        {"path": plain[1]["path"], "offset": "now", "end": plain[1]["end"]},
        {"path": two["path"], "offset": "-1", "end": first_end},  # a boundary before the tail
        {"path": two["path"], "offset": first_end, "end": longer},
        {"path": plain[7]["path"], "offset": "-1", "end": format_offset(1)},  # inside a message
        {"path": plain[9]["path"], "offset": plain[9]["end"], "end": format_offset(0)},
        {"path": fork, "offset": "-1", "end": fork_tail},
    ]
    two["end"] = longer
    for at, item in enumerate(special):
        ranges.extend(plain[at * 5 : at * 5 + 5])
        ranges.append(item)
    return ranges


def test_ranges_planned_apart_answer_as_their_single_reads(server_factory) -> None:
    """In one group, ranges planned inline and ranges handed to ``plan_messages`` (TTL, Expires-At,
    ``now``, an end before the tail, an end inside a message, a start past the end, a fork) each
    answer their single read's messages or error, packed and from directories."""
    for args in (("--packed-appends",), ("--no-packed-appends",)):
        server = server_factory(extra_args=args)
        ranges = _planned_apart(server)
        # The end inside a message and the start past the end are 400s, as their single reads.
        assert _same_as_single_reads(server, ranges) == 2


def test_a_damaged_record_fails_its_range_alone(server_factory) -> None:
    """A range of a group whose record fails its checksum answers the single read's error (500
    ``CORRUPT_STREAM``); the ranges before and after it in the group answer their messages."""
    server = server_factory(extra_args=("--no-packed-appends",))
    session = requests.Session()
    ranges = []
    for i in range(30):
        path = unique(f"damage-{i}")
        ranges.append({"path": path, "offset": "-1", "end": _put(session, server, path)})
    victim = ranges[15]
    marker = b"D" * 64
    middle_start = _post(session, server, victim["path"], b'["' + b"A" * 64 + b'"]')
    middle_end = _post(session, server, victim["path"], b'["' + marker + b'"]')
    victim["end"] = _post(session, server, victim["path"], b'["' + b"C" * 64 + b'"]')
    for item in ranges:
        if item is not victim:
            item["end"] = _post(session, server, item["path"], _messages(7, 3))
    ranges.insert(16, {"path": victim["path"], "offset": middle_start, "end": middle_end})
    kill_when_synced(server)
    damaged = 0
    for segment in Path(server.data_dir, "streams").glob("*/*.seg"):
        data = bytearray(segment.read_bytes())
        at = data.find(marker)
        if at >= 0:
            data[at + 10] ^= 0xFF
            segment.write_bytes(bytes(data))
            damaged += 1
    assert damaged == 1
    server.restart()
    response = post(server, "reads", {"ranges": ranges})
    assert response.status_code == 200, response.text
    entries, body = decode_multi(response.content)
    assert len(entries) == len(ranges)
    at = 0
    for asked, entry in zip(ranges, entries, strict=True):
        if asked["offset"] == middle_start:
            assert entry["error"]["status"] == 500, entry
            assert entry["error"]["code"] == "CORRUPT_STREAM", entry
            continue
        if asked is victim:
            continue  # its whole range crosses the damaged record too
        expected, error = _single(server, asked)
        assert error is None, (asked, error)
        assert entry["messages"] == len(expected.values)
        assert body.values[at : at + entry["messages"]] == expected.values
        assert body.positions[at : at + entry["messages"]] == expected.positions
        at += entry["messages"]


def _random_runs(rng: random.Random) -> list[MessageRun]:
    runs = []
    position = rng.randint(0, 1000)
    for _ in range(rng.randint(1, 40)):
        lengths = tuple(rng.randint(1, 30) for _ in range(rng.randint(1, 12)))
        data = rng.randbytes(sum(lengths))
        runs.append(MessageRun(position, data, lengths, rng.randint(0, 2**41)))
        position += sum(lengths) + rng.choice((0, 0, 3, 1000))
    return runs


def test_the_runs_encoder_gives_the_general_encoders_bytes() -> None:
    """``encode`` of runs alone (a multi-range answer) takes the per-column C-level path; its body is
    the general run encoder's, byte for byte, for runs of one and many messages, side by side and
    apart, and ``frames-lines`` still goes the general way."""
    rng = random.Random(16)
    for _ in range(200):
        runs = _random_runs(rng)
        assert frames.encode(runs, lines=False) == frames._encode_runs(runs, lines=False)
    runs = [MessageRun(0, b'{"a":1}{"b":2}', (7, 7), 5)]
    assert frames.encode(runs, lines=True) == frames._encode_runs(runs, lines=True)
