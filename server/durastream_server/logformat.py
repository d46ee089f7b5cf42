"""The server's log format, with control characters escaped.

Log lines carry what clients chose: stream paths (``a%0Ab`` is the stream ``a<newline>b``), query strings,
subscription ids, error messages quoting them. Written raw, a newline forges a log line of the client's
choosing and an escape sequence rewrites what an operator's terminal shows. So every character that is
not printable (C0 and C1 controls, DEL, line and paragraph separators, bidirectional overrides) is written
as a Python-style escape (``\\n``, ``\\x1b``, ``\\u2028``). Exception texts (tracebacks) keep their line
breaks, so a newline inside an exception's message stays one there; every other control is escaped.

Escaping happens when a record is formatted, not where it is logged, so no call site can forget it.

``--log-format json`` writes one JSON object per line instead (``JsonFormatter``): ``time``, ``level``,
``logger``, ``event``, ``message``, the ``request_id`` of the request being served (if any), the fields of
an access-log line (``http/access.py``), and ``exception``. ``json.dumps`` with ``ensure_ascii`` escapes
every control and non-ASCII character, so a line is always one line of printable ASCII.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from typing import Any, Final

FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TEXT: Final = "text"
JSON: Final = "json"
LOG_FORMATS: Final = (TEXT, JSON)

# The id of the request the current task serves (set by the app for each request; asyncio gives every
# request's task its own context), so every log record made while serving it can name it.
REQUEST_ID: ContextVar[str | None] = ContextVar("durastream_request_id", default=None)

_SHORT_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """``text`` with every non-printable character (``str.isprintable``) escaped; the common case, an
    all-printable text, is checked at C speed and returned as is."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


class EscapingFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose output has no control characters but the line breaks between
    traceback lines. ``format`` must stay on one line (``FORMAT`` does)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        # The first line is the message (escaped above); the rest is exception and stack text, which
        # may have been cached on the record by another handler's formatter.
        line, newline, rest = text.partition("\n")
        return line + newline + "\n".join(escape_controls(part) for part in rest.split("\n"))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring).

    ``event`` is ``request`` for access-log lines and ``log`` for everything else; a record made with
    ``extra={"fields": {...}}`` (the access log) carries those fields at the top level.
    """

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": _iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", "log"),
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id is not None:
            document["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if fields:
            document.update(fields)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        return json.dumps(document, ensure_ascii=True, default=str)


def _iso_time(created: float) -> str:
    """``2026-05-01T12:00:00.123Z``: UTC, milliseconds."""
    seconds = int(created)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        + f".{int((created - seconds) * 1000):03d}Z"
    )


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``--log-format``: escaped text (the default) or JSON lines."""
    if log_format == JSON:
        return JsonFormatter()
    if log_format != TEXT:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    return EscapingFormatter(FORMAT)
