"""One Spark driver of the chaos soak (``bench/soak.py``), in its own process so the soak can SIGKILL it.

``python bench/soak_driver.py '<json config>'`` runs one streaming query until it is killed:

- ``"job": "ab"``: stream A -> durastream source -> tagging function (``mapInArrow``) -> [variant
  ``shuffle``: ``repartition(n, key)`` -> a second tagging function] -> durastream sink -> stream B.
  The tagging functions add to each JSON message the A offset it was read at (``ao``) and the task that
  handled it (``mt`` map side, ``rt`` reduce side: ``<driver run>.<stage>.<partition>``), which is what
  the soak's verifier uses to check the order of B. They are also where task failures are injected: on
  attempt 0 a seeded subset of tasks raises after passing on its first Arrow batch, while the soak's
  control file says so (``<control>/taskfail.json``). Each injected failure leaves a marker file.
- ``"job": "table"``: stream B -> durastream source -> Spark's parquet file sink (exactly once through
  its ``_spark_metadata`` log) with a checkpoint.

A failed query exits the process with status 3; the soak restarts it from its checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _tagger(field: str, run: int, control_dir: str, with_key: bool, seed: int):  # noqa: ANN202
    """A ``mapInArrow`` function: add ``ao`` (A offset, map side) and ``field`` (the task) to every
    message, and fail attempt 0 of a seeded subset of tasks while the control file asks for it."""

    def tag(batches):  # noqa: ANN001, ANN202
        import hashlib
        import json as _json
        import time

        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{run}.{ctx.stageId()}.{ctx.partitionId()}"
        fail = False
        if ctx.attemptNumber() == 0:
            try:
                with open(os.path.join(control_dir, "taskfail.json"), encoding="utf-8") as f:
                    control = _json.load(f)
            except (OSError, ValueError):
                control = {}
            if control and time.time() < float(control.get("until", 0)):
                digest = hashlib.sha256(f"{seed}:{field}:{task}".encode()).digest()
                fail = int.from_bytes(digest[:4], "big") % 1000 < float(control["rate"]) * 1000
        for batch in batches:
            values = batch.column("value").to_pylist()
            offsets = batch.column("offset").to_pylist() if field == "mt" else None
            out, keys = [], []
            for i, value in enumerate(values):
                message = _json.loads(value)
                if offsets is not None:
                    message["ao"] = offsets[i]
                message[field] = task
                keys.append(message["k"])
                out.append(_json.dumps(message, separators=(",", ":"), sort_keys=True).encode())
            arrays = [pa.array(out, pa.binary())]
            names = ["value"]
            if with_key:
                arrays.append(pa.array(keys, pa.string()))
                names.append("k")
            yield pa.RecordBatch.from_arrays(arrays, names=names)
            if fail and out:
                marker = os.path.join(control_dir, "taskfail-markers", f"{field}-{task}")
                with open(marker, "w", encoding="utf-8") as f:
                    f.write(str(time.time()))
                raise RuntimeError(f"soak: injected task failure ({field} task {task}, attempt 0)")

    return tag


def run_ab(spark, config: dict) -> object:  # noqa: ANN001
    from pyspark.sql import functions as F

    run, control, seed = config["run"], config["control_dir"], config["seed"]
    source = (
        spark.readStream.format("durastream")
        .option("url", config["url"])
        .option("streams", config["stream_a"])
        .option("maxMessagesPerTrigger", config["max_per_trigger"])
        .option("maxMessagesPerPartition", config["max_per_partition"])
        .load()
    )
    if config["variant"] == "shuffle":
        mapped = source.mapInArrow(
            _tagger("mt", run, control, True, seed), "value binary, k string"
        )
        frame = mapped.repartition(config["reducers"], F.col("k")).mapInArrow(
            _tagger("rt", run, control, False, seed), "value binary"
        )
    else:
        frame = source.mapInArrow(_tagger("mt", run, control, False, seed), "value binary")
    return (
        frame.writeStream.format("durastream")
        .queryName("soak-ab")
        .option("url", config["url"])
        .option("stream", config["stream_b"])
        .option("exactlyOnce", "transactional")
        .option("maxMessagesPerRequest", "150")
        .option("requestTimeoutMs", "20000")
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime=config["trigger"])
        .start()
    )


def run_table(spark, config: dict) -> object:  # noqa: ANN001
    source = (
        spark.readStream.format("durastream")
        .option("url", config["url"])
        .option("streams", config["stream_b"])
        .option("maxMessagesPerTrigger", config["max_per_trigger"])
        .option("requestTimeoutMs", "20000")
        .load()
    )
    return (
        source.select("offset", "value")
        .writeStream.format("parquet")
        .queryName("soak-table")
        .option("path", config["table"])
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime=config["trigger"])
        .start()
    )


def main() -> int:
    began = time.monotonic()

    def since() -> float:
        return time.monotonic() - began

    config = json.loads(sys.argv[1])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from durastream_spark import DurableStreamDataSource

    spark = (
        SparkSession.builder.master("local[2,4]")  # 4 attempts per task: task retries exist
        .appName(f"durastream-soak-{config['job']}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(config.get("reducers", 2)))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "768m")
        .config("spark.sql.streaming.minBatchesToRetain", "1000")  # the verifier reads offsets/
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(DurableStreamDataSource)
    print(
        f"soak driver {config['job']} run {config['run']}: session after {since():.1f}s", flush=True
    )
    query = run_ab(spark, config) if config["job"] == "ab" else run_table(spark, config)
    print(
        f"soak driver {config['job']} run {config['run']}: started after {since():.1f}s", flush=True
    )
    try:
        query.awaitTermination()
    except Exception as error:  # the query failed (e.g. retries exhausted): the soak restarts us
        print(f"soak driver {config['job']}: query failed: {error}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
