"""The routed save's per-stream shortcuts build exactly what the general builders build.

A task's inline parts are joined straight from its batchers (``RequestBatcher.remainder_bytes``) and the
driver groups a stream's inline parts with per-message work done once (``_stream_groups``). Exactly-once
depends on those bytes: a replayed batch's commit must carry the same producer tuples and key, and an
inline part's body is its data. So both are checked against the general path on randomized inputs:
several partitions, streams with 1..n parts, inline and staged parts, JSON and byte framing.
"""

from __future__ import annotations

import os
import random

import pytest

from durastream_spark.protocol import bulk
from durastream_spark.sink import transactional
from durastream_spark.sink.batch_mode import COMMIT_KEY, COMMIT_SEQ
from durastream_spark.sink.batcher import RequestBatcher
from durastream_spark.sink.encoding import EncodedRows
from durastream_spark.sink.messages import SinkCommitMessage, StreamPart


def _payloads(rng: random.Random, count: int, json: bool) -> list[bytes]:
    rows = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12))) for _ in range(count)]
    return [b'"%s",' % row.hex().encode() for row in rows] if json else rows


@pytest.mark.parametrize("json", [True, False])
def test_remainder_bytes_is_the_remainders_body(json: bool) -> None:
    rng = random.Random(16 + json)
    for _ in range(300):
        limits = (rng.randrange(1, 30), rng.randrange(8, 200))
        general = RequestBatcher(*limits, json_framing=json)
        joined = RequestBatcher(*limits, json_framing=json)
        separator = 1 if json else 0
        for _ in range(rng.randrange(0, 5)):  # input batches, as Spark cuts them
            rows = EncodedRows.from_payloads(_payloads(rng, rng.randrange(0, 25), json), separator)
            full = general.add(rows)
            assert [bytes(r.body) for r in joined.add(rows)] == [bytes(r.body) for r in full]
        size = joined.pending_body_bytes
        remainder = general.remainder()
        if remainder is None:
            assert joined.remainder_bytes() is None and size == 0
            continue
        body = joined.remainder_bytes()
        assert body == bytes(remainder.body) and size == len(body)
        assert joined.remainder_bytes() is None  # it ends the batcher, as remainder() does


def _reference_groups(jobs: list) -> list[tuple[tuple[int, ...], bulk.PartsEntry]]:
    """The grouping as the commit built it before (one pass per part, nothing shared)."""
    inline = [i for i, (_, part) in enumerate(jobs) if part.inline is not None]
    if len(inline) < 2:
        return []
    producer_ids = {jobs[i][0].producer_id for i in inline}
    prefix = os.path.commonprefix(sorted(producer_ids))
    epochs = {jobs[i][0].epoch for i in inline}
    if len(epochs) != 1 or not all(
        transactional._SUFFIX.fullmatch(p[len(prefix) :]) for p in producer_ids
    ):
        return []
    by_stream: dict[str, list[int]] = {}
    for i in inline:
        by_stream.setdefault(jobs[i][1].stream, []).append(i)
    out = []
    for stream, listed in by_stream.items():
        for first in range(0, len(listed), bulk.MAX_ENTRY_PARTS):
            indexes = listed[first : first + bulk.MAX_ENTRY_PARTS]
            producers = [jobs[i][0].producer_id for i in indexes]
            if len(indexes) < 2 or len(set(producers)) != len(producers):
                continue
            entry = bulk.PartsEntry(
                stream,
                prefix,
                next(iter(epochs)),
                COMMIT_SEQ,
                COMMIT_KEY,
                tuple(p[len(prefix) :] for p in producers),
                tuple(jobs[i][1].inline or b"" for i in indexes),
            )
            out.append((tuple(indexes), entry))
    return out


