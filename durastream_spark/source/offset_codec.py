"""The compact checkpoint form of a source offset, for queries over many streams.

Spark handles a Python source's offsets as JSON text, several times per micro-batch: it writes the end
offset to its offset log, sends start and end to the source's Python process for ``latestOffset``,
``partitions`` and ``commit``, and puts start, end and latest offset into every progress report (parsed
into a JSON tree on the JVM, logged, and kept for the last 100 batches). With one entry per stream, a
query over 100,000 streams spent about 2 s per batch on that alone (5.6 MB of JSON with 300,000
tokens), against 0.3 s for a tiny offset; a single long string of the same information cost 0.9 s.

So an offset with more than ``COMPACT_ABOVE`` streams is written as
``{"v": 2, "n": <streams>, "z": "<base64 of the zlib-compressed JSON object>"}``, where the object maps
each path to its *value*: the integer position for a canonical durastream token
(``"0000000000000000_0000000000001234"`` -> ``1234``; the token is ``"0"*16 + "_" + %016d`` of it,
exactly as the frames extension defines it, so the server gets back byte for byte what it minted),
and any other token, ``"-1"`` or ``"latest"`` as the string itself. Smaller offsets stay in the
readable form ``{"path": "<offset>"}``, and both forms are read, so old checkpoints keep working and a
copied offset of either form works as ``startingOffsets``.

The same content always gives the same text (keys sorted, a fixed compression level), because Spark
compares offsets by their text. Decoding the compact form is cached by its text (``remember``): the start
offset Spark hands back is almost always the end offset this process produced last, and is then not
decoded again.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, TypeVar

COMPACT_ABOVE: Final = 100
VERSION_KEY: Final = "v"
COMPACT_VERSION: Final = 2
_LEVEL: Final = 1  # zlib: 3x faster than the default level, 9% larger
_PREFIX: Final = "0" * 16 + "_"
_TOKEN_LENGTH: Final = 33
_CACHE_SIZE: Final = 8

Value = int | str
_T = TypeVar("_T")


def encode_value(token: str) -> Value:
    """An offset value in its stored form: the position for a canonical durastream token."""
    if len(token) == _TOKEN_LENGTH and token.startswith(_PREFIX):
        digits = token[17:]
        if digits.isascii() and digits.isdigit():
            return int(digits)
    return token


def decode_value(value: Value) -> str:
    """The offset a stored value stands for (inverse of ``encode_value``)."""
    if type(value) is int:
        return f"{_PREFIX}{value:016d}"
    return value  # type: ignore[return-value]


def is_compact(document: Mapping[str, Any]) -> bool:
    """The compact form has an integer ``v``; in the readable form every value is a string."""
    return type(document.get(VERSION_KEY)) is int


def compact_document(
    raw: Mapping[str, Value], extra: Mapping[str, str], packed: str | None = None
) -> dict[str, Any]:
    """``raw`` (path -> stored value) in the compact form; ``extra`` keys are kept readable.
    ``packed``: the ``z`` text of the same ``raw``, if already known (it is most of the cost)."""
    if packed is None:
        packed = pack_text(
            json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        )
    return {VERSION_KEY: COMPACT_VERSION, "n": len(raw), "z": packed, **extra}


def pack_text(text: str) -> str:
    """The ``z`` text of a JSON object's text: zlib at a fixed level (the same text always packs the
    same), then base64."""
    return base64.b64encode(zlib.compress(text.encode("utf-8"), _LEVEL)).decode("ascii")


_encode_string = json.encoder.encode_basestring  # JSON string literal, non-ASCII kept (C speed)


def entry_text(path: str, value: Value) -> str:
    """One ``"path":value`` member of the compact object, exactly as ``json.dumps`` with
    ``separators=(",", ":")`` and ``ensure_ascii=False`` writes it."""
    shown = str(value) if type(value) is int else _encode_string(value)  # type: ignore[arg-type]
    return f"{_encode_string(path)}:{shown}"


class EntryTexts:
    """The members of the compact object, one text per stream, in path order.

    A batch's end is its start with the streams that moved replaced (``SourceOffset.updated``), and at
    100,000 streams one ``json.dumps`` of the whole map cost 0.1-0.2 s per batch: more than the rest of
    planning a batch in which 1% of them changed. Handed on from start to end, only the changed members
    are written again and the object's text is one ``join``. The text is byte for byte what
    ``json.dumps(raw, sort_keys=True, ...)`` gives (a test compares them), so offsets keep their text.

    Offsets with the same positions (copies with a batch time) share one instance; the first offset
    derived from any of them ``take``s the texts over and updates them in place, so there is one copy
    per chain of offsets, not one per offset. An emptied instance is rebuilt if it is asked again.
    """

    __slots__ = ("_texts",)

    def __init__(self, texts: dict[str, str] | None) -> None:
        self._texts = texts  # path -> member text, keys in sorted order; None once taken over

    @classmethod
    def of(cls, raw: Mapping[str, Value]) -> EntryTexts:
        return cls({path: entry_text(path, raw[path]) for path in sorted(raw)})

    @property
    def empty(self) -> bool:
        return self._texts is None

    def take(self, changes: Mapping[str, Value | None]) -> EntryTexts | None:
        """The texts with ``changes`` (a stored value, or ``None`` to drop the path) applied, moved to
        a new instance (this one is emptied); ``None`` if already taken. The paths stay sorted (a new
        path sorts them again: streams appear rarely)."""
        texts, self._texts = self._texts, None
        if texts is None:
            return None
        appeared = False
        for path, value in changes.items():
            if value is None:
                texts.pop(path, None)
                continue
            appeared = appeared or path not in texts
            texts[path] = entry_text(path, value)
        if appeared:
            texts = {path: texts[path] for path in sorted(texts)}
        return EntryTexts(texts)

    def text(self) -> str:
        assert self._texts is not None, "the member texts were taken over"
        return "{" + ",".join(self._texts.values()) + "}"


def read_compact(document: Mapping[str, Any]) -> dict[str, Value]:
    """path -> stored value from the compact form. Raises ``ValueError`` saying what is wrong."""
    version = document.get(VERSION_KEY)
    if version != COMPACT_VERSION:
        raise ValueError(
            f"durastream offset version {version!r} is not known to this connector (it reads "
            f"{COMPACT_VERSION}); was the checkpoint written by a newer version?"
        )
    packed = document.get("z")
    if not isinstance(packed, str):
        raise ValueError("a compact durastream offset needs its 'z' text")
    try:
        raw = json.loads(zlib.decompress(base64.b64decode(packed, validate=True)))
    except (binascii.Error, zlib.error, ValueError) as exc:
        raise ValueError(f"a compact durastream offset does not decode: {exc}") from None
    if not isinstance(raw, dict) or len(raw) != document.get("n"):
        raise ValueError("a compact durastream offset does not hold the number of streams it says")
    for path, value in raw.items():
        if not (type(value) is int and value >= 0) and not isinstance(value, str):
            raise ValueError(f"stream {path!r} has an invalid offset {value!r}")
    return raw


class DecodedCache:
    """The last few offsets this process produced or read, by their compact text."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self._size = size
        self._entries: OrderedDict[str, Any] = OrderedDict()

    def get(self, key: str) -> Any:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: str, value: _T, *, replace: bool = True) -> _T:
        """Remember ``value`` for ``key``; with ``replace=False`` an offset already remembered for the
        same text stays (it may carry the member texts its successor takes over)."""
        if replace or key not in self._entries:
            self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return value
