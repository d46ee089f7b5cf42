"""Glob semantics of section 6.2: ``*`` is one segment, ``**`` is zero or more."""

from __future__ import annotations

import re
import threading

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from durastream_server.subscriptions.glob import InvalidPattern, compile_pattern


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("events/*", "events/abc", True),
        ("events/*", "events", False),
        ("events/*", "events/a/b", False),
        ("events/*", "other/abc", False),
        ("events/**", "events", True),
        ("events/**", "events/a", True),
        ("events/**", "events/a/b/c", True),
        ("events/**", "eventsx/a", False),
        ("**", "anything/at/all", True),
        ("**/leaf", "leaf", True),
        ("**/leaf", "a/b/leaf", True),
        ("**/leaf", "a/b/leaf/no", False),
        ("a/**/z", "a/z", True),
        ("a/**/z", "a/b/c/z", True),
        ("a/**/z", "a/b/c/y", False),
        ("a/**/b/**/c", "a/x/b/y/b/c", True),
        ("a/**/b/**/c", "a/x/y/c", False),
        ("*/b", "a/b", True),
        ("*/b", "a/c/b", False),
        ("ev*/x", "events/x", True),
        ("ev*/x", "xev/x", False),
        ("a.b/[c]", "a.b/[c]", True),  # regex metacharacters are literal
        ("a.b/[c]", "axb/c", False),
        ("literal/path", "literal/path", True),
        ("literal/path", "literal/pathx", False),
    ],
)
def test_matching(pattern: str, path: str, expected: bool) -> None:
    assert compile_pattern(pattern).matches(path) is expected


@pytest.mark.parametrize("pattern", ["", "/events/*", "a/x**/b", "a/***"])
def test_invalid_patterns_are_rejected(pattern: str) -> None:
    with pytest.raises(InvalidPattern):
        compile_pattern(pattern)


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [("events/*", "events/"), ("**", ""), ("ev*/x", "ev"), ("a/b", "a/b")],
)
def test_literal_prefix_narrows_listing(pattern: str, prefix: str) -> None:
    compiled = compile_pattern(pattern)
    assert compiled.literal_prefix() == prefix


def test_many_double_stars_do_not_blow_up() -> None:
    pattern = compile_pattern("/".join(["**", "a"] * 12) + "/b")
    assert pattern.matches("/".join(["a"] * 200)) is False


def _reference(pattern: str, path: str) -> bool:
    """Section 6.2 by brute force: a regex per segment, every way of spreading ``**`` over segments."""
    parts, segments = pattern.split("/"), path.split("/")

    def walk(p: int, s: int) -> bool:
        if p == len(parts):
            return s == len(segments)
        if parts[p] == "**":
            return any(walk(p + 1, t) for t in range(s, len(segments) + 1))
        body = ".*".join(re.escape(literal) for literal in parts[p].split("*"))
        return (
            s < len(segments)
            and bool(re.fullmatch(body, segments[s], re.DOTALL))
            and walk(p + 1, s + 1)
        )

    return walk(0, 0)


_SEGMENT_PATTERNS = st.one_of(
    st.just("**"), st.text(alphabet="ab*", max_size=5).filter(lambda t: "**" not in t)
)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    parts=st.lists(_SEGMENT_PATTERNS, min_size=1, max_size=4),
    segments=st.lists(st.text(alphabet="ab", max_size=5), min_size=1, max_size=5),
)
def test_matching_agrees_with_the_definition(parts: list[str], segments: list[str]) -> None:
    pattern, path = "/".join(parts), "/".join(segments)
    assume(not pattern.startswith("/") and pattern)
    assert compile_pattern(pattern).matches(path) is _reference(pattern, path)


def test_many_stars_in_one_segment_do_not_backtrack() -> None:
    """``*a*a*a*a*a*a*a*b`` against 2,000 ``a``s: years of regex backtracking before; a few scans now.
    Run in a thread with a generous deadline so a regression fails instead of hanging the suite."""
    pattern = compile_pattern("x/" + "*a" * 7 + "*b")
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(pattern.matches("x/" + "a" * 2000)))
    worker.daemon = True
    worker.start()
    worker.join(30)
    assert result == [False]


def test_the_common_shape_is_one_regex_without_backtracking() -> None:
    """No ``**`` and at most one ``*`` per segment (``sessions/*``): matched as one compiled regex
    (a listing page checks 10,000 paths), which cannot backtrack past a ``/``: a long segment costs
    one scan. Other shapes keep the segment walk. Agreement with the definition is the property test
    above."""
    common = compile_pattern("x/a*b/*")
    assert common.whole is not None
    assert compile_pattern("x/**").whole is None and compile_pattern("x/*a*b").whole is None
    assert common.matches("x/a" + "a" * 200_000 + "c/y") is False
    assert common.matches("x/a" + "/" * 1000 + "b/y") is False
    assert common.matches("x/a\nb/y") is True