def _jobs(rng: random.Random) -> list[tuple[SinkCommitMessage, StreamPart]]:
    """A batch's (message, part) jobs: partitions (some with two attempts' messages, as a test
    harness may send), streams with parts in 1..n of them, inline or staged, in a shuffled order."""
    epoch = rng.randrange(0, 5)
    writer = rng.choice(["w", "job-1", "q.x"])
    messages = []
    for partition in range(rng.randrange(1, 9)):
        for attempt in range(rng.choice([1, 1, 1, 2])):
            producer = f"ds-{writer}-{partition}"
            if rng.random() < 0.03:
                producer = f"other/{partition}"  # not the sink's shape: no grouping at all
            messages.append(
                SinkCommitMessage("transactional", writer, epoch, partition, attempt, producer, ())
            )
    jobs = []
    for stream in range(rng.randrange(1, 40)):
        for message in rng.sample(messages, rng.randrange(1, len(messages) + 1)):
            if rng.random() < 0.2:
                part = StreamPart(f"s{stream}", 2, 9, 1, handles=(f"h{stream}",))
            else:
                part = StreamPart(f"s{stream}", 1, 3, 0, inline=os.urandom(rng.randrange(1, 9)))
            jobs.append((message, part))
    rng.shuffle(jobs)
    return jobs


def test_stream_groups_are_the_reference_groups() -> None:
    rng = random.Random(1616)
    grouped = 0
    for _ in range(400):
        jobs = _jobs(rng)
        groups = transactional._stream_groups(jobs)
        assert [(g.indexes, g.entry) for g in groups] == _reference_groups(jobs)
        for group in groups:  # and each part is what its own commit entry would carry
            for suffix, body, index in zip(
                group.entry.suffixes, group.entry.bodies, group.indexes, strict=True
            ):
                single = transactional.commit_entry(*jobs[index])
                producer = (
                    group.entry.producer_prefix + suffix,
                    group.entry.epoch,
                    group.entry.seq,
                )
                assert (producer, group.entry.key, body) == (
                    single.producer,
                    single.key,
                    single.inline,
                )
        grouped += len(groups)
    assert grouped > 100  # the inputs did exercise the grouping


def test_summaries_add_up_each_streams_parts() -> None:
    """``summarize`` (one pass per stream) against the sums written out per field."""
    from durastream_spark.sink.commit import summarize
    from durastream_spark.sink.messages import COMMITTED, DUPLICATE, NOTHING, PartResult

    rng = random.Random(18)
    for _ in range(200):
        results = [
            PartResult(
                f"s{rng.randrange(6)}",
                rng.randrange(4),
                rng.randrange(50),
                rng.randrange(900),
                rng.choice([COMMITTED, DUPLICATE, NOTHING]),
                rng.choice([None, "", f"{rng.randrange(10**6):016d}_{rng.randrange(99):08d}"]),
            )
            for _ in range(rng.randrange(0, 30))
        ]
        expected = []
        for stream in sorted({r.stream for r in results}):
            parts = [r for r in results if r.stream == stream]
            offsets = [p.next_offset for p in parts if p.next_offset]
            expected.append(
                (
                    stream,
                    sum(p.rows for p in parts),
                    sum(p.bytes for p in parts),
                    len(parts),
                    sum(p.outcome == COMMITTED for p in parts),
                    sum(p.outcome == DUPLICATE for p in parts),
                    max(offsets) if offsets else None,
                )
            )
        got = [
            (s.stream, s.rows, s.bytes, s.partitions, s.committed, s.duplicates, s.final_offset)
            for s in summarize(results)
        ]
        assert got == expected


def _answers(rng: random.Random) -> list[object]:
    """Part answers as a server might write them: the usual 200, duplicates, closed streams, other
    spellings and values, extra headers, errors and things that are not answers at all."""
    out: list[object] = []
    for _ in range(3000):
        headers: dict[str, object] = {}
        if rng.random() < 0.95:
            headers[rng.choice(["Stream-Next-Offset"] * 8 + ["stream-next-offset"])] = rng.choice(
                [f"{rng.randrange(10**6):016d}_{rng.randrange(99):08d}", "", 7]
            )
        if rng.random() < 0.9:
            headers["Cache-Control"] = "no-store"
        for name in ("Producer-Epoch", "Producer-Seq"):
            if rng.random() < 0.9:
                headers[rng.choice([name] * 8 + [name.upper()])] = rng.choice(
                    [str(rng.randrange(10**6))] * 6 + [" 3", "x", "\u00b2", "\u0663", None, 5]
                )
        if rng.random() < 0.1:
            headers["Stream-Closed"] = rng.choice(["true", "false"])
        if rng.random() < 0.05:
            headers["Durastream-Digest"] = rng.choice(["match", "unknown"])
        if rng.random() < 0.05:
            headers["Durastream-Txn-Messages"] = "4"
        answer: object = {"status": rng.choice([200] * 8 + [204, "200"]), "headers": headers}
        if rng.random() < 0.03:
            answer = {"status": 200}
        elif rng.random() < 0.03:  # a refused part: the general path makes its typed error
            answer["error"] = {"code": "STREAM_CLOSED", "message": "closed"}
        out.append(answer)
    return out


