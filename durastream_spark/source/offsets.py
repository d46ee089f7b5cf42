"""Offsets of the durastream source: what Spark writes to the checkpoint, and what users ask to start from.

The checkpoint offset (``SourceOffset``)
========================================
A readable JSON object mapping each stream path to the offset where the next micro-batch starts::

    {"events/a": "0000000000000000_0000000000001234", "events/b": "-1"}

- Values are offset tokens exactly as the server returned them (``Stream-Next-Offset``, a limit lookup's
  ``end``), or ``"-1"`` (the protocol's "beginning of the stream": nothing of that stream was read yet).
  Users can copy such an object into ``startingOffsets`` to start another query from it.
- Keys are sorted and the JSON has no whitespace variation, because Spark compares offsets by their JSON
  text: a batch is "new data" exactly when the text changed.
- A stream absent from the object starts at the beginning (``-1``). This is how streams that appear while a
  ``pattern`` query runs are read from their first message, like Kafka's new partitions.

Two values exist only in *initial* offsets (what ``initialOffset()`` returns), never in the checkpoint:

- ``"latest"`` for a stream: the first batch resolves it to the stream's tail and reads nothing of it.
- the key ``"/default"`` (never a stream path: paths have no leading ``/``) with value ``"latest"``: every
  stream absent from the object starts at its tail in the first batch. ``pattern`` queries with
  ``startingOffsets=latest`` use it.

Why symbolic: Python sources get no checkpoint directory, and Spark calls ``initialOffset()`` again when a
query restarts before its first batch committed. Resolving ``latest`` to tails inside ``initialOffset()``
would give different tails on that second call, so batch 0 would be re-planned over a different range. A
symbolic initial offset is a pure function of the options; the first batch turns it into concrete tails
(its end offset), and Spark writes *that* to the offset log before running the batch. Batch 0 is therefore
empty for ``latest``, and every later batch starts from offsets Spark persisted.

User-facing specs (``OffsetSpec``)
==================================
``startingOffsets`` / ``endingOffsets`` are parsed once, on the driver, into a small sealed type:
``EarliestSpec``, ``LatestSpec`` or ``SpecificSpec`` (a JSON object ``{"path": "<offset>"}`` whose values may
also be ``"earliest"`` / ``"latest"``). Strings are never re-parsed later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from durastream_spark.errors import OptionError

EARLIEST = "-1"
"""The protocol's "beginning of the stream" (as a start offset) and "nothing read yet" (as an end)."""

LATEST = "latest"
"""Symbolic: the stream's tail, resolved by the first batch. Only in initial offsets."""

DEFAULT_KEY = "/default"
"""Initial offsets only: where streams absent from the object start (``"latest"``)."""

_TOKEN = re.compile(r"^[!-~]{1,256}$")  # printable ASCII, no spaces: what servers mint
_RESERVED_TOKENS = frozenset({"now", LATEST, "earliest"})


# --------------------------------------------------------------------------------------------------------
# Stream paths and offset values
# --------------------------------------------------------------------------------------------------------


def normalize_path(path: str) -> str:
    """A stream path relative to ``url``: surrounding ``/`` and spaces removed, segments checked.

    Raises ``ValueError`` naming the problem (callers wrap it in an ``OptionError``).
    """
    if not isinstance(path, str):
        raise ValueError(f"a stream path must be a string, got {type(path).__name__}")
    clean = path.strip().strip("/")
    if not clean:
        raise ValueError("the stream path is empty")
    for segment in clean.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"stream path {path!r} has an empty, '.' or '..' segment")
        if any(ord(ch) < 0x20 for ch in segment):
            raise ValueError(f"stream path {path!r} contains a control character")
    return clean


def is_token(value: str) -> bool:
    """A concrete offset token as a server mints it (not ``-1``, ``now``, ``latest``)."""
    return value not in _RESERVED_TOKENS and value != EARLIEST and bool(_TOKEN.match(value))


