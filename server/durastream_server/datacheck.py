"""Read-only verification of a data directory (``durastream-server check`` and ``inspect``).

It reads every file the server would, with the server's own readers (``recovery.py``'s segment reader
and replay fold, ``txnfile.py``'s staging reader), but never writes, truncates, renames or deletes:
where start-up would repair (truncate a torn tail, drop a stale snapshot, remove a leftover temporary
file) it reports what the server would do. So it may run on a copy, or on a directory no server holds.

Per stream it checks:
- every record of every segment: framing and CRC-32, contiguous segments, a valid header record;
- the replay: positions follow each other, record groups are complete (the same fold as recovery);
- the snapshot: it decodes, belongs to the stream, lines up with the segments, replaying the rest of the
  log from it gives the state of a full replay, and its sparse index is exactly the one a full replay
  builds (same points, ordinals and times);
- staged-append files: header and every record (a bad record followed by valid data is damage), and
  the tombstones file.
Then the packed streams (``storage/packs.py``: streams that are a create entry in ``packs/`` or ``wal/``,
with no directory yet; reported as empty streams, with 0 segments), the subscriptions' state files and the
quarantine.

Findings are ``damage`` (data the server cannot serve as acknowledged: it would quarantine the stream or
refuse a handle) or ``repair`` (what start-up fixes by itself with nothing acknowledged lost: a torn tail
from a crash mid-write, a leftover temporary file). Reading costs one sequential pass over every byte.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durastream_server.storage import codec, packs, recovery
from durastream_server.storage.index import LogIndex, SparseIndex
from durastream_server.storage.quarantine import QUARANTINE_DIR
from durastream_server.storage.records import StreamHeader
from durastream_server.storage.segments import segment_name
from durastream_server.storage.snapshot import (
    SNAPSHOT_NAME,
    SNAPSHOT_TMP,
    comparable_state,
    decode_snapshot,
)
from durastream_server.storage.state import StreamState
from durastream_server.storage.txnfile import (
    STAGING_SUFFIX,
    TMP_SUFFIX,
    TOMBSTONES,
    TXN_DIR,
    load_tombstones,
    recover_staging_file,
)
from durastream_server.subscriptions.store import read_record

DAMAGE = "damage"
REPAIR = "repair"
DEFAULT_INDEX_INTERVAL = 64 * 1024  # StorageConfig.index_interval_bytes


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str  # DAMAGE or REPAIR
    kind: str  # segment, header, record, snapshot, index, staging, tombstones, subscription, ...
    message: str


@dataclass(slots=True)
class StreamReport:
    """What one stream directory holds, and what is wrong with it."""

    id: str
    path: str | None = None
    content_type: str | None = None
    created_at_ms: int | None = None
    ttl_seconds: int | None = None
    expires_at: str | None = None
    fork_of: str | None = None
    segments: int = 0
    bytes_on_disk: int = 0
    tail: int | None = None  # logical position after the last message
    messages: int | None = None
    closed: bool | None = None
    soft_deleted: bool | None = None
    last_stream_seq: str | None = None
    producers: dict[str, dict[str, int]] = field(default_factory=dict)  # id -> epoch, last_seq
    staged_handles: int = 0
    staged_bytes: int = 0
    snapshot: str = "none"  # none, ok, damaged
    findings: list[Finding] = field(default_factory=list)

    @property
    def status(self) -> str:
        severities = {finding.severity for finding in self.findings}
        if DAMAGE in severities:
            return "damaged"
        return "repairable" if REPAIR in severities else "ok"

    def note(self, severity: str, kind: str, message: str) -> None:
        self.findings.append(Finding(severity, kind, message))


def verify_stream(
    directory: str, log_id: str, index_interval: int = DEFAULT_INDEX_INTERVAL
) -> StreamReport:
    """Check one ``streams/<id>/`` directory (blocking; reads every byte once, plus the snapshot's
    replay)."""
    report = StreamReport(log_id)
    try:
        _verify_log(directory, log_id, index_interval, report)
        _verify_staging(directory, report)
    except OSError as exc:
        report.note(DAMAGE, "file", f"unreadable: {exc}")
    return report


def _list_segments(directory: str, report: StreamReport) -> tuple[list[int], list[int]]:
    bases, others = recovery.segment_listing(directory)
    for name in others:
        if name == SNAPSHOT_TMP:
            report.note(REPAIR, "snapshot", "an interrupted snapshot write (start-up removes it)")
        else:
            report.note(REPAIR, "file", f"unexpected file {name!r} (the server ignores it)")
    sizes = [os.stat(os.path.join(directory, segment_name(b))).st_size for b in bases]
    report.segments, report.bytes_on_disk = len(bases), sum(sizes)
    return bases, sizes


def _verify_log(directory: str, log_id: str, interval: int, report: StreamReport) -> None:
    bases, sizes = _list_segments(directory, report)
    if not bases or bases[0] != 0:
        report.note(DAMAGE, "segment", "the first segment is missing")
        return
    segs = recovery._Segments(directory, bases, sizes)
    try:
        try:
            header, header_end = recovery._read_header(segs)
            _describe(report, header)
            recovery._check_contiguous(bases, sizes, header.path)
        except recovery.Quarantine as q:
            report.note(DAMAGE, "header" if report.path is None else "segment", q.reason)
            return
        snapshot = _load_snapshot(directory, log_id, report)
        index_interval = snapshot.index.interval if snapshot is not None else interval
        state = StreamState(
            tail=header.fork_position, last_timestamp_ms=header.append_time_floor_ms
        )
        index = LogIndex(SparseIndex(index_interval, last_time=header.append_time_floor_ms))
        index.sparse.note(header.fork_position, header_end, 0)
        complete = _replay(segs, header_end, state, index, report)
        _take_state(report, state, index.messages)
        if snapshot is not None:
            _check_snapshot(segs, header, header_end, snapshot, state, index, complete, report)
    finally:
        segs.close()


def _take_state(report: StreamReport, state: StreamState, messages: int) -> None:
    """What a fold found, reported alike for a directory's segments and a packed stream's records."""
    report.tail, report.messages = state.tail, messages
    report.closed, report.soft_deleted = state.closed, state.soft_deleted
    report.last_stream_seq = state.last_stream_seq
    report.producers = {
        producer_id: {"epoch": producer.epoch, "last_seq": producer.last_seq}
        for producer_id, producer in sorted(state.producers.items())
    }


def _describe(report: StreamReport, header: StreamHeader) -> None:
    report.path = header.path
    report.content_type = header.content_type
    report.created_at_ms = header.created_at_ms
    report.ttl_seconds = header.ttl_seconds
    report.expires_at = header.expires_at
    report.fork_of = header.fork_source_path


def _replay(
    segs: recovery._Segments, start: int, state: StreamState, index: LogIndex, report: StreamReport
) -> bool:
    """Fold the log like recovery does; report where and how it stops. True: the whole log folded."""
    try:
        recovery._replay(segs, start, state, index, recovery._Progress(0))
        return True
    except recovery._Inconsistent as exc:
        report.note(DAMAGE, "record", str(exc))
    except recovery._Bad as bad:
        where = f"{segment_name(segs.bases[bad.seg])} offset {bad.off}"
        after = recovery._valid_data_after(segs, bad)
        if after is not None:
            j, off = after
            report.note(
                DAMAGE,
                "record",
                f"{bad.reason} at {where}, followed by valid data at "
                f"{segment_name(segs.bases[j])} offset {off}",
            )
        else:
            dropped = segs.sizes[bad.seg] - bad.off + sum(segs.sizes[bad.seg + 1 :])
            report.note(
                REPAIR,
                "record",
                f"torn tail ({bad.reason}) at {where}: start-up truncates {dropped} bytes "
                "that were never acknowledged",
            )
    return False


def _load_snapshot(directory: str, log_id: str, report: StreamReport) -> Any:
    try:
        with open(os.path.join(directory, SNAPSHOT_NAME), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        snapshot = decode_snapshot(data)
    except (ValueError, KeyError, TypeError) as exc:
        report.snapshot = "damaged"
        report.note(DAMAGE, "snapshot", f"does not decode: {exc}")
        return None
    if snapshot.log_id != log_id:
        report.snapshot = "damaged"
        report.note(DAMAGE, "snapshot", f"belongs to stream {snapshot.log_id}")
        return None
    return snapshot


def _check_snapshot(
    segs: recovery._Segments,
    header: StreamHeader,
    header_end: int,
    snapshot: Any,
    full_state: StreamState,
    full_index: LogIndex,
    complete: bool,
    report: StreamReport,
) -> None:
    """The snapshot against its log: it lines up, the rest of the log folds onto it into the full
    replay's state, and its index is the full replay's index up to where it ends."""
    report.snapshot = "damaged"
    total_end = segs.bases[-1] + segs.sizes[-1]
    if not recovery._snapshot_fits(snapshot, segs, header, header_end, total_end):
        report.note(DAMAGE, "snapshot", "does not line up with the segment files")
        return
    sparse: SparseIndex = snapshot.index
    full = full_index.sparse
    n = len(sparse)
    for name in ("positions", "offsets", "ordinals", "times"):
        if list(getattr(sparse, name)) != list(getattr(full, name)[:n]):
            report.note(DAMAGE, "index", f"the snapshot's index {name} differ from the log's")
            return
    if not complete:
        report.snapshot = "ok"
        return  # the log itself stops early: the comparison of end states says nothing more
    state, index = snapshot.state, LogIndex(sparse)
    try:
        recovery._replay(segs, snapshot.covered_end, state, index, recovery._Progress(0))
    except (recovery._Bad, recovery._Inconsistent) as exc:
        report.note(DAMAGE, "snapshot", f"the log does not replay on top of it: {exc}")
        return
    if (
        comparable_state(state) != comparable_state(full_state)
        or index.messages != full_index.messages
    ):
        report.note(DAMAGE, "snapshot", "its state differs from a full replay of the log")
        return
    report.snapshot = "ok"


def _verify_staging(directory: str, report: StreamReport) -> None:
    txn_dir = os.path.join(directory, TXN_DIR)
    if not os.path.isdir(txn_dir):
        return
    for name in sorted(os.listdir(txn_dir)):
        if name.endswith(TMP_SUFFIX):
            report.note(REPAIR, "staging", f"interrupted creation {name} (start-up removes it)")
            continue
        if not name.endswith(STAGING_SUFFIX):
            continue
        path = os.path.join(txn_dir, name)
        handle = recover_staging_file(path, sync=False, repair=False)
        if handle is None:
            report.note(REPAIR, "staging", f"{name} has no valid header (never acknowledged)")
            continue
        if handle.corrupt is not None:
            report.note(
                DAMAGE, "staging", f"{name} (handle {handle.header.handle!r}): {handle.corrupt}"
            )
            continue
        if handle.torn_at is not None:
            report.note(REPAIR, "staging", f"{name}: torn tail at {handle.torn_at}")
        report.staged_handles += 1
        report.staged_bytes += handle.state.tail
    if os.path.exists(os.path.join(txn_dir, TOMBSTONES)):
        _, dropped = load_tombstones(txn_dir, int(time.time() * 1000))
        if dropped:
            report.note(
                REPAIR, "tombstones", f"{dropped} line(s) expired, torn or damaged (dropped)"
            )


@dataclass(slots=True)
class DirectoryReport:
    root: str
    streams: list[StreamReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # outside any stream
    quarantined: list[dict[str, Any]] = field(default_factory=list)
    subscriptions: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    packed: int = 0  # packed streams (no directory yet)
    packs_bytes: int = 0  # bytes of the files in packs/

    @property
    def damaged(self) -> bool:
        return (
            any(stream.status == "damaged" for stream in self.streams)
            or any(finding.severity == DAMAGE for finding in self.findings)
            or bool(self.quarantined)
        )


def stream_dirs(root: Path) -> Iterator[tuple[str, str]]:
    """(storage id, directory) of every stream, in id order."""
    streams = root / "streams"
    if not streams.is_dir():
        return
    for log_id in sorted(os.listdir(streams)):
        yield log_id, str(streams / log_id)


def verify_dir(root: Path, only: str | None = None) -> DirectoryReport:
    """Check every stream (or the stream at path ``only``), the subscriptions and the quarantine."""
    started = time.perf_counter()
    report = DirectoryReport(str(root))
    for log_id, directory in stream_dirs(root):
        if not os.path.isdir(directory):
            report.findings.append(Finding(DAMAGE, "file", f"streams/{log_id} is not a directory"))
            continue
        stream = verify_stream(directory, log_id)
        if only is not None and stream.path != only:
            continue
        report.streams.append(stream)
        report.bytes_read += stream.bytes_on_disk
    _verify_packed(root, only, report)
    if only is None:
        _verify_subscriptions(root / "meta" / "subscriptions" / "subscriptions", report)
        report.quarantined = _quarantined(root)
    report.seconds = time.perf_counter() - started
    return report


def _verify_packed(root: Path, only: str | None, report: DirectoryReport) -> None:
    """Packed streams, as the server would find them at start-up (``packs.survey``, read only)."""
    found = packs.survey(root, packs.wal_scans(root))
    for path, start, end in found.damaged:
        report.findings.append(
            Finding(DAMAGE, "pack", f"{path.name}: bytes {start}-{end} are damaged")
        )
    for generation, _ in found.pack_scans:
        pack = root / packs.PACKS_DIR / packs.pack_name(generation)
        report.packs_bytes += pack.stat().st_size
        report.bytes_read += pack.stat().st_size
    for log_id, (_, frame) in sorted(found.live.items()):
        stream = StreamReport(log_id)
        try:
            header = packs.decode_header_frame(frame)
        except codec.CorruptRecord as exc:
            stream.note(DAMAGE, "header", f"packed create: {exc}")
            report.streams.append(stream)
            continue
        if only is not None and header.path != only:
            continue
        report.packed += 1
        _describe(stream, header)
        stream.tail = header.fork_position
        stream.messages = 0
        stream.closed = stream.soft_deleted = False
        pieces = found.pieces.get(log_id)
        if pieces is not None:  # packed records (decision 0010 step 2): folded as start-up does
            _fold_packed(stream, log_id, b"".join(p.records for p in packs.prefix(pieces)))
        if log_id in found.gaps:
            stream.note(
                DAMAGE,
                "packed records",
                "a damaged pack entry holds some of its records (a gap, or named by the pack's "
                "index): the server quarantines it",
            )
        report.streams.append(stream)
    for log_id, path in sorted(found.lost.items()):  # named by a pack index, create damaged
        if only is not None and path != only:
            continue
        stream = StreamReport(log_id)
        stream.path = path
        stream.note(
            DAMAGE,
            "header",
            "its packed create is a damaged pack entry (named by the pack's index): the server "
            "quarantines it",
        )
        report.streams.append(stream)


def _fold_packed(stream: StreamReport, log_id: str, virtual: bytes) -> None:
    """A packed stream's tail and messages from its packed records (its virtual segment 0)."""
    try:
        folded = recovery.recover_packed(log_id, virtual, 64 * 1024)
    except recovery.Quarantine as exc:
        stream.note(DAMAGE, "packed records", exc.reason)
        return
    _take_state(stream, folded.state, folded.index.messages)


def _verify_subscriptions(directory: Path, report: DirectoryReport) -> None:
    """Each subscription's state file must be a JSON object with an ``id`` (what the server loads; a
    file it cannot load is a subscription lost)."""
    if not directory.is_dir():
        return
    for path in sorted(directory.iterdir()):
        if path.name.endswith(".tmp"):
            report.findings.append(
                Finding(REPAIR, "subscription", f"interrupted write {path.name} (removed at start)")
            )
            continue
        if path.suffix != ".json":
            continue
        try:
            read_record(path)
        except (OSError, ValueError) as exc:
            report.findings.append(Finding(DAMAGE, "subscription", f"{path.name}: {exc}"))
            continue
        report.subscriptions += 1


def _quarantined(root: Path) -> list[dict[str, Any]]:
    directory = root / QUARANTINE_DIR
    if not directory.is_dir():
        return []
    entries = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") or name.endswith(".tmp"):
            continue
        try:
            meta = json.loads((directory / (name + ".json")).read_bytes())
        except (OSError, ValueError):
            meta = {}
        entries.append(
            {"id": meta.get("id", name), "path": meta.get("path"), "reason": meta.get("reason")}
        )
    return entries
