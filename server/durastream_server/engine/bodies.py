"""The content-type check and message split shared by appends and stages, so both follow one set of
rules: a mismatched type is 409, an invalid JSON body 400, a JSON body one message per array element."""

from __future__ import annotations

from durastream_server.engine import jsonmode
from durastream_server.engine.contenttype import ContentType
from durastream_server.engine.registry import Incarnation
from durastream_server.errors import BadRequest, ContentTypeMismatch


def request_messages(
    inc: Incarnation,
    request_type: ContentType | None,
    parsed: tuple[bytes, ...] | BadRequest | None,
    body: bytes,
    max_messages: int,
) -> tuple[bytes, ...]:
    """Messages of a request body, after checking its type against the stream's.

    ``parsed`` is the result of an earlier off-loop JSON split of a large body (or None);
    ``max_messages`` bounds a JSON body's messages (``TooManyMessages``).
    """
    if request_type is not None and request_type.essence != inc.essence:
        raise ContentTypeMismatch(
            f"Content-Type {request_type.text!r} does not match the stream's "
            f"{inc.header.content_type!r}"
        )
    if isinstance(parsed, BadRequest):
        raise parsed
    if parsed is not None:
        return parsed
    if inc.json:
        return jsonmode.split_messages(body, allow_empty_array=False, max_messages=max_messages)
    return (body,) if body else ()
