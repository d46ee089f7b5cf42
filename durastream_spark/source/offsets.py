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
- Above 100 streams the object is written in a compact form instead, ``{"v": 2, "n": <streams>, "z":
  "..."}`` (``offset_codec.py``: the same map, compressed; per-batch cost and size no longer grow with a
  token per stream). Both forms are read, also as ``startingOffsets``.

Some values exist only in *initial* offsets (what ``initialOffset()`` returns), never in the checkpoint:

- ``"latest"`` for a stream: the first batch resolves it to the stream's tail and reads nothing of it.
- ``"timestamp <ms>"`` for a stream (``startingTimestamp``, ``startingOffsetsByTimestamp``; see
  ``timestamps.py``): the first batch reads it from the first message whose append time is at or after
  the instant. Its start is found with the server's time lookup bounded by the batch's end, so a replay of
  that batch (after a restart, Spark asks ``initialOffset()`` again) finds the same message: data before
  the end never changes.
- the key ``"/default"`` (never a stream path: paths have no leading ``/``) with value ``"latest"`` or
  ``"timestamp <ms>"``: where every stream absent from the object starts in the first batch. ``pattern``
  queries with ``startingOffsets=latest`` or ``startingTimestamp`` use it.

With ``minMessagesPerTrigger``/``minBytesPerTrigger``, an end offset also records when its batch was
planned, under the key ``"/batchTimeMs"`` (milliseconds since the epoch, as a string): ``maxTriggerDelay``
is measured from the last batch, and the checkpoint is the only place that survives a restart, so a
restarted query neither waits a whole delay again nor skips what is left of it. The key is written only
when a batch is planned (a trigger that waits returns its start offset unchanged, so Spark sees no new
data); checkpoints without it stay readable.

Why symbolic: Python sources get no checkpoint directory, and Spark calls ``initialOffset()`` again when a
query restarts before its first batch committed. Resolving ``latest`` to tails inside ``initialOffset()``
would give different tails on that second call, so batch 0 would be re-planned over a different range. A
symbolic initial offset is a pure function of the options; the first batch turns it into concrete tails
(its end offset), and Spark writes *that* to the offset log before running the batch. Batch 0 is therefore
empty for ``latest``, and every later batch starts from offsets Spark persisted.

User-facing specs (``OffsetSpec``)
==================================
``startingOffsets`` / ``endingOffsets`` are parsed once, on the driver, into a small sealed type:
``EarliestSpec``, ``LatestSpec``, ``TimestampSpec`` (``startingTimestamp``/``endingTimestamp``: every
stream at one instant) or ``SpecificSpec`` (a JSON object ``{"path": "<offset>"}`` whose values may also be
``"earliest"`` / ``"latest"``, or per-stream instants from ``startingOffsetsByTimestamp`` /
``endingOffsetsByTimestamp``). Strings are never re-parsed later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from durastream_spark.errors import OptionError
from durastream_spark.source.offset_codec import (
    COMPACT_ABOVE,
    DecodedCache,
    EntryTexts,
    Value,
    compact_document,
    decode_value,
    encode_value,
    is_compact,
    pack_text,
    read_compact,
)
from durastream_spark.source.timestamps import at_timestamp, parse_instant, timestamp_of

EARLIEST = "-1"
"""The protocol's "beginning of the stream" (as a start offset) and "nothing read yet" (as an end)."""

LATEST = "latest"
"""Symbolic: the stream's tail, resolved by the first batch. Only in initial offsets."""

DEFAULT_KEY = "/default"
"""Initial offsets only: where streams absent from the object start (``"latest"``)."""

BATCH_TIME_KEY = "/batchTimeMs"
"""End offsets under a per-trigger minimum: when their batch was planned (``maxTriggerDelay``)."""

_V = TypeVar("_V")
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


def is_symbolic(value: str) -> bool:
    """``latest`` or an instant: a start only a batch can resolve (never in the checkpoint)."""
    return value == LATEST or timestamp_of(value) is not None


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


