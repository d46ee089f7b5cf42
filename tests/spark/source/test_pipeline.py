"""Stream A -> durastream source -> Spark -> durastream sink -> stream B, under task failures.

Every task fails on its first attempt after it has already passed some rows on to the sink, so Spark retries
it: the source must re-read exactly the same range and the sink must not write anything twice. B must end
up holding exactly the messages of A.
"""

from __future__ import annotations

import pytest
from pyspark.sql.functions import udf

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from durastream_spark.protocol.jsonarray import split_json_array
from tests.spark.source.support import (
    BatchCollector,
    Streams,
    docs,
    encoded,
    options_for,
    reader_of,
    unique,
)

_ROWS_SEEN: dict[tuple[int, int, int], int] = {}


def failing_identity(marker_dir: str):
    """Identity, except that a task's first attempt fails after it passed 40 rows on (to the sink).

    Each injected failure leaves a file in ``marker_dir``, so the test can check failures happened.
    """

    def identity(value):  # no type hints: Spark would try to infer a pandas UDF from them
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0:
            key = (context.stageId(), context.partitionId(), context.attemptNumber())
            _ROWS_SEEN[key] = _ROWS_SEEN.get(key, 0) + 1
            if _ROWS_SEEN[key] > 40:
                name = f"{marker_dir}/failed-{key[0]}-{key[1]}"
                with open(name, "w", encoding="utf-8") as marker:
                    marker.write("x")
                raise RuntimeError("injected task failure (first attempt)")
        return value

    return identity


def read_stream(streams: Streams, path: str) -> list[bytes]:
    messages: list[bytes] = []
    for chunk in streams.client.iter_range(path, "-1", None):
        messages += split_json_array(chunk.body)
    return messages


def test_a_to_b_exactly_once_under_task_failures(spark, durastream_server, tmp_path) -> None:
    streams = Streams(durastream_server)
    base = unique("pipeline")
    source, target = streams.create(f"{base}/a"), f"{base}/b"
    expected = []
    for first in range(0, 600, 100):
        batch = docs(first, 100, pad="z" * 200)
        streams.append_json(source, batch)
        expected += encoded(batch)

    markers = tmp_path / "failures"
    markers.mkdir()
    failing = udf(failing_identity(str(markers)), "binary", useArrow=False)
    # Spark >= 4.2: three micro-batches of at most 250 messages. Spark 4.0/4.1 have no per-trigger
    # limits for Python sources, so AvailableNow reads everything in one batch (of 10 tasks) there.
    limit = {"maxMessagesPerTrigger": 250} if HAS_ADMISSION_CONTROL else {}
    frame = reader_of(
        spark,
        options_for(durastream_server, streams=source, maxMessagesPerPartition=60, **limit),
    ).select(failing("value").alias("value"))
    query = (
        frame.writeStream.format("durastream")
        .option("url", streams.url)
        .option("stream", target)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(180)
    except Exception as error:  # the sink is developed in parallel (issue 4)
        if "not built yet" in str(error):
            pytest.skip("the durastream sink is not built yet")
        raise
    assert finished, "the pipeline did not finish"
    assert sorted(read_stream(streams, target)) == sorted(expected)
    assert len(list(markers.iterdir())) >= 3  # failures were injected (and retried)
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) == (3 if HAS_ADMISSION_CONTROL else 1)


def test_source_rows_feed_batches_in_offset_order(spark, durastream_server, tmp_path) -> None:
    """Within a stream, rows reach each batch in offset order (what an ordered sink relies on)."""
    streams = Streams(durastream_server)
    path = streams.create(unique("order"))
    streams.append_json(path, docs(0, 300))
    collector = BatchCollector()
    query = (
        reader_of(spark, options_for(durastream_server, streams=path, maxMessagesPerPartition=50))
        .writeStream.foreachBatch(collector)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    assert query.awaitTermination(120)
    assert [bytes(r["value"]) for r in collector.rows] == encoded(docs(0, 300))
