"""The source against rakaia (``rakaia-streams``): a standard server with neither bounded reads nor forks.

A batch could then not be re-read identically after a failure (the base protocol cannot stop a read at an
offset, and rakaia's PUT ignores the fork headers that pin a range), so the source **refuses** every read
before reading anything, with an error naming the missing guarantee; it never reads past a batch's end.
``pattern`` (no listing, no section 6 subscriptions) and instants (no time lookup) are refused too, each
naming the server and what to do instead. The sink works in ordered mode (``tests/spark/sink``).
"""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from durastream_spark.errors import ExtensionNotSupported
from durastream_spark.source import batch_reader
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from tests.spark.source.support import (
    BatchCollector,
    Streams,
    docs,
    options_for,
    reader_of,
    run_available_now,
    unique,
)


@pytest.fixture
def streams(rakaia_server) -> Streams:
    return Streams(rakaia_server)


def test_streaming_and_batch_reads_are_refused_before_reading(
    spark, rakaia_server, streams, tmp_path
) -> None:
    path = streams.create(unique("rakaia"))
    streams.append_json(path, docs(0, 3))
    options = options_for(rakaia_server, streams=path)
    with pytest.raises(StreamingQueryException) as caught:
        run_available_now(spark, options, str(tmp_path / "chk"), BatchCollector())
    assert "re-read identically" in str(caught.value) and "fork" in str(caught.value)
    with pytest.raises(Exception, match="re-read identically"):
        reader_of(spark, options, stream=False).collect()


def test_patterns_and_instants_are_refused_naming_the_server(rakaia_server, streams) -> None:
    path = streams.create(unique("rakaia-opts"))
    with pytest.raises(ExtensionNotSupported) as caught:
        batch_reader(options_for(rakaia_server, pattern="x/*"), DEFAULT_SCHEMA).partitions()
    text = str(caught.value)
    assert rakaia_server.stream_root in text and "section 6" in text and "'streams'" in text
    with pytest.raises(ExtensionNotSupported, match="time-lookup"):
        batch_reader(
            options_for(rakaia_server, streams=path, startingTimestamp="0"), DEFAULT_SCHEMA
        ).partitions()