def test_plain_ok_reads_the_usual_answer_as_the_general_path_does() -> None:
    from durastream_spark.protocol.client import StreamClient
    from durastream_spark.protocol.models import Producer

    plain = 0
    for answer in _answers(random.Random(1618)):
        got = bulk._plain_ok(answer)
        if got is None:  # the general path reads it (as every answer before)
            continue
        assert "error" not in answer  # type: ignore[operator]
        plain += 1
        general = StreamClient._append_result(
            bulk._reply(None, answer),  # type: ignore[arg-type]
            Producer("p", 0, 0),
        )
        assert got == general, answer
    assert plain > 300  # the usual answer was common in the inputs
    assert bulk._plain_ok({"status": 204, "headers": {"Stream-Next-Offset": "1"}}) is None
    usual = {"Stream-Next-Offset": "1", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert bulk._plain_ok({"status": 200, "headers": usual}) is not None
    assert bulk._plain_ok({"status": 200, "error": {"code": "X"}, "headers": usual}) is None


def test_slices_cut_between_streams_within_a_request_s_limits(monkeypatch) -> None:
    monkeypatch.setattr(transactional, "MAX_ENTRIES", 3)
    monkeypatch.setattr(transactional, "MAX_BULK_PARTS", 7)
    monkeypatch.setattr(transactional, "MAX_BULK_BYTES", 40)
    rng = random.Random(1619)
    for _ in range(300):
        parts = sorted(
            (
                StreamPart(
                    f"s{rng.randrange(12)}",
                    1,
                    3,
                    0,
                    inline=os.urandom(rng.randrange(1, 20)) if rng.random() < 0.8 else None,
                    handles=() if rng.random() < 0.8 else ("h",),
                )
                for _ in range(rng.randrange(0, 40))
            ),
            key=lambda part: part.stream,
        )
        slices = transactional._stream_slices(parts)
        assert [i for first, last in slices for i in range(first, last)] == list(range(len(parts)))
        for first, last in slices:
            assert first < last
            if first:  # never between two parts of one stream
                assert parts[first - 1].stream != parts[first].stream
            # Within the limits, unless one stream alone exceeds them (then it travels alone).
            if len({part.stream for part in parts[first:last]}) > 1:
                without_last = [p for p in parts[first:last] if p.stream != parts[last - 1].stream]
                assert len({p.stream for p in without_last}) < 3
                assert len(without_last) < 7
                assert sum(len(p.inline or b"") for p in without_last) < 40


def test_slices_group_as_the_whole_batch_does() -> None:
    """The groups of each slice (with the batch's shape) are the batch's groups, in order: slicing
    changes which request an entry travels in, never the entry."""
    rng = random.Random(1620)
    for _ in range(300):
        jobs = sorted(_jobs(rng), key=lambda job: job[1].stream)
        whole = [(g.indexes, g.entry) for g in transactional._stream_groups(jobs)]
        shape = transactional._GroupShape.of(jobs)
        if shape is None:  # not the sink's shape: the commit sends no groups, sliced or not
            assert whole == []
            continue
        cut: list[tuple[tuple[int, ...], bulk.PartsEntry]] = []
        for first, last in transactional._stream_slices([part for _, part in jobs]):
            for group in transactional._stream_groups(jobs[first:last], shape):
                cut.append((tuple(first + i for i in group.indexes), group.entry))
        assert cut == whole
