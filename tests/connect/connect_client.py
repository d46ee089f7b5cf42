"""The Spark Connect client side of ``test_spark_connect.py``, run as its own process.

Usage: ``python -m tests.connect.connect_client sc://127.0.0.1:<port> <stream root> <work dir>``.

It connects to a Spark Connect server, registers the ``durastream`` source through the Connect session
and uses it the way a notebook on Databricks serverless would. Each step records what it saw (or the
error it got) and the next step still runs, so one broken feature does not hide the others; the result
is printed as one JSON line (the last line of stdout) for the test to check.

A separate process, because the test process may already hold a classic SparkSession (the shared
``spark`` fixture): a Connect client beside it would share PySpark's process-wide session state.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

RESULT_MARKER = "CONNECT-RESULT "

SCHEMA = "id BIGINT, kind STRING, amount DOUBLE"


def main(remote: str, root: str, work_dir: str) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from durastream_spark import DurableStreamDataSource
    from durastream_spark.compat import HAS_ADMISSION_CONTROL

    results: dict[str, Any] = {"has_admission_control": HAS_ADMISSION_CONTROL}
    run = uuid.uuid4().hex[:8]
    source_stream, copy_stream = f"connect/{run}/source", f"connect/{run}/copy"
    conn = {"url": root}

    def step(name: str, body: Callable[[], dict[str, Any]]) -> None:
        started = time.monotonic()
        try:
            outcome = {"ok": True, **body()}
        except Exception as exc:  # recorded, not raised: the test reports which step failed and why
            outcome = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}"[:4000],
                "traceback": traceback.format_exc()[-4000:],
            }
        outcome["seconds"] = round(time.monotonic() - started, 1)
        results[name] = outcome

    spark = SparkSession.builder.remote(remote).getOrCreate()
    try:
        step(
            "session",
            lambda: {
                "class": f"{type(spark).__module__}.{type(spark).__name__}",
                "version": spark.version,
            },
        )

        def register() -> dict[str, Any]:
            spark.dataSource.register(DurableStreamDataSource)
            return {}

        step("register", register)

        def batch_write() -> dict[str, Any]:
            rows = spark.range(0, 100, 1, 2).selectExpr(
                "id", "CONCAT('k', id % 3) AS kind", "id * 1.5 AS amount"
            )
            rows.write.format("durastream").options(**conn).option("stream", source_stream).mode(
                "append"
            ).save()
            return {}

        step("batch_write", batch_write)

        def batch_read() -> dict[str, Any]:
            raw = spark.read.format("durastream").options(**conn).option("streams", source_stream)
            df = raw.load()
            first = df.orderBy("offset").first()
            return {
                "columns": df.columns,
                "count": df.count(),
                "first_value": json.loads(bytes(first["value"])) if first else None,
            }

        step("batch_read", batch_read)

        def typed_read() -> dict[str, Any]:
            df = (
                spark.read.format("durastream")
                .options(**conn)
                .option("streams", source_stream)
                .schema(SCHEMA + ", _offset STRING")
                .load()
            )
            agg = df.agg(
                F.count("*").alias("rows"),
                F.countDistinct("id").alias("ids"),
                F.sum("id").alias("id_sum"),
                F.sum("amount").alias("amount_sum"),
            ).first()
            return {"schema": df.schema.simpleString(), **agg.asDict()}

        step("typed_read", typed_read)

        def streaming() -> dict[str, Any]:
            reader = (
                spark.readStream.format("durastream")
                .options(**conn)
                .option("streams", source_stream)
                .schema(SCHEMA)
            )
            if HAS_ADMISSION_CONTROL:
                reader = reader.option("maxMessagesPerTrigger", 40)
            query = (
                reader.load()
                .writeStream.format("durastream")
                .options(**conn)
                .option("stream", copy_stream)
                .option("checkpointLocation", f"{work_dir}/checkpoints/{run}")
                .trigger(availableNow=True)
                .start()
            )
            finished = query.awaitTermination(300)
            recent = query.recentProgress
            last = query.lastProgress
            copy = (
                spark.read.format("durastream")
                .options(**conn)
                .option("streams", copy_stream)
                .schema(SCHEMA)
                .load()
            )
            agg = copy.agg(F.count("*").alias("rows"), F.countDistinct("id").alias("ids")).first()
            return {
                "finished": finished,
                "exception": str(query.exception()) if query.exception() else None,
                "recent_progress_count": len(recent),
                # progress["numInputRows"] is None over Connect (the server's progress JSON has no
                # top-level count); the sources' counts are there.
                "top_level_num_input_rows": [p["numInputRows"] for p in recent],
                "progress_batches": [
                    rows
                    for rows in (sum(s["numInputRows"] for s in p["sources"]) for p in recent)
                    if rows
                ],
                "last_progress": None if last is None else last.json,
                **agg.asDict(),
            }

        step("streaming", streaming)

        def option_error() -> dict[str, Any]:
            bad = (
                spark.read.format("durastream")
                .options(**conn)
                .option("streams", source_stream)
                .option("maxMessagesPerTrgger", "10")
            )
            try:
                bad.load().count()
            except Exception as exc:
                return {"message": str(exc)[:100_000], "type": type(exc).__name__}
            return {"message": None}

        step("option_error", option_error)

        # The notebooks, as on Databricks serverless: every cell, with the Connect session as `spark`.
        from tests.notebooks import runner
        from tests.notebooks.test_notebooks import CHECKED_VARIABLES, NOTEBOOK_DIR

        os.environ.update(DURASTREAM_URL=root, DURASTREAM_STREAM_PREFIX=f"connect/{run}/notebooks")
        os.environ.pop("DURASTREAM_AUTH_HEADER", None)
        for name, variables in CHECKED_VARIABLES.items():

            def notebook(name: str = name, variables: tuple[str, ...] = variables) -> dict:
                notebook_dir = os.path.join(work_dir, "notebooks", name.removesuffix(".py"))
                os.makedirs(notebook_dir)
                os.environ["DURASTREAM_WORK_DIR"] = notebook_dir
                namespace: dict[str, Any] = {"__name__": "__notebook__", "spark": spark}
                runner.run(NOTEBOOK_DIR / name, namespace)
                active = [q.id for q in spark.streams.active]
                return {"variables": {v: namespace[v] for v in variables}, "active": active}

            step(f"notebook {name}", notebook)
    finally:
        spark.stop()
    return results


if __name__ == "__main__":
    outcome = main(*sys.argv[1:4])
    sys.stdout.write(RESULT_MARKER + json.dumps(outcome, default=str) + "\n")
    sys.stdout.flush()
