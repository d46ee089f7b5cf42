"""Server-Sent Events framing for live reads (section 5.8).

A data event carries one read chunk; a control event follows *every* data event with the offset to resume
from, so a client that collects data up to each control event always holds whole JSON arrays and whole
base64 strings. Framing rules that keep bytes intact:

- Text (``text/*``, ``application/json``): each payload line becomes its own ``data:`` line, split at every
  SSE line terminator (CRLF, CR, LF), so an embedded blank line can never end the event or inject another
  one. A line that starts with a space gets one extra space, because SSE clients strip exactly one.
- Binary (any other type): standard base64 on one ``data:`` line, announced by the response header
  ``Stream-SSE-Data-Encoding: base64``.

SSE itself cannot carry a CR inside a text line: every CR is a line terminator, and clients rejoin lines
with LF. So over text SSE, ``a\\r\\nb`` arrives as ``a\\nb`` (hazard 29). A client that needs byte-exact text
opts in with the query parameter ``sse_encoding=base64``, which base64-encodes any stream's data events and
sets the same response header; the official clients already decode by that header. (Base64 by default for
text would break the conformance suite, which requires CR-containing text to arrive as literal text.)
"""

from __future__ import annotations

import base64
import json
import re
from typing import Final

ENCODING_HEADER: Final = "Stream-SSE-Data-Encoding"
_LINE_BREAK: Final = re.compile(rb"\r\n|\r|\n")


def is_text_type(content_type: str) -> bool:
    """Section 5.8: text/* and application/json travel as text; everything else as base64."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media.startswith("text/") or media == "application/json"


def data_event(payload: bytes, *, base64_encoded: bool) -> bytes:
    if base64_encoded:
        return b"event: data\ndata:" + base64.b64encode(payload) + b"\n\n"
    parts = [b"event: data\n"]
    for line in _LINE_BREAK.split(payload):
        parts.append(b"data: " if line.startswith(b" ") else b"data:")
        parts.append(line)
        parts.append(b"\n")
    parts.append(b"\n")
    return b"".join(parts)


def control_event(next_offset: str, *, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    """``streamCursor`` is left out once the stream is closed (no reconnect will use it); ``upToDate`` is
    always stated when true, including at EOF, so clients that wait for it see the closure (hazard 28)."""
    control: dict[str, object] = {"streamNextOffset": next_offset}
    if cursor is not None and not closed:
        control["streamCursor"] = cursor
    if up_to_date or closed:
        control["upToDate"] = True
    if closed:
        control["streamClosed"] = True
    return b"event: control\ndata:" + json.dumps(control, separators=(",", ":")).encode() + b"\n\n"
