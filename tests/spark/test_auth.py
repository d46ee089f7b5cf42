"""Spark reads and writes against a server that requires bearer tokens, and the token never leaks.

The token is given as ``header.Authorization`` or through ``tokenFile``. Everything a user or operator may
see is captured and searched for it: Python logging on the driver (``caplog``, DEBUG), Spark's own log
(a log4j appender added to the JVM for the duration of the test), the exception text of failed jobs, the
query plans (what the Spark UI shows), streaming progress, and the server's log at DEBUG.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from tests.spark.source.support import BatchCollector, run_available_now

RW = "spark-rw-" + uuid.uuid4().hex
RO = "spark-ro-" + uuid.uuid4().hex
TENANT = "spark-tenant-" + uuid.uuid4().hex
WRONG = "spark-wrong-" + uuid.uuid4().hex
SECRETS = (RW, RO, TENANT, WRONG)


@pytest.fixture
def secured(server_factory, tmp_path: Path):
    tokens = tmp_path / "server-tokens"
    tokens.write_text(f"{RW} read-write\n{RO} read-only\n{TENANT} read-write tenant-a\n")
    tokens.chmod(0o600)
    return server_factory(extra_args=["--auth-token-file", str(tokens), "--log-level", "DEBUG"])


class SparkLog:
    """Spark's (log4j2) log lines while the test runs, through an in-memory appender on the root logger."""

    def __init__(self, spark: Any) -> None:
        jvm = spark._jvm
        log4j = jvm.org.apache.logging.log4j
        self._context = log4j.LogManager.getContext(False)
        self._writer = jvm.java.io.StringWriter()
        layout = log4j.core.layout.PatternLayout.createDefaultLayout()
        self._appender = log4j.core.appender.WriterAppender.createAppender(
            layout, None, self._writer, f"durastream-auth-{uuid.uuid4().hex}", False, True
        )
        self._appender.start()
        self._root = self._context.getConfiguration().getRootLogger()
        self._root.addAppender(self._appender, log4j.Level.ALL, None)
        self._context.updateLoggers()

    def text(self) -> str:
        return str(self._writer.toString())

    def close(self) -> None:
        self._root.removeAppender(self._appender.getName())
        self._context.updateLoggers()
        self._appender.stop()


@pytest.fixture
def spark_log(spark) -> Iterator[SparkLog]:
    log = SparkLog(spark)
    try:
        yield log
    finally:
        log.close()


def _server_output(server) -> str:
    lines = server.log_path.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if not line.startswith("=== start "))


def _plan(frame: Any) -> str:
    return str(frame._jdf.queryExecution().toString())


def _write(frame: Any, root: str, stream: str, **options: str) -> None:
    writer = frame.write.format("durastream").option("url", root).option("stream", stream)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def _read(spark: Any, root: str, streams: str, **options: str) -> Any:
    reader = spark.read.format("durastream").option("url", root).option("streams", streams)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_tokens_work_and_never_leak(
    spark, secured, spark_log: SparkLog, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG, logger="durastream_spark")
    root = secured.base_url + "/v1/stream"
    stream = f"auth/{uuid.uuid4().hex[:8]}"
    token_file = tmp_path / "client-token"
    token_file.write_text(RW + "\n")
    seen: list[str] = []  # every text a person could look at

    frame = spark.range(0, 50, numPartitions=2).select(F.to_json(F.struct("id")).alias("value"))
    _write(frame, root, stream, tokenFile=str(token_file))
    _write(frame, root, stream, **{"header.Authorization": f"Bearer {RW}"})

    # Read with a read-only token (batch), and with the token file (streaming, AvailableNow).
    read = _read(spark, root, stream, **{"header.Authorization": f"Bearer {RO}"})
    assert read.count() == 100
    seen.append(_plan(read))
    read.explain(True)
    collector = BatchCollector()
    query = run_available_now(
        spark,
        {"url": root, "streams": stream, "tokenFile": str(token_file)},
        str(tmp_path / "chk"),
        collector,
    )
    assert sum(len(rows) for _, rows in collector.batches) == 100
    seen.append(str(query.lastProgress))
    seen.append(str(query.status))
    seen.append(str(query.recentProgress))

    # Failures: a wrong token (401), a read-only token writing (403), a tenant outside its prefix (403),
    # a rotated token file now holding a wrong token (401).
    failures = [
        (
            lambda: _write(frame, root, stream, **{"header.Authorization": f"Bearer {WRONG}"}),
            "401",
        ),
        (  # the protocol client the sink's tasks use (a failing Spark write costs ~25 s of retries)
            lambda: StreamClient(
                ConnectionOptions.parse({"url": root, "header.Authorization": f"Bearer {RO}"})
            ).append(stream, b'{"id": -1}', "application/json", producer=("p", 0, 0)),
            "403",
        ),
        (
            lambda: _read(
                spark, root, stream, **{"header.Authorization": f"Bearer {TENANT}"}
            ).collect(),
            "403",
        ),
    ]
    token_file.write_text(WRONG + "\n")  # a rotated file is picked up: now it holds a wrong token
    failures.append(
        (lambda: _read(spark, root, stream, tokenFile=str(token_file)).collect(), "401")
    )
    for action, status in failures:
        with pytest.raises(Exception) as caught:
            action()
        text = f"{caught.value}\n{caught.value!r}"
        assert f"HTTP {status}" in text, text[-2000:]
        assert stream in text, text[-2000:]
        assert "header.Authorization" in text or "tokenFile" in text  # says what to fix
        seen.append(text)

    seen.append(spark_log.text())
    seen.append("\n".join(record.getMessage() for record in caplog.records))
    seen.append(caplog.text)
    seen.append(_server_output(secured))
    assert "-> 401" in seen[-1] and "-> 403" in seen[-1]  # the server did log the refusals
    assert "AccessDenied" in seen[-5]  # Spark's log has the failed tasks
    everything = "\n".join(seen)
    for secret in SECRETS:
        assert secret not in everything, secret


def test_options_in_plans_and_errors_are_redacted(spark, secured) -> None:
    root = secured.base_url + "/v1/stream"
    with pytest.raises(Exception) as caught:
        _read(
            spark, root, "x", **{"header.X-Api-Key": f"{RW}\r\nEvil: 1", "requestTimeoutMs": "-1"}
        ).collect()
    assert RW not in str(caught.value)
    assert "header.x-api-key" in str(caught.value).lower() and "<redacted>" in str(caught.value)
