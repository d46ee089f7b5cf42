"""Pattern matching of discovered streams: one regex per pattern without ``**``, the same answers as
matching segment by segment (the rules in ``source/discovery.py``'s docstring)."""

from __future__ import annotations

import pytest

from durastream_spark.source.discovery import _match, _whole_regex, glob_matches

PATTERNS = ["ten/*", "a/*b*/c", "*", "x*y", "*/*", "a.b/c+d/*", "ev*/x", "a/**/b", "**", "a/**"]
PATHS = [
    "ten/s1",
    "ten/s1/x",
    "ten",
    "ten/",
    "a/b/c",
    "a/xbx/c",
    "a/b",
    "a/x/y/b",
    "xy",
    "x.y",
    "xzzy",
    "a.b/c+d/e",
    "axb/cxd/e",
    "evil/x",
    "ev/x",
    "ev\n/x",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_pattern_matches_as_segment_by_segment(pattern: str) -> None:
    for path in PATHS:
        expected = _match(tuple(pattern.split("/")), tuple(path.split("/")))
        assert glob_matches(pattern, path) == expected, (pattern, path)


def test_only_patterns_without_double_star_become_one_regex() -> None:
    assert _whole_regex("ten/*") is not None
    assert _whole_regex("a/**/b") is None
    assert glob_matches("ten/*", "ten/s00001")
    assert not glob_matches("ten/*", "ten/s00001/more")
    assert not glob_matches("a.b/*", "axb/c")  # '.' is literal
