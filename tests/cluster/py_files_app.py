"""The client side of ``test_py_files.py``: a Spark app whose only copy of the connector is a zip archive.

Usage: ``python py_files_app.py <archive.zip> <stream root> <work dir>`` with the archive both in
``spark.submit.pyFiles`` and on ``PYTHONPATH`` (the recipe of docs/deploy.md). Prints one line
``PY-FILES-RESULT {json}``.
"""

from __future__ import annotations

import json
import sys
import uuid


def main(archive: str, url: str, work: str) -> dict:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("durastream-py-files")
        .config("spark.submit.pyFiles", archive)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    import durastream_spark

    spark.dataSource.register(durastream_spark.DurableStreamDataSource)
    stream = f"py-files/{uuid.uuid4().hex[:10]}"
    rows = 300
    spark.range(rows).selectExpr("id", "cast(id % 3 as string) AS k").write.parquet(f"{work}/in")

    written = (
        spark.readStream.schema("id BIGINT, k STRING")
        .parquet(f"{work}/in")
        .writeStream.format("durastream")
        .option("url", url)
        .option("stream", stream)
        .option("checkpointLocation", f"{work}/chk-write")
        .trigger(availableNow=True)
        .start()
    )
    written.awaitTermination(300)
    read = (
        spark.readStream.format("durastream")
        .option("url", url)
        .option("streams", stream)
        .schema("id BIGINT, k STRING")
        .load()
        .writeStream.format("memory")
        .queryName("read_back")
        .option("checkpointLocation", f"{work}/chk-read")
        .trigger(availableNow=True)
        .start()
    )
    read.awaitTermination(300)
    back = spark.table("read_back")
    executor_module = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: __import__("durastream_spark").__file__)
        .collect()[0]
    )
    result = {
        "rows": rows,
        "read": back.count(),
        "distinct": back.select("id").distinct().count(),
        "driver_module": durastream_spark.__file__,
        "executor_module": executor_module,
    }
    spark.stop()
    return result


if __name__ == "__main__":
    sys.stdout.write("PY-FILES-RESULT " + json.dumps(main(*sys.argv[1:4])) + "\n")
    sys.stdout.flush()
