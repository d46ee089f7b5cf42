"""A streaming driver in its own process, for the driver-crash test (``test_driver_crash.py``).

``python -m tests.spark.sink.crash_driver '<json config>'`` starts its own SparkSession and one query per
target (named by its mode, or with a ``mode`` of its own), each writing ``rate-micro-batch`` rows to its
stream through the probing sink, whose commit of one batch blocks (before or after the real commit) until
the test SIGKILLs this whole process group.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    config = json.loads(sys.argv[1])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from tests.spark.sink.probe import ProbeDataSource

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("durastream-crash-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.authenticate.socketTimeout", "120s")  # as tests/conftest.py
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(ProbeDataSource)
    queries = []
    for mode, target in config["targets"].items():
        df = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", config["rows"])
            .option("numPartitions", 2)
            .load()
            .select(
                F.spark_partition_id().alias("p"),
                F.col("value").alias("n"),
                F.lit("c" * 500).alias("pad"),
            )
        )
        queries.append(
            df.writeStream.format("durastream_probe")
            .queryName(f"crash-{mode}")
            .option("url", config["url"])
            .option("stream", target["stream"])
            .option("exactlyOnce", target.get("mode", mode))
            .option("maxMessagesPerRequest", "30")
            .option("probe.block", config["block"])
            .option("probe.markers", target["markers"])
            .option("checkpointLocation", target["checkpoint"])
            .trigger(processingTime="0 seconds")
            .start()
        )
    for query in queries:
        query.awaitTermination()


if __name__ == "__main__":
    main()
