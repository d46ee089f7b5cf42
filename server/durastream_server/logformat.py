"""The server's log format, with control characters escaped.

Log lines carry what clients chose: stream paths (``a%0Ab`` is the stream ``a<newline>b``), query strings,
subscription ids, error messages quoting them. Written raw, a newline forges a log line of the client's
choosing and an escape sequence rewrites what an operator's terminal shows. So every character that is
not printable (C0 and C1 controls, DEL, line and paragraph separators, bidirectional overrides) is written
as a Python-style escape (``\\n``, ``\\x1b``, ``\\u2028``). Exception texts (tracebacks) keep their line
breaks, so a newline inside an exception's message stays one there; every other control is escaped.

Escaping happens when a record is formatted, not where it is logged, so no call site can forget it.
"""

from __future__ import annotations

import logging
from typing import Final

FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

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
