"""The chaos soak's verifier: compare A, B and the parquet table message by message.

Every message the producers write is a JSON object ``{"p": producer, "n": number, "k": key, "pad": ...,
"d": digest}`` with ``d = sha256(p|n|k|pad)[:16]`` (``digest``). Job 1 re-serializes it into B with ``ao``
(the A offset it was read at) and the tags of the tasks that handled it (``mt``, and ``rt`` after the
shuffle); job 2 copies B's bytes and offsets into the table. The checks:

- **count**: every acknowledged ``(p, n)`` is in A, B and the table exactly once (lost = missing,
  duplicated = extra copies; anything unexpected counts as duplicated);
- **content digest**: every copy's ``d`` matches its content, and B's copy has A's content;
  the table's bytes are B's bytes at the same B offset;
- **order**: A: per producer, ``n`` strictly increasing (the idempotent producer's order). B: see
  ``check_b_order``. Table: keyed by B offset, so it has B's order by construction (checked as equality).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.frames import decode_frames, offset_tokens


def digest(p: str, n: int, k: str, pad: str) -> str:
    return hashlib.sha256(f"{p}|{n}|{k}|{pad}".encode()).hexdigest()[:16]


class StreamTail:
    """Reads a stream incrementally (``format=frames``): ``poll()`` appends new ``(offset, bytes)``."""

    def __init__(self, base_url: str, path: str) -> None:
        self.client = StreamClient(
            ConnectionOptions.parse({"url": base_url + "/v1/stream", "requestTimeoutMs": "30000"})
        )
        self.path = path
        self.offset = "-1"
        self.messages: list[tuple[str, bytes]] = []

    def poll(self) -> int:
        before = len(self.messages)
        while True:
            chunk = self.client.read(self.path, self.offset, format="frames")
            frames = decode_frames(chunk.body)
            if frames.count:
                tokens = offset_tokens(frames.positions).to_pylist()
                values = frames.values.to_pylist()
                self.messages.extend(zip(tokens, values, strict=True))
            if chunk.next_offset == self.offset or chunk.up_to_date or not frames.count:
                self.offset = chunk.next_offset
                break
            self.offset = chunk.next_offset
        return len(self.messages) - before


def committed_table_files(table: Path) -> list[str]:
    """The parquet files Spark's file sink committed (its ``_spark_metadata`` log); files of attempts
    and batches that never committed are in the directory too and must be ignored, as Spark does."""
    meta = table / "_spark_metadata"
    files: set[str] = set()
    if not meta.is_dir():
        return []
    for name in os.listdir(meta):
        if name.startswith(".") or name.endswith(".tmp"):
            continue
        try:
            lines = (meta / name).read_text().splitlines()
        except OSError:
            continue
        for line in lines[1:]:  # first line: version
            if not line.strip():
                continue
            entry = json.loads(line)
            path = entry["path"]
            if path.startswith("file:"):
                path = path[len("file:") :]
                while path.startswith("//"):
                    path = path[1:]
            if entry.get("action", "add") == "add":
                files.add(path)
            else:
                files.discard(path)
    return sorted(files)


class TableTail:
    """Rows ``(B offset, bytes)`` of the committed parquet files, read incrementally."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.seen: set[str] = set()
        self.rows: list[tuple[str, bytes]] = []

    def poll(self) -> int:
        before = len(self.rows)
        for path in committed_table_files(self.table):
            if path in self.seen:
                continue
            data = pq.read_table(path, columns=["offset", "value"])
            self.rows.extend(
                zip(
                    data.column("offset").to_pylist(), data.column("value").to_pylist(), strict=True
                )
            )
            self.seen.add(path)
        return len(self.rows) - before


def batch_ends(checkpoint: Path, stream: str) -> list[str]:
    """Job 1's micro-batch end offsets of stream A (its offset log), in batch order."""
    offsets = checkpoint / "offsets"
    ends: list[tuple[int, str]] = []
    if not offsets.is_dir():
        return []
    for name in os.listdir(offsets):
        if not name.isdigit():
            continue
        lines = [line for line in (offsets / name).read_text().splitlines() if line.strip()]
        recorded = json.loads(lines[-1])
        value = recorded.get(stream) or recorded.get("/" + stream.lstrip("/"))
        if value is None and len(recorded) == 1:
            value = next(iter(recorded.values()))
        if value and value not in ("-1", "earliest", "latest"):
            ends.append((int(name), value))
    ends.sort()
    return [value for _, value in ends]


@dataclass
class Report:
    messages_in: int = 0
    out: int = 0
    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)
    detail: dict[str, dict[str, int]] = field(default_factory=dict)

    def problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and not self.problems


def _parse(value: bytes, where: str, report: Report) -> dict | None:
    try:
        message = json.loads(value)
        if digest(message["p"], message["n"], message["k"], message["pad"]) != message["d"]:
            report.problem(f"{where}: content does not match its digest: {value[:120]!r}")
        return message
    except (ValueError, KeyError, TypeError):
        report.problem(f"{where}: not a soak message: {value[:120]!r}")
        return None


def _count(
    name: str, keys: list[tuple[str, int]], expected: set[tuple[str, int]], report: Report
) -> None:
    counts = Counter(keys)
    lost = len(expected - counts.keys())
    duplicated = sum(c - 1 for c in counts.values() if c > 1) + sum(
        c for k, c in counts.items() if k not in expected
    )
    report.detail[name] = {"messages": len(keys), "lost": lost, "duplicated": duplicated}
    report.lost = max(report.lost, lost)
    report.duplicated += duplicated
    if lost:
        missing = sorted(expected - counts.keys())[:5]
        report.problem(f"{name}: {lost} messages lost, e.g. {missing}")
    if duplicated:
        dups = [k for k, c in counts.items() if c > 1][:5]
        report.problem(f"{name}: {duplicated} duplicated, e.g. {dups}")


