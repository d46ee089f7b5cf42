"""What a user sees when something is wrong: through Spark, the connector's sentence comes first.

Spark wraps a Python data source's exception (``[PYTHON_DATA_SOURCE_ERROR] Failed to ...:``, or
``An exception was thrown from the Python worker:`` from a task); right after that prefix, on the first or
second line, the user reads the connector's error type and a sentence naming the problem and the fix,
with no Python traceback and no exception chain (``durastream_spark.boundary``).
"""

from __future__ import annotations

import time
import uuid

import pytest

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from tests.support.server_process import free_port

# Spark's message around ours stays short: the issue saw 8,236 characters for one refused connection.
MAX_MESSAGE = 1500


def connector_line(error: BaseException) -> str:
    """The line the user reads first that is ours: ``<module>.<Type>: <message>``."""
    text = str(error)
    assert "Traceback" not in text, text
    assert len(text) < MAX_MESSAGE, text
    # Spark 4.0 opens a task's error with a blank line and its own one-line preamble.
    for line in [line for line in text.splitlines() if line.strip()][:2]:
        if "durastream_spark." in line:
            return line[line.index("durastream_spark.") :]
    raise AssertionError(
        f"the connector's message is not on the first two non-blank lines:\n{text}"
    )


def failure(action) -> BaseException:
    with pytest.raises(Exception) as caught:
        action()
    return caught.value


def root_of(server) -> str:
    return server.base_url + "/v1/stream"


def test_a_kafka_option_names_ours(spark) -> None:
    error = failure(
        lambda: (
            spark.readStream.format("durastream")
            .option("url", "http://127.0.0.1:4437/v1/stream")
            .option("subscribe", "events")
            .load()
        )
    )
    assert connector_line(error) == (
        "durastream_spark.errors.OptionError: Option 'subscribe' is Spark's Kafka connector's; here "
        "it is 'streams' (comma-separated stream paths relative to 'url'): "
        '.option("streams", "events").'
    )


def test_a_bad_sink_option_names_option_value_and_what_is_accepted(
    spark, durastream_server
) -> None:
    error = failure(
        lambda: (
            spark.range(3)
            .write.format("durastream")
            .option("url", root_of(durastream_server))
            .option("stream", "errors/sink")
            .option("maxBytesPerRequest", "4 megabytes")
            .mode("append")
            .save()
        )
    )
    assert connector_line(error).startswith(
        "durastream_spark.errors.OptionError: Option 'maxBytesPerRequest' has an invalid value "
        "'4 megabytes'. Accepted: a byte size from 1024 to 1073741824: "
    )


def test_a_wrong_port_says_the_server_is_not_answering(spark) -> None:
    origin = f"http://127.0.0.1:{free_port()}"
    error = failure(
        lambda: (
            spark.read.format("durastream")
            .option("url", origin + "/v1/stream")
            .option("streams", "events")
            .option("retry.maxElapsedMs", "1s")
            .load()
            .count()
        )
    )
    assert connector_line(error).startswith(
        f"durastream_spark.errors.TransportError: The server at {origin} is not answering "
        "(is it running? is the port right?): connection refused (HEAD stream 'events'; "
    )


def test_a_url_without_the_stream_root_suggests_it(spark, durastream_server) -> None:
    base = durastream_server.base_url
    error = failure(
        lambda: (
            spark.read.format("durastream")
            .option("url", base)
            .option("streams", "events")
            .load()
            .count()
        )
    )
    assert connector_line(error) == (
        "durastream_spark.source.batch.StreamsNotFound: Stream(s) 'events' (option 'streams') do not "
        f"exist under {base}: option 'url' ({base}) does not look like a stream root; "
        f'durastream-server serves streams under /v1/stream, so use .option("url", "{base}/v1/stream").'
    )


def test_a_schema_mismatch_names_column_type_stream_and_offset(spark, durastream_server) -> None:
    path = f"errors/orders-{uuid.uuid4().hex[:8]}"
    client = StreamClient(ConnectionOptions.parse({"url": root_of(durastream_server)}))
    client.create(path)
    client.append(path, b'[{"id": 1}]', "application/json", producer=("errors-test", 0, 0))
    bad = client.append(
        path, b'[{"id": "seven"}]', "application/json", producer=("errors-test", 0, 1)
    )
    offset = client.lookup_limit(path, "-1", max_messages=1).end  # the second message's offset
    assert offset < bad.next_offset
    error = failure(
        lambda: (
            spark.read.format("durastream")
            .option("url", root_of(durastream_server))
            .option("streams", path)
            .schema("id INT")
            .load()
            .collect()
        )
    )
    assert connector_line(error) == (
        f"durastream_spark.source.arrow.SchemaMismatch: Stream '{path}': the message at offset "
        f'{offset} does not fit column \'id\' INT of the query\'s schema: it has "id": "seven" (a JSON '
        "string). Fix the producer, or give 'id' a type that fits in .schema(...) (or read the raw "
        "message as '_value BINARY' and parse it with from_json)."
    )


def test_a_server_stopped_mid_query_fails_the_query_in_one_sentence(
    spark, server_factory, tmp_path
) -> None:
    server = server_factory()
    path = f"errors/live-{uuid.uuid4().hex[:8]}"
    client = StreamClient(ConnectionOptions.parse({"url": root_of(server)}))
    client.create(path)
    client.append(path, b'[{"id": 1}]', "application/json", producer=("errors-live", 0, 0))
    query = (
        spark.readStream.format("durastream")
        .option("url", root_of(server))
        .option("streams", path)
        .option("retry.maxElapsedMs", "2s")
        .load()
        .writeStream.format("memory")
        .queryName(f"errors_live_{uuid.uuid4().hex[:8]}")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 300
        while not query.recentProgress or query.recentProgress[-1]["numInputRows"] == 0:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.2)
        server.terminate()
        while query.isActive:
            assert time.monotonic() < deadline, "the query did not fail after the server stopped"
            time.sleep(0.2)
        error = query.exception()
    finally:
        query.stop()
    assert error is not None
    assert connector_line(error).startswith(
        f"durastream_spark.errors.TransportError: The server at {server.base_url} is not answering "
        "(is it running? is the port right?): connection refused ("
    )
