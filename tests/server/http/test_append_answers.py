"""An append's answer as the direct path writes it (``StreamHandlers.append_answer_lines``, pre-encoded
pieces) is byte for byte the generic encoding of ``append_answer`` (``responses.response_headers`` then
``fastpath.prepare``), for every kind of outcome."""

from __future__ import annotations

import itertools

import pytest

from durastream_server.engine.api import AppendRequest, AppendResult
from durastream_server.http import fastpath, responses
from durastream_server.http.handlers import StreamHandlers
from durastream_server.storage.records import ProducerTuple

pytestmark = pytest.mark.skipif(
    fastpath.HttpToolsProtocol is None, reason="no httptools protocol: no fast path"
)

CORS = [(b"access-control-allow-origin", b"http://localhost:3000"), (b"vary", b"Origin")]


def _requests() -> list[AppendRequest]:
    tuples = [None, ProducerTuple("p", 0, 0), ProducerTuple("p-\xe9", 7, 2**53 - 1)]
    return [
        AppendRequest(path="s", content_type="application/json", body=body, producer=p, close=c)
        for p, body, c in itertools.product(tuples, [b"", b'{"a":1}'], [False, True])
    ]


def _results() -> list[AppendResult]:
    return [
        AppendResult(
            next_offset=offset,
            closed=closed,
            duplicate=duplicate,
            producer_epoch=epoch,
            producer_seq=seq,
            verified=verified,
        )
        for offset, closed, duplicate, (epoch, seq), verified in itertools.product(
            ["0000000000000000_0000000000000000", "0000000000000001_00000000000000ff"],
            [False, True],
            [False, True],
            [(None, None), (3, 9)],
            [False, True],
        )
    ]


@pytest.mark.parametrize("extra", [[], CORS])
def test_pre_encoded_answers_equal_the_generic_encoding(extra: list[tuple[bytes, bytes]]) -> None:
    defaults = [(b"server", b"uvicorn"), (b"date", b"Fri, 27 Nov 2026 07:00:00 GMT")]
    compared = 0
    for append, result in itertools.product(_requests(), _results()):
        status, headers = StreamHandlers.append_answer(append, result)
        generic = fastpath.prepare(
            status, [*responses.response_headers(status, headers, b""), *extra], b""
        )
        wire = StreamHandlers.append_answer_lines(append, result)
        assert wire is not None and generic is not None
        ours = fastpath.prepare_lines(wire[0], wire[1], extra)
        assert ours is not None
        assert (ours.status, ours.head(defaults), ours.tail) == (
            generic.status,
            generic.head(defaults),
            generic.tail,
        ), (append, result)
        compared += 1
    assert compared == len(_requests()) * len(_results())
