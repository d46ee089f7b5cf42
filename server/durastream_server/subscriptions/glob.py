"""Glob patterns over stream-root-relative paths (section 6.2).

A pattern is split on ``/`` into segments, matched against the path's segments:

* ``**`` (a whole segment) matches zero or more path segments;
* ``*`` (a whole segment) matches exactly one path segment;
* a ``*`` inside a segment (``ev*``) matches any run of characters within that one segment;
* everything else is literal. There is no ``?`` or ``[...]``: stream paths may contain those characters,
  and a subscription must be able to name them.

Patterns are compiled once when a subscription is created, never re-parsed per append. Matching takes
time linear in the path for any pattern (no general regular expressions: ``*a*a*a*a*a*b`` against a
segment of 100 ``a``s took 9 s of backtracking in ``re``), since patterns come from clients (listing,
subscriptions). The one exception is the common shape, no ``**`` and at most one ``*`` per segment
(``sessions/*``, ``ev*/x``): that is one compiled regex of literal pieces and ``[^/]*`` runs, which
cannot backtrack past a ``/`` and so costs at most one segment's length per segment, and is matched in
C (a listing page of 10,000 paths spent half its time in the segment walk).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

_ANY_SEGMENTS = "**"


class InvalidPattern(ValueError):
    """The text cannot be used as a subscription pattern; the message says why."""


@dataclass(frozen=True)
class _Segment:
    """One pattern segment: ``**``, or the literal pieces between the ``*`` of one path segment
    (``ev*x`` -> ``("ev", "x")``; no ``*`` -> one piece, the whole segment)."""

    any_segments: bool
    pieces: tuple[str, ...] = ()


@dataclass(frozen=True)
class GlobPattern:
    text: str
    segments: tuple[_Segment, ...]
    # Every matching path ends with this (the last piece of a last segment that is not ``**``): a
    # string comparison that rejects most paths before the segment walk.
    suffix: str = ""
    # The whole pattern as one regex, for the shapes that cannot backtrack (module docstring).
    whole: re.Pattern[str] | None = field(default=None, compare=False)

    def matches(self, path: str) -> bool:
        if self.whole is not None:
            return self.whole.fullmatch(path) is not None
        if not path.endswith(self.suffix):
            return False
        return _match(self.segments, tuple(path.split("/")))

    def literal_prefix(self) -> str:
        """The longest plain-text prefix every matching path starts with, to narrow a stream listing."""
        head, star, _ = self.text.partition("*")
        return head if star else self.text


def compile_pattern(text: str) -> GlobPattern:
    if not text:
        raise InvalidPattern("must be a non-empty glob")
    if text.startswith("/"):
        raise InvalidPattern("must be stream-root-relative (no leading '/')")
    segments = []
    for part in text.split("/"):
        if part == _ANY_SEGMENTS:
            segments.append(_Segment(any_segments=True))
        elif "**" in part:
            raise InvalidPattern("'**' must be a whole path segment")
        else:
            segments.append(_Segment(any_segments=False, pieces=tuple(part.split("*"))))
    last = segments[-1]
    suffix = "" if last.any_segments else last.pieces[-1]
    return GlobPattern(
        text=text, segments=tuple(segments), suffix=suffix, whole=_whole_regex(segments)
    )


def _whole_regex(segments: list[_Segment]) -> re.Pattern[str] | None:
    """One regex for a pattern without ``**`` and with at most one ``*`` per segment, else None."""
    if any(segment.any_segments or len(segment.pieces) > 2 for segment in segments):
        return None
    return re.compile(
        "/".join("[^/]*".join(map(re.escape, segment.pieces)) for segment in segments),
        re.DOTALL,
    )


def _match(pattern: tuple[_Segment, ...], path: tuple[str, ...]) -> bool:
    """Iterative matcher; ``**`` backtracks to the most recent one only (linear-ish, no blow-up)."""
    p = s = 0
    star_p = -1  # index of the last '**' seen
    star_s = 0  # path index it is currently assumed to have consumed up to
    while s < len(path):
        if p < len(pattern) and pattern[p].any_segments:
            star_p, star_s = p, s
            p += 1
        elif p < len(pattern) and _segment_matches(pattern[p], path[s]):
            p += 1
            s += 1
        elif star_p >= 0:
            star_s += 1
            p, s = star_p + 1, star_s
        else:
            return False
    while p < len(pattern) and pattern[p].any_segments:
        p += 1
    return p == len(pattern)


def _segment_matches(segment: _Segment, text: str) -> bool:
    """``*`` runs between literal pieces: the first piece is a prefix, the last a suffix, and the
    middle ones are found leftmost, in order, between them (leftmost is always right when ``*`` is
    the only wildcard). At most one scan of ``text`` per piece."""
    pieces = segment.pieces
    first = pieces[0]
    if len(pieces) == 1:
        return text == first
    last = pieces[-1]
    end = len(text) - len(last)
    if end < len(first) or not text.startswith(first) or not text.endswith(last):
        return False
    position = len(first)
    for piece in pieces[1:-1]:
        found = text.find(piece, position, end)
        if found < 0:
            return False
        position = found + len(piece)
    return True


@lru_cache(maxsize=1024)
def cached_pattern(text: str) -> GlobPattern:
    """Compiled patterns are immutable, so subscriptions sharing a pattern share one compile."""
    return compile_pattern(text)
