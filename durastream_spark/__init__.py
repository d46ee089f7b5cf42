"""durastream-spark: Apache Spark source and sink for Durable Streams (format ``durastream``).

    from durastream_spark import DurableStreamDataSource
    spark.dataSource.register(DurableStreamDataSource)
    df = spark.readStream.format("durastream").option("url", ...).option("streams", "events").load()

``source/`` maps stream offsets to replay-deterministic micro-batch offsets; ``sink/`` writes each
partition as an idempotent producer so retries and restarts never duplicate or lose data.
"""

# Defined before the import below: the protocol client (imported through it) reads the version for its
# User-Agent, and would otherwise find a partially initialised package.
__version__ = "0.1.0"

from durastream_spark.datasource import DurableStreamDataSource  # noqa: E402

__all__ = ["DurableStreamDataSource"]
