"""durastream-spark: Apache Spark source and sink for Durable Streams (format ``durastream``).

    from durastream_spark import DurableStreamDataSource
    spark.dataSource.register(DurableStreamDataSource)
    df = spark.readStream.format("durastream").option("url", ...).option("streams", "events").load()

``source/`` maps stream offsets to replay-deterministic micro-batch offsets; ``sink/`` writes each
partition as an idempotent producer so retries and restarts never duplicate or lose data.
"""

from durastream_spark.datasource import DurableStreamDataSource

__all__ = ["DurableStreamDataSource"]
__version__ = "0.1.0"
