"""Log lines never carry a client's control characters (``logformat.py``): a stream named
``a%0A<fake log line>`` cannot forge a log line, and ``%1B[...`` cannot drive the operator's terminal."""

from __future__ import annotations

import io
import logging
from urllib.parse import quote

import pytest
import requests

from durastream_server.logformat import FORMAT, EscapingFormatter, escape_controls
from tests.support.http import poll_until


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain/stream-name é ✓", "plain/stream-name é ✓"),
        ("a\nb\r\tc", "a\\nb\\r\\tc"),
        ("\x00\x1b[31mred\x7f", "\\x00\\x1b[31mred\\x7f"),
        ("c1 \x85 \x9b", "c1 \\x85 \\x9b"),
        ("\u2028\u2029\u202e\U000e0001", "\\u2028\\u2029\\u202e\\U000e0001"),
    ],
)
def test_controls_are_escaped_and_printable_text_is_kept(text: str, escaped: str) -> None:
    assert escape_controls(text) == escaped


def _format(record_args: tuple[object, ...], exc: BaseException | None = None) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(EscapingFormatter(FORMAT))
    logger = logging.getLogger("durastream_server.test_logformat")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        if exc is None:
            logger.warning("stream %s: %r", *record_args)
        else:
            try:
                raise exc
            except type(exc):
                logger.exception("stream %s failed", *record_args)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


def test_a_record_is_one_line_whatever_its_arguments() -> None:
    line = _format(("a\n2030-01-01 00:00:00,000 ERROR forged", "\x1b[2J"))
    assert line.count("\n") == 1 and "\x1b" not in line
    assert "a\\n2030-01-01 00:00:00,000 ERROR forged" in line and "\\x1b[2J" in line


def test_tracebacks_keep_their_lines_and_lose_their_controls() -> None:
    text = _format(("x\x1b",), ValueError("bad \x1b[31m value"))
    lines = text.splitlines()
    assert lines[0].endswith("stream x\\x1b failed")
    assert lines[1] == "Traceback (most recent call last):"
    assert "\x1b" not in text and lines[-1] == "ValueError: bad \\x1b[31m value"


def test_the_server_log_escapes_stream_names(server_factory) -> None:
    """The DEBUG line of an SSE read that ends because its stream was deleted names the stream."""
    server = server_factory(extra_args=["--log-level", "DEBUG"])
    name = "log/a\n2030-01-01 00:00:00,000 ERROR forged \x1b[31m"
    url = server.stream_url(quote(name, safe="/"))
    assert requests.put(url, headers={"Content-Type": "text/plain"}).status_code == 201
    with requests.get(url, params={"offset": "-1", "live": "sse"}, stream=True, timeout=10) as sse:
        assert sse.status_code == 200
        poll_until(
            lambda: requests.get(server.base_url + "/healthz").json()["waiters"] >= 1,
            "the SSE reader to park",
        )
        assert requests.delete(url).status_code == 204
        poll_until(lambda: "SSE on log/a" in server.log_path.read_text(), "the SSE end log line")
    log = server.log_path.read_text()
    assert "\x1b" not in log
    assert "\n2030-01-01 00:00:00,000 ERROR forged" not in log
    assert "SSE on log/a\\n2030-01-01 00:00:00,000 ERROR forged \\x1b[31m" in log
