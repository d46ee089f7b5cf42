"""Message-count bombs (issue 14): memory and event-loop time follow configuration, not what a client sends.

An 8 MiB ``[0,0,...]`` is 4.2 million messages. Appends carry at most ``--max-messages-per-request`` of
them (413 naming the limit and the flag); every byte budget counts a per-message overhead (read chunks,
staged handles); and every read flavour answers a stream of tiny messages in bounded responses, with the
per-message work off the event loop, so ``/healthz`` is answered while such a read is in flight.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
import requests

from durastream_server.config import DEFAULT_MAX_MESSAGES_PER_REQUEST
from tests.support.server_process import ServerProcess

JSON = {"Content-Type": "application/json"}
CAP_FLAG = "--max-messages-per-request"


def zeros(count: int) -> bytes:
    return b"[" + b"0," * (count - 1) + b"0]"


def _error(response: requests.Response) -> dict:
    assert response.headers["Content-Type"] == "application/json"
    return response.json()["error"]


def _assert_too_many(response: requests.Response, limit: int) -> None:
    assert response.status_code == 413, (response.status_code, response.text[:300])
    error = _error(response)
    assert error["code"] == "TOO_MANY_MESSAGES"
    assert str(limit) in error["message"] and CAP_FLAG in error["message"]


def test_an_append_over_the_default_cap_gets_413_and_appends_nothing(durastream_server) -> None:
    url = durastream_server.stream_url("bombs/default-cap")
    assert requests.put(url, headers=JSON).status_code == 201
    response = requests.post(url, data=zeros(DEFAULT_MAX_MESSAGES_PER_REQUEST + 1), headers=JSON)
    _assert_too_many(response, DEFAULT_MAX_MESSAGES_PER_REQUEST)
    assert requests.get(url, params={"offset": "-1"}).content == b"[]"
    accepted = requests.post(url, data=zeros(DEFAULT_MAX_MESSAGES_PER_REQUEST), headers=JSON)
    assert accepted.status_code == 204
    assert requests.get(durastream_server.base_url + "/healthz").status_code == 200


def test_the_cap_counts_top_level_elements_only(server_factory) -> None:
    server = server_factory(extra_args=[CAP_FLAG, "10"])
    url = server.stream_url("bombs/cap")
    assert requests.put(url, headers=JSON).status_code == 201
    # Many commas, few messages: nested arrays, strings with commas and brackets, deep nesting.
    nested = b"[" + b",".join([b"[" + b",".join([b"0"] * 50) + b"]"] * 10) + b"]"
    strings = json.dumps(["a,b,[c],{d}" * 20] * 10).encode()
    deep = b"[" + b",".join([b"[" * 12 + b"1,2,3" + b"]" * 12] * 10) + b"]"
    for body in (nested, strings, deep, zeros(10)):
        assert requests.post(url, data=body, headers=JSON).status_code == 204, body[:80]
    for body in (
        zeros(11),
        b"[" + b",".join([b"[[1,2],[3]]"] * 11) + b"]",
        json.dumps(["x,]"] * 11).encode(),
    ):
        _assert_too_many(requests.post(url, data=body, headers=JSON), 10)
    # A create's initial body and a stage are requests of the same kind.
    _assert_too_many(
        requests.put(server.stream_url("bombs/cap-create"), data=zeros(11), headers=JSON), 10
    )
    staged = requests.post(url, data=zeros(11), headers={**JSON, "Durastream-Txn": "h1"})
    _assert_too_many(staged, 10)
    assert len(requests.get(url, params={"offset": "-1"}).json()) == 4 * 10


def test_the_cap_is_a_flag_with_a_default_in_help() -> None:
    from durastream_server.cli import build_parser

    help_text = build_parser().format_help()
    assert CAP_FLAG in help_text and str(DEFAULT_MAX_MESSAGES_PER_REQUEST) in help_text
    assert build_parser().parse_args([]).max_messages_per_request == 100_000


def test_staged_bytes_count_a_per_message_overhead(server_factory) -> None:
    server = server_factory(extra_args=["--max-staged-bytes", "1000"])
    url = server.stream_url("bombs/staged")
    assert requests.put(url, headers=JSON).status_code == 201
    # 100 one-byte messages: 100 payload bytes, but 100 messages of per-message cost.
    response = requests.post(url, data=zeros(100), headers={**JSON, "Durastream-Txn": "h"})
    assert response.status_code == 413, response.text
    assert _error(response)["code"] == "TXN_TOO_LARGE"
    # The same payload in few messages fits.
    few = json.dumps(["x" * 30] * 3).encode()
    assert requests.post(url, data=few, headers={**JSON, "Durastream-Txn": "h2"}).status_code in (
        200,
        204,
    )


# ---- reads ------------------------------------------------------------------------------------------

CHUNK = 64 * 1024


def _fill(server: ServerProcess, path: str, messages: int, per_append: int = 50_000) -> str:
    url = server.stream_url(path)
    assert requests.put(url, headers=JSON).status_code == 201
    session = requests.Session()
    left = messages
    while left:
        count = min(per_append, left)
        assert session.post(url, data=zeros(count), headers=JSON).status_code == 204
        left -= count
    return requests.head(url).headers["Stream-Next-Offset"]


def _read_through(url: str, query: dict[str, str], tail: str) -> list[requests.Response]:
    responses = []
    offset = "-1"
    session = requests.Session()
    while offset != tail:
        response = session.get(url, params={"offset": offset, **query})
        assert response.status_code == 200, (query, response.status_code, response.text[:200])
        responses.append(response)
        offset = response.headers["Stream-Next-Offset"]
        assert len(responses) < 10_000
    return responses


def _sse_events(url: str, tail: str) -> list[tuple[str, bytes]]:
    """The SSE events of one connection from the start, until up to date at ``tail``."""
    events = []
    with requests.get(url, params={"offset": "-1", "live": "sse"}, stream=True) as response:
        kind, data = "", []
        for line in response.iter_lines():
            if line.startswith(b"event:"):
                kind = line.split(b":", 1)[1].strip().decode()
            elif line.startswith(b"data:"):
                data.append(line[5:])
            elif not line and kind:
                payload = b"\n".join(data)
                events.append((kind, payload))
                if kind == "control":
                    control = json.loads(payload)
                    if control.get("upToDate") and control["streamNextOffset"] == tail:
                        return events
                kind, data = "", []
    raise AssertionError("SSE ended before the tail")


def test_every_read_flavour_answers_tiny_messages_in_bounded_responses(server_factory) -> None:
    """A chunk counts 24 bytes per message beyond its bytes: a read of 1-byte messages comes in many
    responses, each no larger than --chunk-bytes (on main a plain JSON read answered 2x the chunk, and
    every message of it was an object of its own on the event loop)."""
    server = server_factory(extra_args=["--chunk-bytes", str(CHUNK)])
    total = 60_000
    tail = _fill(server, "bombs/tiny", total)
    url = server.stream_url("bombs/tiny")
    flavours = [
        {},
        {"end": tail},
        {"live": "long-poll"},
    ]
    for query in flavours:
        responses = _read_through(url, query, tail)
        assert len(responses) > 10, (query, len(responses))  # many pieces, not one
        values = []
        for response in responses:
            assert len(response.content) <= CHUNK, (query, len(response.content))
            values.extend(response.json())
        assert values == [0] * total, query
    for fmt in ("frames", "frames-lines"):
        responses = _read_through(url, {"format": fmt}, tail)
        assert len(responses) > 10
        assert all(len(r.content) <= CHUNK for r in responses)
        counts = [int.from_bytes(r.content[4:8], "little") for r in responses]
        assert sum(counts) == total
    events = _sse_events(url, tail)
    data = [payload for kind, payload in events if kind == "data"]
    assert len(data) > 10
    assert all(len(payload) <= CHUNK for payload in data)
    assert sum(len(json.loads(payload)) for payload in data) == total
    lookup = requests.get(url, params={"offset": "-1", "lookup": "limit", "max_messages": total})
    assert lookup.json()["messages"] == total and lookup.json()["end"] == tail


def test_healthz_is_answered_while_a_read_of_millions_of_tiny_messages_is_in_flight(
    server_factory,
) -> None:
    """4.2 million 1-byte messages (what one 8 MiB append carried on main) read from the start. On main
    the plain read answered them in one response built on the event loop, and /healthz waited for it
    (6 s here). Now the read streams out in bounded responses whose per-message work runs in the read
    executor: every /healthz sent while the read is in flight is answered, polled with a deadline."""
    server = server_factory()
    messages = 4_194_303
    tail = _fill(server, "bombs/millions", messages, per_append=100_000)
    url = server.stream_url("bombs/millions")
    done = threading.Event()
    outcome: dict[str, object] = {}

    def read() -> None:
        try:
            outcome["responses"] = len(_read_through(url, {}, tail))
        except Exception as exc:  # reported by the main thread
            outcome["error"] = exc
        finally:
            done.set()

    reader = threading.Thread(target=read)
    reader.start()
    answered = 0
    connection = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        while not done.is_set():
            connection.request("GET", "/healthz")
            response = connection.getresponse()  # raises TimeoutError past the deadline
            response.read()
            assert response.status == 200
            answered += 1
            time.sleep(0.005)
    finally:
        connection.close()
        reader.join()
    assert "error" not in outcome, outcome
    assert outcome["responses"] > 10  # the read came in pieces
    assert answered >= 1


@pytest.mark.parametrize("limit", [1, 7])
def test_a_tiny_cap_still_admits_single_values_and_byte_streams(server_factory, limit) -> None:
    server = server_factory(extra_args=[CAP_FLAG, str(limit)])
    json_url = server.stream_url("bombs/single")
    assert requests.put(json_url, headers=JSON).status_code == 201
    assert requests.post(json_url, data=b'{"a":[1,2,3,4,5,6,7,8]}', headers=JSON).status_code == 204
    bytes_url = server.stream_url("bombs/bytes")
    headers = {"Content-Type": "application/octet-stream"}
    assert requests.put(bytes_url, headers=headers).status_code == 201
    assert requests.post(bytes_url, data=b"0," * 1000, headers=headers).status_code == 204


@pytest.mark.parametrize("depth", [2_000, 200_000])
def test_json_nested_too_deeply_gets_a_400_that_says_so_and_appends_nothing(
    durastream_server, depth: int
) -> None:
    """Both parsers give up past ~1,000 levels with a ``RecursionError``; its message names the
    interpreter. The client gets the reason in the body's terms, as a 400, and the server keeps serving
    (2,000 levels is a 4 KB body, 200,000 levels a 400 KB one, checked off the event loop)."""
    url = durastream_server.stream_url(f"bombs/deep-{depth}")
    assert requests.put(url, headers=JSON).status_code == 201
    for body in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        response = requests.post(url, data=body, headers=JSON)
        assert response.status_code == 400, (response.status_code, response.text[:300])
        error = _error(response)
        assert error["code"] == "INVALID_JSON"
        assert "nested too deeply" in error["message"] and "recursion" not in error["message"]
    assert requests.get(url, params={"offset": "-1"}).content == b"[]"
    assert requests.post(url, data=b"[[[1]]]", headers=JSON).status_code == 204