def offset_after(a: str, b: str) -> bool:
    """Whether offset ``a`` is strictly after ``b``. ``-1`` precedes every token.

    The protocol guarantees that a server's offsets are lexicographically sortable (spec section 8), so the
    comparison of two tokens is a string comparison; nothing else is interpreted.
    """
    if a == b:
        return False
    if a == EARLIEST:
        return False
    if b == EARLIEST:
        return True
    return a > b


# --------------------------------------------------------------------------------------------------------
# The checkpoint offset
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOffset:
    """Where each stream's next batch starts. Frozen, hashable, picklable; see the module docstring."""

    positions: tuple[tuple[str, str], ...] = ()
    default: str = EARLIEST  # where streams absent from ``positions`` start: EARLIEST or LATEST

    def __post_init__(self) -> None:
        if self.default not in (EARLIEST, LATEST):
            raise ValueError(f"default must be {EARLIEST!r} or {LATEST!r}, got {self.default!r}")
        paths = [path for path, _ in self.positions]
        if paths != sorted(set(paths)):
            raise ValueError("positions must be sorted by path without duplicates")

    @classmethod
    def of(cls, mapping: Mapping[str, str], default: str = EARLIEST) -> SourceOffset:
        return cls(tuple(sorted(mapping.items())), default)

    # ---- access ------------------------------------------------------------------------------------------

    def as_dict(self) -> dict[str, str]:
        return dict(self.positions)

    def get(self, path: str) -> str | None:
        for candidate, value in self.positions:
            if candidate == path:
                return value
        return None

    def start_of(self, path: str) -> str:
        """Where ``path`` starts: its own value, or the default for streams absent from the offset."""
        value = self.get(path)
        return self.default if value is None else value

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path, _ in self.positions)

    @property
    def concrete(self) -> bool:
        """No symbolic value: what an end offset (and so the checkpoint) always is."""
        return self.default == EARLIEST and all(v != LATEST for _, v in self.positions)

    # ---- JSON --------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, str]:
        """The dict handed to Spark: keys sorted, so that equal offsets have equal JSON text."""
        document = dict(self.positions)
        if self.default != EARLIEST:
            document[DEFAULT_KEY] = self.default
        return {key: document[key] for key in sorted(document)}

    def json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, document: Any) -> SourceOffset:
        """Parse an offset Spark hands back (or a user copied). Raises ``ValueError`` saying what is wrong."""
        if not isinstance(document, Mapping):
            raise ValueError(
                f'a durastream offset is a JSON object {{"path": "<offset>"}}, got {document!r}'
            )
        default = EARLIEST
        positions: dict[str, str] = {}
        for key, value in document.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(
                    f"durastream offset entries map a stream path to an offset string, got "
                    f"{key!r}: {value!r}"
                )
            if key == DEFAULT_KEY:
                if value not in (EARLIEST, LATEST):
                    raise ValueError(f"{DEFAULT_KEY} must be {LATEST!r}, got {value!r}")
                default = value
                continue
            if value != EARLIEST and value != LATEST and not is_token(value):
                raise ValueError(f"stream {key!r} has an invalid offset {value!r}")
            positions[key] = value
        return cls.of(positions, default)

    @classmethod
    def from_json(cls, text: str) -> SourceOffset:
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"a durastream offset must be JSON: {exc}") from None
        return cls.from_dict(document)


# --------------------------------------------------------------------------------------------------------
# startingOffsets / endingOffsets
# --------------------------------------------------------------------------------------------------------


class OffsetSpec:
    """Sealed: ``EarliestSpec``, ``LatestSpec`` or ``SpecificSpec``."""

    __slots__ = ()


@dataclass(frozen=True)
class EarliestSpec(OffsetSpec):
    """Every stream from its first retained message."""


@dataclass(frozen=True)
class LatestSpec(OffsetSpec):
    """Every stream from (start) or up to (end) its tail when the query resolves it."""


