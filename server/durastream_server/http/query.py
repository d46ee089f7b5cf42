"""Query parameters of the ``x-durastream`` resources (listing, change feed): parsed once, strictly.

A parameter given twice, text that is not UTF-8 after percent-decoding, or a number outside its range
is a 400 ``INVALID_PARAMETER`` naming the parameter, the value and what is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl

from durastream_server.errors import InvalidParameter
from durastream_server.http.parse import MAX_QUERY_FIELDS
from durastream_server.subscriptions.glob import GlobPattern, InvalidPattern, compile_pattern


def query_values(query_string: bytes, names: Iterable[str]) -> dict[str, str]:
    """Every query parameter (last value wins for names not in ``names``; those may appear once)."""
    try:
        pairs = parse_qsl(
            query_string.decode("latin-1"),
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_QUERY_FIELDS,
        )
    except UnicodeDecodeError:
        raise InvalidParameter("query parameters must be UTF-8 after percent-decoding") from None
    except ValueError:
        raise InvalidParameter(f"at most {MAX_QUERY_FIELDS} query parameters") from None
    once = frozenset(names)
    values: dict[str, str] = {}
    for key, value in pairs:
        if key in values and key in once:
            raise InvalidParameter(f"{key} given more than once")
        values[key] = value
    return values


def bounded_int(values: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """``values[name]`` as a plain decimal integer in ``[low, high]`` (no sign, no leading zeros)."""
    text = values.get(name)
    if text is None:
        return default
    if (
        not text.isascii()
        or not text.isdigit()
        or (len(text) > 1 and text.startswith("0"))
        or len(text) > len(str(high))
        or not low <= int(text) <= high
    ):
        raise InvalidParameter(f"{name} must be an integer from {low} to {high}, got {text!r}")
    return int(text)


def glob_parameter(values: dict[str, str]) -> GlobPattern | None:
    """The ``pattern`` parameter compiled (the subscription glob rules), or None when absent."""
    if "pattern" not in values:
        return None
    try:
        return compile_pattern(values["pattern"])
    except InvalidPattern as exc:
        raise InvalidParameter(
            f"pattern {values['pattern']!r} is not a valid glob: {exc} "
            "('*' matches one path segment, '**' any number of segments)"
        ) from None
