"""The connector over Spark Connect, as on Databricks serverless and shared clusters.

A Spark Connect server runs from the pyspark distribution (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, with the ``spark-connect`` jar pyspark ships) on a
free port, in the foreground as a child process of its own process group, with ``PYSPARK_PYTHON`` set so its
Python workers import this venv's ``durastream_spark``. A separate client process
(``tests/connect/connect_client.py``) connects with ``SparkSession.builder.remote("sc://127.0.0.1:<port>")``,
registers the source through the Connect session, writes with the sink, reads back (raw and typed), runs a
streaming query (source to sink, ``Trigger.AvailableNow``) and provokes an option error. The client runs once
per module; each test checks one step. What works and what does not is documented in docs/spark-connect.md.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.connect.connect_client import RESULT_MARKER
from tests.notebooks.test_notebooks import CHECKED_VARIABLES, CHECKS
from tests.support.server_process import free_port

pytestmark = pytest.mark.timeout(1200)

REPO = Path(__file__).resolve().parents[2]
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTUP_TIMEOUT_SECONDS = 300.0  # a JVM on a loaded 2-core machine
CLIENT_TIMEOUT_SECONDS = 900.0
STOP_TIMEOUT_SECONDS = 30.0


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def connect_prerequisites() -> str | None:
    """Why the Connect test cannot run here, or None."""
    home = pyspark_home()
    if not (home / "bin" / "spark-submit").exists():
        return f"no bin/spark-submit in the pyspark distribution at {home}"
    if not list((home / "jars").glob("spark-connect_*.jar")):
        return f"the pyspark distribution at {home} ships no spark-connect jar"
    from pyspark.testing.connectutils import connect_requirement_message

    if connect_requirement_message:  # a pyspark[connect] package is missing or too old
        return f"{connect_requirement_message.strip()}; pip install -e '.[test]'"
    return None


class ConnectServer:
    """One Spark Connect server process (its own process group: spark-submit execs a JVM)."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.port = free_port()
        self.log_path = work_dir / "connect-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        home = pyspark_home()
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.local.dir": str(self.work_dir / "local"),
            "spark.sql.warehouse.dir": str(self.work_dir / "warehouse"),
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
        }
        args = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        args += ["--master", "local[2]", "--name", "durastream-connect-test"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            env.pop(key, None)
        env.update(
            SPARK_HOME=str(pyspark_home()),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def start(self) -> ConnectServer:
        (self.work_dir / "local").mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.work_dir,  # metastore_db, derby.log and the like stay in the temp dir
                env=self.environment(),
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if "Spark Connect server started" in self.log_text() and self.port_open():
                return self
            time.sleep(0.5)
        raise RuntimeError(
            f"the Spark Connect server did not start within {STARTUP_TIMEOUT_SECONDS}s:\n"
            + self.log_tail()
        )

    def port_open(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to the server's own process group, SIGKILL if it does not go."""
        if self.process is None:
            return
        group = self.process.pid  # start_new_session: the group id is the child's pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


@pytest.fixture(scope="module")
def connect_result(durastream_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    reason = connect_prerequisites()
    if reason:
        pytest.skip(reason)
    work_dir = tmp_path_factory.mktemp("spark-connect")
    server = ConnectServer(work_dir)
    try:
        server.start()
        env = server.environment()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        client = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.connect.connect_client",
                server.remote,
                durastream_server.base_url + "/v1/stream",
                str(work_dir),
            ],
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT_SECONDS,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        lines = [line for line in client.stdout.splitlines() if line.startswith(RESULT_MARKER)]
        if client.returncode != 0 or not lines:
            pytest.fail(
                f"the Connect client failed ({client.returncode}):\n{client.stderr[-6000:]}\n"
                f"--- server log ---\n{server.log_tail()}"
            )
        result = json.loads(lines[-1][len(RESULT_MARKER) :])
        (work_dir / "client-result.json").write_text(json.dumps(result, indent=2))
        result["_server_log"] = server.log_tail(200)
        yield result
    finally:
        server.stop()


def step(result: dict[str, Any], name: str) -> dict[str, Any]:
    outcome = result[name]
    assert outcome["ok"], (
        f"step {name!r} failed over Spark Connect: {outcome['error']}\n{outcome['traceback']}"
    )
    return outcome


def test_the_session_is_a_spark_connect_session(connect_result) -> None:
    session = step(connect_result, "session")
    assert session["class"] == "pyspark.sql.connect.session.SparkSession"


def test_the_source_registers_through_the_connect_session(connect_result) -> None:
    step(connect_result, "register")


def test_batch_write_with_the_sink_and_read_back(connect_result) -> None:
    step(connect_result, "batch_write")
    read = step(connect_result, "batch_read")
    assert read["columns"] == ["stream", "offset", "value", "timestamp"]
    assert read["count"] == 100
    assert set(read["first_value"]) == {"id", "kind", "amount"}


def test_typed_read_parses_json_with_a_schema(connect_result) -> None:
    typed = step(connect_result, "typed_read")
    assert typed["schema"] == "struct<id:bigint,kind:string,amount:double,_offset:string>"
    assert (typed["rows"], typed["ids"], typed["id_sum"]) == (100, 100, sum(range(100)))
    assert typed["amount_sum"] == pytest.approx(1.5 * sum(range(100)))


def test_streaming_query_from_the_source_into_the_sink(connect_result) -> None:
    streaming = step(connect_result, "streaming")
    assert streaming["finished"] is True and streaming["exception"] is None
    assert (streaming["rows"], streaming["ids"]) == (100, 100)  # exactly once
    # Progress is reported over Connect, but only per source: the top-level numInputRows is None
    # (docs/spark-connect.md; the notebooks sum the sources' counts).
    expected = [40, 40, 20] if connect_result["has_admission_control"] else [100]
    assert streaming["progress_batches"] == expected
    assert streaming["recent_progress_count"] >= len(expected)
    assert json.loads(streaming["last_progress"])["sources"][0]["numInputRows"] in (expected[-1], 0)


def test_option_errors_reach_the_connect_client_with_their_message(connect_result) -> None:
    error = step(connect_result, "option_error")
    assert error["message"] is not None, "a misspelt option must fail"
    # Raised in the server's Python worker, it arrives as PYTHON_DATA_SOURCE_ERROR with our text inside
    # (the option name as Spark passed it: lower-cased).
    assert "PYTHON_DATA_SOURCE_ERROR" in error["message"]
    assert "Unknown option 'maxmessagespertrgger'" in error["message"]
    assert "did you mean 'maxMessagesPerTrigger'" in error["message"]


@pytest.mark.parametrize("name", sorted(CHECKED_VARIABLES))
def test_the_notebooks_run_over_spark_connect(connect_result, name: str) -> None:
    """The same files as on a classic session: Databricks serverless runs them over Connect."""
    outcome = step(connect_result, f"notebook {name}")
    assert outcome["active"] == [], f"{name} left a query running"
    variables = outcome["variables"]  # through JSON: restore what it changed
    if "new_ids" in variables:
        variables["new_ids"] = tuple(variables["new_ids"])
    if "batches_by_run" in variables:
        variables["batches_by_run"] = {int(k): v for k, v in variables["batches_by_run"].items()}
    CHECKS[name](variables)