@dataclass(frozen=True)
class SpecificSpec(OffsetSpec):
    """Per-stream offsets: tokens, ``EARLIEST`` or ``LATEST``. Streams not listed use ``unlisted``."""

    offsets: tuple[tuple[str, str], ...]
    unlisted: str  # EARLIEST for startingOffsets, LATEST for endingOffsets

    def value_for(self, path: str) -> str:
        for candidate, value in self.offsets:
            if candidate == path:
                return value
        return self.unlisted

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path, _ in self.offsets)


def parse_offset_spec(option: str, raw: str | None, *, ending: bool) -> OffsetSpec:
    """``startingOffsets`` (``ending=False``) or ``endingOffsets`` (``ending=True``) into an ``OffsetSpec``."""
    if ending:
        accepted = (
            "'latest', or a JSON object mapping stream paths to offsets, e.g. "
            '{"events/a": "0000000000000000_0000000000001234"} (a value may also be "latest")'
        )
    else:
        accepted = (
            "'earliest', 'latest', or a JSON object mapping stream paths to offsets, e.g. "
            '{"events/a": "0000000000000000_0000000000001234"} (a value may also be "earliest", '
            '"latest" or "-1")'
        )
    if raw is None:
        return LatestSpec() if ending else EarliestSpec()
    text = raw.strip()
    lowered = text.lower()
    if lowered == "latest":
        return LatestSpec()
    if lowered == "earliest":
        if ending:
            raise OptionError(
                option,
                raw,
                accepted,
                reason="a batch read cannot end at 'earliest' (it would be empty)",
            )
        return EarliestSpec()
    if not text.startswith("{"):
        raise OptionError(option, raw, accepted)
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise OptionError(option, raw, accepted, reason=f"not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OptionError(option, raw, accepted, reason="not a JSON object")
    offsets: dict[str, str] = {}
    for key, value in document.items():
        try:
            path = normalize_path(key)
        except ValueError as exc:
            raise OptionError(option, raw, accepted, reason=str(exc)) from None
        if path in offsets:
            raise OptionError(option, raw, accepted, reason=f"stream {path!r} is listed twice")
        offsets[path] = _parse_offset_value(option, raw, accepted, path, value, ending=ending)
    if not offsets:
        raise OptionError(option, raw, accepted, reason="the JSON object names no stream")
    return SpecificSpec(tuple(sorted(offsets.items())), unlisted=LATEST if ending else EARLIEST)


def _parse_offset_value(
    option: str, raw: str, accepted: str, path: str, value: object, *, ending: bool
) -> str:
    if not isinstance(value, str):
        raise OptionError(
            option,
            raw,
            accepted,
            reason=f"the offset of stream {path!r} must be a JSON string, got {value!r}",
        )
    text = value.strip()
    lowered = text.lower()
    if lowered == "latest":
        return LATEST
    if lowered in ("earliest", EARLIEST):
        if ending:
            raise OptionError(
                option, raw, accepted, reason=f"stream {path!r} cannot end at 'earliest'"
            )
        return EARLIEST
    if not is_token(text):
        raise OptionError(
            option,
            raw,
            accepted,
            reason=(
                f"stream {path!r} has offset {value!r}, which is not an offset the server could have "
                "returned (printable ASCII without spaces; 'now' is not accepted, use 'latest')"
            ),
        )
    return text


def check_spec_paths(
    option: str, raw: str | None, spec: OffsetSpec, allowed: Iterable[str]
) -> None:
    """Refuse a ``SpecificSpec`` naming streams the query does not read (a typo would be ignored)."""
    if not isinstance(spec, SpecificSpec):
        return
    known = set(allowed)
    unknown = [path for path in spec.paths if path not in known]
    if unknown:
        raise OptionError(
            option,
            raw,
            "offsets only for streams listed in 'streams'",
            reason=f"stream(s) {', '.join(repr(p) for p in unknown)} are not in 'streams'",
        )
