"""Glob semantics of section 6.2: ``*`` is one segment, ``**`` is zero or more."""

from __future__ import annotations

import pytest

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
