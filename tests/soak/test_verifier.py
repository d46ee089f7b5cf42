"""The soak's verifier must see what it is there to see: a lost, a duplicated, a reordered or a corrupted
message each fail it (fast, no Spark, no server: synthetic A/B/table contents)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import soak_verify  # noqa: E402
from soak_verify import Report, check_b_order, digest  # noqa: E402


def _offset(i: int) -> str:
    return f"0000000000000000_{i:016d}"


def _a_message(p: str, n: int) -> bytes:
    pad = "x" * (n % 7)
    return json.dumps(
        {"p": p, "n": n, "k": f"k{n % 3}", "pad": pad, "d": digest(p, n, f"k{n % 3}", pad)},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()


class _Tail:
    def __init__(self, messages: list[tuple[str, bytes]]) -> None:
        self.messages = messages
        self.rows = messages

    def poll(self) -> int:
        return 0


def _pipeline(n: int = 40) -> tuple[list, list, list[str]]:
    """A: 2 producers interleaved; B: two batches, each two sink tasks over contiguous A ranges."""
    a = [(_offset(i * 100), _a_message(f"p{i % 2}", i // 2)) for i in range(n)]
    ends = [_offset(20 * 100), _offset(n * 100)]
    b = []
    for batch_start, batch_end in ((0, 20), (20, n)):
        middle = (batch_start + batch_end) // 2
        # the second task of the batch is committed first: allowed
        for task, (lo, hi) in enumerate(((middle, batch_end), (batch_start, middle))):
            for i in range(lo, hi):
                message = json.loads(a[i][1])
                message["ao"] = a[i][0]
                message["mt"] = f"1.{batch_start}.{task}"
                b.append(json.dumps(message, sort_keys=True).encode())
    b_rows = [(_offset(j * 1000), v) for j, v in enumerate(b)]
    return a, b_rows, ends


def _verify(monkeypatch: pytest.MonkeyPatch, a, b, table, ends) -> Report:  # noqa: ANN001
    monkeypatch.setattr(soak_verify, "batch_ends", lambda *_: ends)
    acked = {"p0": 20, "p1": 20}
    return soak_verify.verify(
        "http://unused",
        "a",
        "b",
        Path("unused"),
        Path("unused"),
        acked,
        "plain",
        tails=(_Tail(a), _Tail(b), _Tail(table)),  # type: ignore[arg-type]
    )


def test_a_clean_pipeline_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, ends = _pipeline()
    report = _verify(monkeypatch, a, b, list(b), ends)
    assert report.passed, report.problems
    assert report.messages_in == report.out == 40
    assert report.detail["B_order"]["sink_tasks"] == 4


def test_lost_duplicated_reordered_and_corrupted_messages_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, ends = _pipeline()
    report = _verify(monkeypatch, a, b, b[:-1], ends)  # the table lost one
    assert not report.passed and report.lost == 1

    report = _verify(monkeypatch, a, [*b, b[3]], [*b, b[3]], ends)  # B duplicated one
    assert not report.passed and report.duplicated >= 1

    swapped = list(b)
    swapped[1], swapped[2] = swapped[2], swapped[1]  # A order broken inside a sink task
    report = _verify(monkeypatch, a, swapped, swapped, ends)
    assert any("a_order_broken_within_task" in p for p in report.problems)

    late = b[5:] + b[:5]  # batch 0's rows after batch 1's
    report = _verify(monkeypatch, a, late, late, ends)
    assert any("batch_went_backwards" in p for p in report.problems)

    offset, value = b[7]
    corrupt = list(b)
    tampered = json.loads(value)
    tampered["pad"] += "!"
    corrupt[7] = (offset, json.dumps(tampered).encode())
    report = _verify(monkeypatch, a, corrupt, corrupt, ends)
    assert any("digest" in p for p in report.problems)


def test_sink_tasks_must_be_contiguous() -> None:
    messages = [
        {"ao": _offset(1), "mt": "t1"},
        {"ao": _offset(5), "mt": "t2"},
        {"ao": _offset(2), "mt": "t1"},
    ]
    report = Report()
    check_b_order(messages, [_offset(10)], "plain", report)
    assert any("sink_task_not_contiguous" in p for p in report.problems)
