"""``durastream_spark.figures``: the records the source and the sink append, found again by batch."""

from __future__ import annotations

import json

from durastream_spark import figures
from durastream_spark.figures import FiguresOptions, record_sink, record_source

QUERY = "5b4f1f0e-0000-4000-8000-000000000001"


def _progress(batch_id: int, *ends: dict | str) -> dict:
    """A progress as ``query.lastProgress`` gives it: offsets as JSON text."""
    return {
        "id": QUERY,
        "batchId": batch_id,
        "sources": [{"endOffset": e if isinstance(e, str) else json.dumps(e)} for e in ends],
    }


def test_records_are_found_by_query_batch_and_end_offset(tmp_path) -> None:
    options = FiguresOptions(str(tmp_path / "q"))
    end_a, end_b = {"s/a": "0000_0010", "s/b": "0000_0004"}, {"t": "0000_0002"}
    record_source(options, end_a, {"streams": 2, "tasks": 2})
    record_source(options, end_b, {"streams": 1, "tasks": 1})
    record_sink(options, QUERY, 7, {"rows": 16, "mode": "ordered"})
    record_sink(options, "another-query", 7, {"rows": 99, "mode": "ordered"})
    # Spark's text of the offset: other key order and spacing than the reader's dict.
    spark_text = '{"s/b": "0000_0004",  "s/a": "0000_0010"}'
    found = figures.for_batch(tmp_path / "q", _progress(7, end_b, spark_text, "not json"))
    assert found["queryId"] == QUERY and found["batchId"] == 7
    assert [s["streams"] for s in found["source"]] == [1, 2]  # in the order of progress.sources
    assert found["sink"] == {"rows": 16, "mode": "ordered", "recorded": 1}
    # PySpark 4.0's query.lastProgress shows offsets as Python reprs of the parsed JSON.
    as_repr = {"id": QUERY, "batchId": 7, "sources": [{"endOffset": repr(end_a)}]}
    assert [s["streams"] for s in figures.for_batch(tmp_path / "q", as_repr)["source"]] == [2]
    assert figures.for_batch(tmp_path / "q", _progress(8, {"x": "1"})) == {
        "queryId": QUERY,
        "batchId": 8,
        "source": [],
        "sink": None,
    }


def test_a_replayed_batch_counts_its_records_and_the_last_wins(tmp_path) -> None:
    options = FiguresOptions(str(tmp_path))
    record_sink(options, QUERY, 3, {"rows": 5, "commit_ms": 1.0})
    record_sink(options, QUERY, 31, {"rows": 8})  # a batch id with the same leading digit
    record_sink(options, QUERY, 3, {"rows": 5, "commit_ms": 2.0})
    assert figures.for_batch(tmp_path, _progress(3))["sink"] == {
        "rows": 5,
        "commit_ms": 2.0,
        "recorded": 2,
    }
    assert figures.for_batch(tmp_path, _progress(31))["sink"]["recorded"] == 1


def test_files_rotate_and_stay_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(figures, "MAX_FILE_BYTES", 2_000)
    options = FiguresOptions(str(tmp_path))
    for batch in range(200):
        record_sink(options, QUERY, batch, {"rows": batch, "pad": "x" * 50})
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["sink.jsonl", "sink.jsonl.1"]
    assert all(p.stat().st_size <= 2_000 + 200 for p in tmp_path.iterdir())
    assert figures.for_batch(tmp_path, _progress(199))["sink"]["rows"] == 199
    assert figures.for_batch(tmp_path, _progress(0))["sink"] is None  # rotated away
    kept = [r["batchId"] for r in figures.records(tmp_path, "sink")]
    assert kept == list(range(kept[0], 200)) and len(kept) > 10


def test_a_line_cut_short_is_skipped(tmp_path) -> None:
    options = FiguresOptions(str(tmp_path))
    record_sink(options, QUERY, 1, {"rows": 1})
    with open(tmp_path / "sink.jsonl", "a", encoding="utf-8") as fh:
        fh.write(f'{{"queryId":"{QUERY}","batchId":2,"recordedAtMs":1,"figu')  # a crash mid-write
    assert figures.for_batch(tmp_path, _progress(2))["sink"] is None
    assert figures.for_batch(tmp_path, _progress(1))["sink"]["rows"] == 1
    assert [r["batchId"] for r in figures.records(tmp_path, "sink")] == [1]


def test_an_unwritable_directory_warns_once_and_does_not_raise(tmp_path, caplog) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    options = FiguresOptions(str(blocked / "figures"))  # under a file: cannot be created
    log = figures.FiguresLog(str(blocked / "figures"), figures.SINK_FILE)
    log.append({"queryId": QUERY, "batchId": 1}, {"rows": 1})
    log.append({"queryId": QUERY, "batchId": 2}, {"rows": 1})
    warnings = [r for r in caplog.records if "batchFiguresPath" in r.getMessage()]
    assert len(warnings) == 1
    record_sink(options, QUERY, 3, {"rows": 1})  # raises nothing either