class SourceOffset:
    """Where each stream's next batch starts. Immutable, hashable, picklable; see the module docstring.

    Values are kept in their stored form (``offset_codec``: positions as integers), so that the next
    batch's end is a copy of its start with the changed streams replaced (``updated``), and unchanged
    streams cost no per-entry work on the way in or out, whatever their number.
    """

    __slots__ = ("_raw", "default", "batch_ms", "_document", "_hash", "_packed", "_texts")

    def __init__(
        self,
        positions: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        default: str = EARLIEST,  # where streams absent from ``positions`` start: EARLIEST or symbolic
        batch_ms: int | None = None,  # when the batch ending here was planned (per-trigger minimum)
    ) -> None:
        items = positions.items() if isinstance(positions, Mapping) else positions
        self._init({path: encode_value(value) for path, value in items}, default, batch_ms)

    def _init(self, raw: dict[str, Value], default: str, batch_ms: int | None) -> None:
        if default != EARLIEST and not is_symbolic(default):
            raise ValueError(
                f"default must be {EARLIEST!r}, {LATEST!r} or a timestamp, got {default!r}"
            )
        self._raw = raw
        self.default = default
        self.batch_ms = batch_ms
        self._document: dict[str, Any] | None = None
        self._hash: int | None = None
        self._packed: str | None = None  # the compact ``z`` text of ``_raw``, once computed
        # The compact object's members (``EntryTexts``, shared by copies with the same positions),
        # handed on to the offset ``updated`` derives, so a batch's end encodes only what moved.
        self._texts: EntryTexts | None = None

    @classmethod
    def of(
        cls, mapping: Mapping[str, str], default: str = EARLIEST, batch_ms: int | None = None
    ) -> SourceOffset:
        return cls(mapping, default, batch_ms)

    @classmethod
    def _stored(
        cls, raw: dict[str, Value], default: str = EARLIEST, batch_ms: int | None = None
    ) -> SourceOffset:
        """From values already in stored form (``raw`` is taken over, not copied)."""
        offset = cls.__new__(cls)
        offset._init(raw, default, batch_ms)
        return offset

    def updated(self, changes: Mapping[str, str | None]) -> SourceOffset:
        """A copy with ``changes`` applied (a new offset for a path, or ``None`` to drop it) and no batch
        time. Costs a C-level copy plus the changes, not a pass over every stream in Python."""
        raw = dict(self._raw)
        stored: dict[str, Value | None] = {}
        for path, value in changes.items():
            if value is None:
                raw.pop(path, None)
                stored[path] = None
            else:
                raw[path] = stored[path] = encode_value(value)
        offset = SourceOffset._stored(raw, self.default)
        if self._texts is not None:
            offset._texts = self._texts.take(stored)
        return offset

    def with_batch_ms(self, batch_ms: int | None) -> SourceOffset:
        """The same positions, recording when the batch ending here was planned (sharing the
        compact text, if computed: it depends on the positions only)."""
        offset = SourceOffset._stored(self._raw, self.default, batch_ms)
        offset._packed = self._packed
        offset._texts = self._texts  # same positions: shared
        return offset

    @property
    def positions_key(self) -> Hashable:
        """Identifies the positions (not the batch time); cheap to hash for many streams (the compact
        text, computed once per offset)."""
        if len(self._raw) > COMPACT_ABOVE:
            return (self.default, self.to_dict()["z"])
        return (self.default, self.positions)

    def same_positions(self, other: SourceOffset) -> bool:
        """Whether both name the same starts, whatever their batch times."""
        # Identity first: an offset and its copies with a batch time share their positions.
        return self.default == other.default and (
            self._raw is other._raw or self._raw == other._raw
        )

    # ---- access ------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, path: object) -> bool:
        return path in self._raw

    @property
    def raw(self) -> Mapping[str, Value]:
        """path -> stored value (``offset_codec``): for comparisons of many entries at C speed."""
        return self._raw

    def as_dict(self) -> dict[str, str]:
        return {path: decode_value(value) for path, value in self._raw.items()}

    def get(self, path: str) -> str | None:
        value = self._raw.get(path)
        return None if value is None else decode_value(value)

    def start_of(self, path: str) -> str:
        """Where ``path`` starts: its own value, or the default for streams absent from the offset."""
        value = self._raw.get(path)
        return self.default if value is None else decode_value(value)

    @property
    def positions(self) -> tuple[tuple[str, str], ...]:
        """``(path, offset)`` pairs sorted by path (a full pass: for small offsets and tests)."""
        return tuple(sorted(self.as_dict().items()))

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted(self._raw))

    @property
    def concrete(self) -> bool:
        """No symbolic value: what an end offset (and so the checkpoint) always is."""
        return self.default == EARLIEST and not any(
            type(v) is str and is_symbolic(v) for v in self._raw.values()
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SourceOffset):
            return NotImplemented
        return self is other or (self.batch_ms == other.batch_ms and self.same_positions(other))

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self.default, self.batch_ms, frozenset(self._raw.items())))
        return self._hash

    def __repr__(self) -> str:
        shown = ", ".join(f"{p!r}: {v!r}" for p, v in self.positions[:5])
        more = f", ... {len(self) - 5} more" if len(self) > 5 else ""
        return (
            f"SourceOffset({{{shown}{more}}}, default={self.default!r}, batch_ms={self.batch_ms})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourceOffset._stored, (self._raw, self.default, self.batch_ms))

    # ---- JSON --------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The dict handed to Spark: the readable form ``{"path": "<offset>"}`` (keys sorted, so that
        equal offsets have equal JSON text), or the compact form above ``COMPACT_ABOVE`` streams."""
        if self._document is None:
            extra = {DEFAULT_KEY: self.default} if self.default != EARLIEST else {}
            if self.batch_ms is not None:
                extra[BATCH_TIME_KEY] = str(self.batch_ms)
            if len(self._raw) > COMPACT_ABOVE:
                if self._packed is None:
                    if self._texts is None or self._texts.empty:
                        self._texts = EntryTexts.of(self._raw)
                    self._packed = pack_text(self._texts.text())
                self._document = compact_document(self._raw, extra, self._packed)
                # The first offset seen with this text stays the one Spark's copy decodes to: a batch's
                # end (made first) and the latest offset (same positions, made after) each keep their
                # member texts for their successors.
                _DECODED.put(self._packed, self, replace=False)
            else:
                document = {**self.as_dict(), **extra}
                self._document = {key: document[key] for key in sorted(document)}
        return dict(self._document)

    def json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, document: Any) -> SourceOffset:
        """Parse an offset Spark hands back (or a user copied), in either form. Raises ``ValueError``
        saying what is wrong."""
        if not isinstance(document, Mapping):
            raise ValueError(
                f'a durastream offset is a JSON object {{"path": "<offset>"}}, got {document!r}'
            )
        if is_compact(document):
            return cls._from_compact(document)
        default = EARLIEST
        batch_ms: int | None = None
        positions: dict[str, str] = {}
        for key, value in document.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(
                    f"durastream offset entries map a stream path to an offset string, got "
                    f"{key!r}: {value!r}"
                )
            if key == DEFAULT_KEY:
                default = _default_value(value)
                continue
            if key == BATCH_TIME_KEY:
                batch_ms = _batch_ms(value)
                continue
            if value != EARLIEST and not is_symbolic(value) and not is_token(value):
                raise ValueError(f"stream {key!r} has an invalid offset {value!r}")
            positions[key] = value
        return cls.of(positions, default, batch_ms)

    @classmethod
    def _from_compact(cls, document: Mapping[str, Any]) -> SourceOffset:
        default = _default_value(document.get(DEFAULT_KEY, EARLIEST))
        batch = document.get(BATCH_TIME_KEY)
        batch_ms = None if batch is None else _batch_ms(batch)
        packed = document.get("z")
        known = _DECODED.get(packed) if isinstance(packed, str) else None
        if known is not None and known.default == default:
            # The same positions (the end this process planned last): shared, not decoded again.
            return known if known.batch_ms == batch_ms else known.with_batch_ms(batch_ms)
        offset = cls._stored(read_compact(document), default, batch_ms)
        offset._packed = packed
        for path, value in offset._raw.items():
            if (
                type(value) is str
                and value != EARLIEST
                and not is_symbolic(value)
                and not is_token(value)
            ):
                raise ValueError(f"stream {path!r} has an invalid offset {value!r}")
        return _DECODED.put(packed, offset)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, text: str) -> SourceOffset:
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"a durastream offset must be JSON: {exc}") from None
        return cls.from_dict(document)


_DECODED = DecodedCache()


def _default_value(value: object) -> str:
    if not isinstance(value, str) or (value != EARLIEST and not is_symbolic(value)):
        raise ValueError(f"{DEFAULT_KEY} must be {LATEST!r} or a timestamp, got {value!r}")
    return value


def _batch_ms(value: object) -> int:
    if not isinstance(value, str) or not value.isdigit():
        raise ValueError(f"{BATCH_TIME_KEY} must be milliseconds, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------------------------------------
# startingOffsets / endingOffsets
# --------------------------------------------------------------------------------------------------------


class OffsetSpec:
    """Sealed: ``EarliestSpec``, ``LatestSpec``, ``TimestampSpec`` or ``SpecificSpec``."""

    __slots__ = ()


@dataclass(frozen=True)
class EarliestSpec(OffsetSpec):
    """Every stream from its first retained message."""


@dataclass(frozen=True)
class LatestSpec(OffsetSpec):
    """Every stream from (start) or up to (end) its tail when the query resolves it."""


@dataclass(frozen=True)
class TimestampSpec(OffsetSpec):
    """Every stream from (start) or up to (end) its first message at or after ``at_ms``."""

    at_ms: int

    @property
    def value(self) -> str:
        return at_timestamp(self.at_ms)


@dataclass(frozen=True)
class SpecificSpec(OffsetSpec):
    """Per-stream offsets: tokens, ``EARLIEST``, ``LATEST`` or instants (``at_timestamp``). Streams not
    listed use ``unlisted``."""

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
    offsets = _by_stream(
        option,
        raw,
        accepted,
        lambda path, value: _parse_offset_value(option, raw, accepted, path, value, ending=ending),
    )
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


def parse_timestamp_spec(option: str, raw: str | None) -> TimestampSpec | None:
    """``startingTimestamp`` / ``endingTimestamp``: one instant for every stream."""
    if raw is None:
        return None
    return TimestampSpec(parse_instant(option, raw, raw))


def parse_timestamps_by_stream(option: str, raw: str | None) -> dict[str, int] | None:
    """``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``: ``{"path": <instant>}``."""
    if raw is None:
        return None
    accepted = (
        'a JSON object mapping stream paths to instants, e.g. {"events/a": 1700000000000, '
        '"events/b": "2024-01-31T12:00:00Z"} (epoch milliseconds or ISO-8601 with a zone)'
    )
    return _by_stream(
        option,
        raw,
        accepted,
        lambda path, value: parse_instant(option, raw, value, where=f"stream {path!r}"),
    )


def _by_stream(
    option: str, raw: str, accepted: str, parse_value: Callable[[str, object], _V]
) -> dict[str, _V]:
    """A JSON object ``{"<stream path>": <value>}`` of an option: paths normalized, each named once,
    values parsed by ``parse_value(path, value)``, at least one stream."""
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise OptionError(option, raw, accepted, reason=f"not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OptionError(option, raw, accepted, reason="not a JSON object")
    if is_compact(document):  # a checkpoint offset of many streams, copied as it is
        try:
            document = SourceOffset.from_dict(document).as_dict()
        except ValueError as exc:
            raise OptionError(option, raw, accepted, reason=str(exc)) from None
    values: dict[str, _V] = {}
    for key, value in document.items():
        try:
            path = normalize_path(key)
        except ValueError as exc:
            raise OptionError(option, raw, accepted, reason=str(exc)) from None
        if path in values:
            raise OptionError(option, raw, accepted, reason=f"stream {path!r} is listed twice")
        values[path] = parse_value(path, value)
    if not values:
        raise OptionError(option, raw, accepted, reason="the JSON object names no stream")
    return values


def with_timestamps(
    base: OffsetSpec,
    instants: dict[str, int],
    *,
    option: str,
    raw: str | None,
    base_option: str,
    ending: bool,
) -> SpecificSpec:
    """``base`` (from startingOffsets/endingOffsets) with the per-stream instants of ``option`` on top.
    A stream named by both is refused: which one was meant cannot be guessed."""
    if isinstance(base, SpecificSpec):
        both = sorted(set(base.paths) & set(instants))
        if both:
            raise OptionError(
                option,
                raw,
                f"instants only for streams that '{base_option}' does not name",
                reason=f"stream(s) {', '.join(repr(p) for p in both)} are in both options",
            )
        offsets = dict(base.offsets)
        unlisted = base.unlisted
    else:
        offsets = {}
        unlisted = LATEST if isinstance(base, LatestSpec) or ending else EARLIEST
    offsets.update({path: at_timestamp(ms) for path, ms in instants.items()})
    return SpecificSpec(tuple(sorted(offsets.items())), unlisted=unlisted)


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
