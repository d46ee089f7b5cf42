"""Offset tokens: fixed-width, lexicographically sortable, derived from log position.

An offset is ``"0000000000000000_PPPPPPPPPPPPPPPP"``: a reserved 16-digit generation field (always 0 today)
and the 16-digit decimal *logical position*. The logical position counts payload bytes before the point:
raw bytes for byte streams, and the stored (canonical) bytes of each message for JSON streams, so every
message boundary has its own, strictly increasing offset. Forks share their source's offset space.

Only the canonical form is accepted (hazard 22): ``0_5`` is rejected, never reinterpreted.
"""

from __future__ import annotations

import re
from typing import Final, Literal

BEGINNING: Final = "-1"
NOW: Final = "now"
MAX_POSITION: Final = 10**16 - 1

_OFFSET_RE: Final = re.compile(r"\A0{16}_(\d{16})\Z")

_ZERO_GENERATION: Final = "0" * 16 + "_"
# What a canonical token starts with; the 16 digits after it are its position (``parse_position``).
CANONICAL_PREFIX: Final = _ZERO_GENERATION

Sentinel = Literal["-1", "now"]


class InvalidOffset(ValueError):
    """The text is neither a sentinel nor a canonical offset minted by this server."""


def format_offset(position: int) -> str:
    """Mint the offset token for a logical position."""
    if not 0 <= position <= MAX_POSITION:
        raise ValueError(f"position {position} out of range")
    return offset_token(position)


def offset_token(position: int) -> str:
    """``format_offset`` without its range check, for a position known to be in range (a log's
    durable tail): a listing page mints one a stream, and the check was a fifth of its CPU."""
    return f"{_ZERO_GENERATION}{position:016d}"  # the generation field is always 0


def parse_position(text: str) -> int:
    """Parse a canonical offset token (not a sentinel) into a logical position."""
    # What the pattern accepts, in C-level string methods: a multi-range read parses two tokens a
    # range (``isdecimal`` is the pattern's ``\d``: Unicode decimal digits, which ``int`` reads).
    if len(text) == 33 and text.startswith(_ZERO_GENERATION) and text[17:].isdecimal():
        return int(text[17:])
    match = _OFFSET_RE.match(text)
    if match is None:
        raise InvalidOffset(text)
    return int(match.group(1))


def parse_offset(text: str) -> int | Sentinel:
    """Parse a request offset: ``-1``, ``now`` or a canonical token."""
    if text in (BEGINNING, NOW):
        return text  # type: ignore[return-value]
    return parse_position(text)
