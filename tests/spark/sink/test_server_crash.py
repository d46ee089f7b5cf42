"""Issue 4, test 3: the server is killed (SIGKILL) in the middle of a batch and restarted while the query
retries.

A gate UDF holds one task in the middle of its partition (after it has sent requests) until the server is
dead. While the server is down, a listener on its port accepts connections, reads the request and hangs up
without answering, like a server dying mid-request: the writer must treat that as "maybe applied" and repeat
the request (safe: every sink request is idempotent). Then the server restarts on the same data directory
and port, and the stream must hold every row exactly once, in order per partition.
"""

from __future__ import annotations

import socket
import threading

import pytest
from pyspark.sql import functions as F

from tests.spark.sink.probe import gate
from tests.spark.sink.support import assert_exactly_once, read_stream, spark_conf, unique
from tests.support.http import poll_until

ROWS = 800


class HangUpListener:
    """Accepts connections on a port, reads what the client sends, and closes without a response."""

    def __init__(self, host: str, port: int) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self.requests = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> HangUpListener:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    if conn.recv(65536):
                        self.requests += 1
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()


@pytest.mark.parametrize("mode", ["transactional", "ordered"])
def test_server_killed_mid_batch_and_restarted(sink_spark, server_factory, tmp_path, mode) -> None:
    spark = sink_spark
    server = server_factory()
    root = server.base_url + "/v1/stream"
    stream = unique(f"server-crash-{mode}")
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .load()
        .select(
            F.spark_partition_id().alias("p"),
            gate(F.col("value"), ROWS // 2, gate_dir).alias("n"),
            F.lit("z" * 1000).alias("pad"),
        )
    )
    with spark_conf(spark, spark__sql__execution__arrow__maxRecordsPerBatch="10"):
        query = (
            df.writeStream.format("durastream")
            .option("url", root)
            .option("stream", stream)
            .option("exactlyOnce", mode)
            .option("maxMessagesPerRequest", "20")
            .option("retry.maxAttempts", "60")
            .option("retry.maxBackoffMs", "500")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            poll_until(lambda: (gate_dir / "reached").exists(), "the gate", timeout=120)
            server.kill()
            listener = HangUpListener(server.host, server.port).start()
            try:
                (gate_dir / "open").write_text("")
                poll_until(lambda: listener.requests > 0, "a request to the dead server", 60)
            finally:
                listener.stop()
            server.restart()
            query.awaitTermination()
        finally:
            (gate_dir / "open").write_text("")
            query.stop()
    assert query.exception() is None
    assert_exactly_once(read_stream(root, stream), range(ROWS))
