"""Parsing JSON that someone else wrote: subscription request bodies and webhook receivers' answers.

Python's parser recurses once per nesting level, so a body of a few thousand ``[`` raised
``RecursionError``, which no caller expected: a 500 with a traceback for a request, a failed delivery task
for a webhook answer. Every document the subscription service reads nests at most three levels (an ack
object inside ``acks`` inside the body), so ``loads`` refuses anything nested deeper than ``MAX_DEPTH``
before the parser starts. Counting the openers (two ``bytes.count`` calls) settles ordinary bodies; only a
body with more openers than the limit is scanned, once, with its strings removed first.

It also refuses unpaired surrogate escapes (``"\\ud800"``): they decode to a ``str`` that cannot be
encoded as UTF-8, so a stream path holding one would fail every later webhook payload.

Every refusal is a ``ValueError`` whose message says what was wrong; callers turn it into a 400.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate, chain, compress, repeat
from operator import is_
from typing import Any, Final

MAX_DEPTH: Final = 32

# A JSON string (the unrolled form: no backtracking on long strings), and everything but brackets.
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET: Final = re.compile(rb"[^\[\]{}]+")
_STEPS: Final = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


class JsonTooDeep(ValueError):
    pass


def loads(data: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``data`` (UTF-8). Raises ``ValueError`` naming the problem."""
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        value = json.loads(text)
    except (RecursionError, ValueError):
        # Refused as too deep if it is (whether or not it is JSON too), else as not JSON.
        if nests_deeper(data, max_depth):
            raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels") from None
        raise
    # Parsed, the depth is a walk of the containers: ~0.8 ms for the 2,000 ranges of a multi-range
    # read, where scanning the text for brackets outside strings took ~5.5 ms.
    openers = data.count(b"[") + data.count(b"{")
    if openers > max_depth and _deeper(value, max_depth, openers):
        raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels")
    if b"\\u" in data:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("JSON strings must not contain unpaired surrogate escapes") from None
    return value


def _deeper(value: Any, limit: int, containers: int | None = None) -> bool:
    """Whether the parsed ``value`` nests more than ``limit`` arrays/objects inside each other.
    ``containers``: an upper bound of the arrays/objects ``value`` holds in all (its text's openers,
    which also counts brackets inside strings); the early stop below is sound only for a bound.

    A level at a time, each step a C-level pass over the whole level (``map``, ``compress``,
    ``chain``): a multi-range read's 2,000 range objects are one level, and a Python step per
    container (and per value in it) cost ~2 us a range. The walk stops as soon as the containers
    not yet seen are too few to nest past ``limit``: the range objects of a multi-range read are
    its last containers, so their values are never walked."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 1
    seen = 0
    while level:
        if depth > limit:
            return True
        seen += len(level)
        if containers is not None and depth + containers - seen <= limit:
            return False  # each level deeper takes at least one container not seen yet
        types = list(map(type, level))
        dicts = compress(level, map(is_, types, repeat(dict)))
        lists = compress(level, map(is_, types, repeat(list)))
        children = list(
            chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists))
        )
        level = list(compress(children, map(_CONTAINERS.__contains__, map(type, children))))
        depth += 1
    return False


_CONTAINERS: Final = frozenset((dict, list))


def nests_deeper(data: bytes, limit: int) -> bool:
    """Whether ``data`` opens more than ``limit`` arrays/objects inside each other (outside strings)."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False  # it cannot nest deeper than it has openers
    # Each bracket as a signed step (+1 opens, -1 closes), summed in C: a Python loop over the
    # brackets cost ~2.5 us a range of a multi-range read's body (http/multirange.py).
    steps = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data)).translate(_STEPS)
    return max(accumulate(memoryview(steps).cast("b")), default=0) > limit
