"""Issue 15, item 5: rows go where the user said, never silently elsewhere.

The pipeline a new user writes first, copying streams with the durastream source and sink:
``readStream.format("durastream")...load().writeStream.format("durastream").option("stream", "ux/copy")``.
The source's default schema has a ``stream`` column (where each row was read from), and the sink used to
let that column win over the ``stream`` option: every row went back into the stream it came from, the
copy was never created, and a continuous query re-read its own output forever (11 KB grew to 3.4 MB in
288 batches). Now the option wins, as Kafka's ``topic`` option does over a ``topic`` column; and without
the option the source's own ``stream`` column is refused as a routing column (it would loop), while a
column derived from it routes.
"""

from __future__ import annotations

import json

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from tests.spark.sink.support import client_for, read_stream, unique

SOURCES = ("a", "b")
ROWS = 50


def _source(root: str, base: str) -> dict[str, list[dict]]:
    client = client_for(root)
    written = {}
    for name in SOURCES:
        path = f"{base}/src/{name}"
        client.create(path, "application/json")
        written[path] = [{"src": name, "i": i, "pad": "p" * 200} for i in range(ROWS)]
        for start in range(0, ROWS, 10):
            body = ",".join(_json(doc) for doc in written[path][start : start + 10])
            client.append(path, f"[{body}]".encode(), "application/json")
    return written


def _json(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"))


def _copy(spark, root: str, base: str, checkpoint, transform=None, **options: str):
    reader = (
        spark.readStream.format("durastream").option("url", root).option("pattern", f"{base}/src/*")
    )
    if HAS_ADMISSION_CONTROL:  # several batches; Spark 4.0/4.1 refuse per-trigger limits
        reader = reader.option("maxMessagesPerTrigger", "40")
    df = reader.load()
    if transform is not None:
        df = transform(df)
    writer = df.writeStream.format("durastream").option("url", root)
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


def test_copy_pipeline_writes_into_the_option_stream(sink_spark, durastream_server, tmp_path):
    root = durastream_server.base_url + "/v1/stream"
    base = unique("ux")
    written = _source(root, base)
    query = _copy(sink_spark, root, base, tmp_path / "chk", stream=f"{base}/copy")
    query.awaitTermination()
    assert query.exception() is None
    for path, docs in written.items():
        assert read_stream(root, path) == docs, "the source streams are unchanged"
    copied = read_stream(root, f"{base}/copy")
    assert sorted((d["src"], d["i"]) for d in copied) == sorted(
        (d["src"], d["i"]) for docs in written.values() for d in docs
    )
    for name in SOURCES:  # each source stream's rows keep their order in the copy
        assert [d["i"] for d in copied if d["src"] == name] == list(range(ROWS))
    # A second run finds nothing new: the copy did not feed the source.
    again = _copy(sink_spark, root, base, tmp_path / "chk", stream=f"{base}/copy")
    again.awaitTermination()
    assert len(read_stream(root, f"{base}/copy")) == len(copied)


def test_without_the_option_the_source_column_is_refused_and_a_derived_one_routes(
    sink_spark, durastream_server, tmp_path
):
    root = durastream_server.base_url + "/v1/stream"
    base = unique("ux-route")
    written = _source(root, base)
    refused = _copy(sink_spark, root, base, tmp_path / "refused")
    with pytest.raises(StreamingQueryException, match="back into its own source stream"):
        refused.awaitTermination()
    for path, docs in written.items():
        assert read_stream(root, path) == docs

    derived = _copy(
        sink_spark,
        root,
        base,
        tmp_path / "derived",
        transform=lambda df: df.withColumn(
            "stream", F.regexp_replace(F.col("stream"), "/src/", "/copy/")
        ),
    )
    derived.awaitTermination()
    assert derived.exception() is None
    for path, docs in written.items():
        assert read_stream(root, path.replace("/src/", "/copy/")) == docs
        assert read_stream(root, path) == docs
