"""Issue 19 (connector): each micro-batch's figures reach a ``StreamingQueryListener`` in the user's process.

A real streaming query (durastream source -> durastream sink, option ``batchFiguresPath`` on both) with a
real listener that calls ``durastream_spark.figures.for_batch`` in ``onQueryProgress``: the dicts it collects
must match each batch as Spark reports it (rows, streams, mode), and a batch replayed after a restart is
recorded twice, the replay's figures winning.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pyspark.sql.streaming import StreamingQueryListener

from durastream_spark import figures
from durastream_spark.compat import HAS_ADMISSION_CONTROL
from durastream_spark.errors import OptionError
from tests.spark.sink.support import read_stream
from tests.spark.source.support import Streams, docs, unique
from tests.support.http import poll_until

SOURCES = ("a", "b")
ROWS = 50


class FiguresListener(StreamingQueryListener):
    """What a notebook would write: the figures of every batch of one query, by batch id."""

    def __init__(self, path: Path, query_name: str) -> None:
        self.path = path
        self.query_name = query_name
        self.found: dict[int, list[dict]] = {}  # batch id -> for_batch's answer, once per progress
        self.lock = threading.Lock()
        self.errors: list[str] = []  # a callback's exception is lost in py4j: kept for the test

    def onQueryStarted(self, event) -> None:  # noqa: N802 (Spark's names)
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        progress = event.progress
        if progress.name != self.query_name:
            return
        try:
            found = figures.for_batch(self.path, progress)
        except Exception as error:
            self.errors.append(repr(error))
            raise
        with self.lock:
            self.found.setdefault(progress.batchId, []).append(found)

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass


def _start(spark, root: str, base: str, checkpoint: Path, figures_dir: Path, name: str):
    reader = (
        spark.readStream.format("durastream")
        .option("url", root)
        .option("pattern", f"{base}/src/*")
        .option("batchFiguresPath", str(figures_dir))
    )
    if HAS_ADMISSION_CONTROL:  # several batches; Spark 4.0/4.1 refuse per-trigger limits
        reader = reader.option("maxMessagesPerTrigger", "40")
    return (
        reader.load()
        .writeStream.format("durastream")
        .queryName(name)
        .option("url", root)
        .option("stream", f"{base}/copy")
        .option("exactlyOnce", "transactional")
        .option("batchFiguresPath", str(figures_dir))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_a_listener_gets_each_batchs_figures_as_dicts(spark, durastream_server, tmp_path) -> None:
    streams = Streams(durastream_server)
    base = unique("figures-listener")
    for name in SOURCES:
        streams.create(f"{base}/src/{name}")
        streams.append_json(f"{base}/src/{name}", docs(0, ROWS, src=name))
    figures_dir, checkpoint = tmp_path / "figures", tmp_path / "chk"
    name = base.replace("-", "_")
    listener = FiguresListener(figures_dir, name)
    spark.streams.addListener(listener)
    try:
        query = _start(spark, streams.url, base, checkpoint, figures_dir, name)
        query.awaitTermination()
        assert query.exception() is None
        batches = {p["batchId"]: p for p in query.recentProgress if p["numInputRows"]}
        assert sum(p["numInputRows"] for p in batches.values()) == ROWS * len(SOURCES)
        if HAS_ADMISSION_CONTROL:
            assert len(batches) >= 3, "40 messages per trigger: at least three batches"
        poll_until(
            lambda: all(b in listener.found for b in batches) or listener.errors,
            "the listener saw every batch",
            timeout=60,
        )
        assert not listener.errors
        for batch_id, progress in batches.items():
            (found,) = listener.found[batch_id]
            assert (found["batchId"], found["queryId"]) == (batch_id, str(query.id))
            sink = found["sink"]
            assert sink["batch"] == str(batch_id) and sink["mode"] == "transactional"
            assert sink["rows"] == progress["numInputRows"] and sink["streams"] == 1
            assert sink["bytes"] > 0 and sink["commit_requests"] >= 1 and sink["recorded"] == 1
            (source,) = found["source"]
            # Offsets as recentProgress shows them (PySpark 4.0: Python reprs, 'None' at first;
            # later versions: "null" at first).
            start_text = progress["sources"][0]["startOffset"]
            start = (
                {} if start_text in (None, "None") else figures.offset_document(start_text) or {}
            )
            end = figures.offset_document(progress["sources"][0]["endOffset"])
            assert figures.for_batch(figures_dir, progress)["source"] == [source]
            moved = [path for path in end if path.startswith(base) and start.get(path) != end[path]]
            assert source["streams"] == len(moved) and source["tasks"] >= 1
            assert source["recorded"] == 1
            if HAS_ADMISSION_CONTROL:  # measured by the limit lookups
                assert source["messages"] == progress["numInputRows"]
                assert source["behind"]["messages"] >= 0
        assert len(read_stream(streams.url, f"{base}/copy")) == ROWS * len(SOURCES)

        # A replay: the last batch's commit is forgotten, so the restarted query runs it again.
        last = max(batches)
        for entry in (str(last), f".{last}.crc"):  # the commit and Hadoop's checksum of it
            (checkpoint / "commits" / entry).unlink(missing_ok=True)
        query = _start(spark, streams.url, base, checkpoint, figures_dir, name)
        query.awaitTermination()
        assert query.exception() is None
        replayed = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]
        assert replayed == [last], f"the restarted query replays batch {last}: {replayed}"
        poll_until(
            lambda: len(listener.found.get(last, ())) == 2 or listener.errors,
            "the replay's progress",
            timeout=60,
        )
        assert not listener.errors
        replay = listener.found[last][1]
        assert replay["sink"]["recorded"] == 2 and replay["source"][0]["recorded"] == 2
        assert replay["sink"]["rows"] == batches[last]["numInputRows"]
        assert len(read_stream(streams.url, f"{base}/copy")) == ROWS * len(SOURCES), (
            "the replay wrote nothing twice"
        )
    finally:
        spark.streams.removeListener(listener)

    # Everything recorded, oldest first, for a look after the query ended.
    sink_records = figures.records(figures_dir, "sink")
    assert [r["batchId"] for r in sink_records] == [*sorted(batches), last]
    assert sum(r["figures"]["rows"] for r in sink_records[:-1]) == ROWS * len(SOURCES)


def test_without_the_option_nothing_is_recorded(spark, durastream_server, tmp_path) -> None:
    """Unused, the channel costs nothing: no file anywhere, and for_batch finds nothing."""
    streams = Streams(durastream_server)
    base = unique("figures-off")
    streams.create(f"{base}/src/a")
    streams.append_json(f"{base}/src/a", docs(0, 10))
    query = (
        spark.readStream.format("durastream")
        .option("url", streams.url)
        .option("pattern", f"{base}/src/*")
        .load()
        .writeStream.format("durastream")
        .option("url", streams.url)
        .option("stream", f"{base}/copy")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    assert len(read_stream(streams.url, f"{base}/copy")) == 10
    found = figures.for_batch(tmp_path, query.lastProgress)
    assert found["source"] == [] and found["sink"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chk"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("dbfs:/figures", "driver's local file system"),
        ("s3://bucket/figures", "driver's local file system"),
        ("figures/q1", "relative path"),
        ("", "empty value"),
    ],
)
def test_bad_paths_are_refused_naming_the_option(spark, value, reason) -> None:
    from durastream_spark.sink.options import SinkOptions
    from durastream_spark.source.options import SourceOptions

    for parse, extra in ((SourceOptions.parse, {"streams": "s"}), (SinkOptions.parse, {})):
        with pytest.raises(OptionError, match=reason) as caught:
            parse({"url": "http://127.0.0.1:1/v1/stream", "batchFiguresPath": value, **extra})
        assert caught.value.option == "batchFiguresPath"
        assert "absolute directory on the driver" in str(caught.value)


def test_a_file_is_refused_and_file_urls_are_accepted(tmp_path) -> None:
    from durastream_spark.sink.options import SinkOptions

    a_file = tmp_path / "taken"
    a_file.write_text("")
    with pytest.raises(OptionError, match="it is a file"):
        SinkOptions.parse({"url": "http://h/v1/stream", "batchFiguresPath": str(a_file)})
    parsed = SinkOptions.parse(
        {"url": "http://h/v1/stream", "batchFiguresPath": f"file://{tmp_path}"}
    )
    assert parsed.figures.directory == str(tmp_path)


def test_batch_reads_and_writes_refuse_the_option(spark, durastream_server, tmp_path) -> None:
    streams = Streams(durastream_server)
    path = streams.create(unique("figures-batch"))
    with pytest.raises(Exception, match="batchFiguresPath.*spark.readStream / df.writeStream"):
        (
            spark.read.format("durastream")
            .option("url", streams.url)
            .option("streams", path)
            .option("batchFiguresPath", str(tmp_path))
            .load()
            .collect()
        )
    with pytest.raises(Exception, match="batchFiguresPath.*spark.readStream / df.writeStream"):
        (
            spark.range(3)
            .selectExpr("CAST(id AS STRING) AS value")
            .write.format("durastream")
            .mode("append")
            .option("url", streams.url)
            .option("stream", path)
            .option("batchFiguresPath", str(tmp_path))
            .save()
        )
