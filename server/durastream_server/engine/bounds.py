"""Validation of a bounded read's ``end`` (extension, ``docs/extensions.md`` section 1).

A bounded read must return exactly ``[start, end)`` whatever is appended later, so an ``end`` the server
cannot honour exactly is an error rather than a silent clamp: past the durable tail it would be a
moving target (400 ``END_BEYOND_TAIL``, with the tail so the client can retry), and inside a message of a
whole-message read it would stop short of ``end`` forever (400 ``INVALID_END``).
"""

from __future__ import annotations

from durastream_server.engine.view import StreamView
from durastream_server.errors import EndBeyondTail, InvalidEnd
from durastream_server.offsets import InvalidOffset, format_offset, parse_position


def parse_end(token: str) -> int:
    """The logical position of an ``end`` token; only canonical offset tokens are accepted."""
    try:
        return parse_position(token)
    except InvalidOffset:
        raise InvalidEnd(
            f"end must be an offset token minted by this server "
            f"(like {format_offset(0)!r}), got {token!r}"
        ) from None


async def resolve_end(view: StreamView, start: int, token: str, *, whole_messages: bool) -> int:
    """The position ``end`` names for a read of ``view`` from ``start``, or a typed 400.

    ``whole_messages`` (JSON streams, message frames, limit lookups) also requires a message boundary;
    that check may scan record headers (off the loop) unless ``end`` is the start, the tail or a
    recent record start.
    """
    end, settled = settle_end(view, start, token, whole_messages=whole_messages)
    if not settled and not await view.is_boundary(end):
        raise inside_message(token)
    return end


def settle_end(
    view: StreamView, start: int, token: str, *, whole_messages: bool
) -> tuple[int, bool]:
    """``resolve_end`` up to its boundary check: the position ``end`` names (or a typed 400) and
    whether it is settled; if not, ``view.is_boundary(end)`` decides (False: ``inside_message``)."""
    return settle_end_at(view.tail, start, token, whole_messages=whole_messages)


def settle_end_at(tail: int, start: int, token: str, *, whole_messages: bool) -> tuple[int, bool]:
    """``settle_end`` of a stream whose durable tail is ``tail`` (no view needed: a multi-range read
    plans 10,000 unforked streams without building one each)."""
    end = parse_end(token)
    if end < start:
        raise InvalidEnd(
            f"end {token!r} is before the start offset {format_offset(start)!r}; "
            "end must be at or after the start"
        )
    if end > tail:
        raise EndBeyondTail(
            f"end {token!r} is beyond the stream's durable tail {format_offset(tail)!r}",
            headers={"Stream-Next-Offset": format_offset(tail)},
        )
    return end, not whole_messages or end == tail


def inside_message(token: str) -> InvalidEnd:
    """The error of a whole-message read whose ``end`` is inside a message."""
    return InvalidEnd(
        f"end {token!r} is inside a message; whole-message reads need an end that is a message "
        "boundary (an offset this server returned as a message offset or Stream-Next-Offset)"
    )