def check_b_order(
    b_messages: list[dict], ends: list[str], variant: str, report: Report
) -> dict[str, int]:
    """The order B must have, given how job 1 writes it.

    Job 1's micro-batch ``i`` reads A's range ``[ends[i-1], ends[i])`` (its offset log); the sink commits
    each (stream, Spark partition) of a batch as one atomic record group, batch after batch, groups of one
    batch in any order. So, in B:

    1. batches never go backwards (by the batch of each message's A offset ``ao``);
    2. within a batch, the messages of one sink task (``rt`` after a shuffle, else ``mt``) are contiguous;
    3. within a sink task: without a shuffle, a contiguous A range in A order (``ao`` strictly increasing);
       with a shuffle, A order per map task (``ao`` strictly increasing per ``mt``: a reducer receives
       each map task's rows in their order, the map tasks interleaved arbitrarily).
    """
    sink_tag = "rt" if variant == "shuffle" else "mt"
    violations = Counter()
    last_batch = -1
    current: tuple[int, str] | None = None
    finished: set[tuple[int, str]] = set()
    last_ao: dict[tuple[str, str], str] = {}
    for message in b_messages:
        ao = message.get("ao")
        tag = message.get(sink_tag)
        if ao is None or tag is None:
            violations["untagged"] += 1
            continue
        batch = bisect.bisect_right(ends, ao)  # ends[batch-1] <= ao < ends[batch]
        if batch == len(ends):
            violations["beyond_last_batch_end"] += 1
        if batch < last_batch:
            violations["batch_went_backwards"] += 1
        last_batch = max(last_batch, batch)
        group = (batch, tag)
        if group != current:
            if group in finished:
                violations["sink_task_not_contiguous"] += 1
            if current is not None:
                finished.add(current)
            current = group
        key = (tag, message["mt"] if variant == "shuffle" else "")
        previous = last_ao.get(key)
        if previous is not None and ao <= previous:
            violations["a_order_broken_within_task"] += 1
        last_ao[key] = ao
    for kind, count in violations.items():
        report.problem(f"B order: {count} x {kind}")
    return {**violations, "sink_tasks": len(finished) + (current is not None)}


def verify(
    server_url: str,
    stream_a: str,
    stream_b: str,
    table: Path,
    checkpoint_ab: Path,
    acked: dict[str, int],
    variant: str,
    *,
    tails: tuple[StreamTail, StreamTail, TableTail] | None = None,
) -> Report:
    report = Report()
    expected = {(p, n) for p, count in acked.items() for n in range(count)}
    report.messages_in = len(expected)
    if tails is None:
        tails = (
            StreamTail(server_url, stream_a),
            StreamTail(server_url, stream_b),
            TableTail(table),
        )
    a_tail, b_tail, table_tail = tails
    for tail in tails:
        tail.poll()

    # A: count, digests, per-producer order.
    a_by_key: dict[tuple[str, int], tuple[str, bytes]] = {}
    a_keys: list[tuple[str, int]] = []
    last_n: dict[str, int] = {}
    a_order = 0
    for offset, value in a_tail.messages:
        message = _parse(value, f"A@{offset}", report)
        if message is None:
            continue
        key = (message["p"], message["n"])
        a_keys.append(key)
        a_by_key.setdefault(key, (offset, value))
        if message["n"] <= last_n.get(message["p"], -1):
            a_order += 1
        last_n[message["p"]] = message["n"]
    if a_order:
        report.problem(f"A order: {a_order} messages out of producer order")
    _count("A", a_keys, expected, report)

    # B: count, digests, same content as A, read at A's offset, order.
    b_keys: list[tuple[str, int]] = []
    b_messages: list[dict] = []
    b_by_offset: dict[str, bytes] = {}
    mismatched = 0
    for offset, value in b_tail.messages:
        b_by_offset[offset] = value
        message = _parse(value, f"B@{offset}", report)
        if message is None:
            continue
        key = (message["p"], message["n"])
        b_keys.append(key)
        b_messages.append(message)
        original = a_by_key.get(key)
        if original is not None:
            a_offset, a_value = original
            a_message = json.loads(a_value)
            same = all(message.get(f) == a_message[f] for f in ("p", "n", "k", "pad", "d"))
            if not same or message.get("ao") != a_offset:
                mismatched += 1
    if mismatched:
        report.problem(f"B: {mismatched} messages differ from A (content or A offset)")
    _count("B", b_keys, expected, report)
    ends = batch_ends(checkpoint_ab, stream_a)
    report.detail["B_order"] = check_b_order(b_messages, ends, variant, report)
    report.detail["B_order"]["batches"] = len(ends)

    # Table: count, digests, bytes equal to B's at the same offset.
    t_keys: list[tuple[str, int]] = []
    differs = 0
    for offset, value in table_tail.rows:
        message = _parse(value, f"table@{offset}", report)
        if message is None:
            continue
        t_keys.append((message["p"], message["n"]))
        if b_by_offset.get(offset) != value:
            differs += 1
    if differs:
        report.problem(f"table: {differs} rows differ from B at their B offset")
    _count("table", t_keys, expected, report)
    report.out = len(set(t_keys) & expected)
    return report
