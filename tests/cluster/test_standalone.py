"""The demo pipeline on a real Spark standalone cluster: a master and two workers from the pyspark package.

Unlike ``local[*]``, every task runs in an executor JVM of its own with its own Python workers, so this
is where a class pickled by reference to a module the executors cannot import, a package missing on the
executors, or a session used inside a task would fail. The driver is the demo process; the sink's tasks,
the source's partition reads and the aggregation run on the two executors.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.standalone import StandaloneCluster
from tests.demo.support import assert_demo_passed, demo_env, run_demo

ROWS = 2000


@pytest.fixture
def cluster(tmp_path: Path):
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=1, memory="1g")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"processes of the cluster still running after stop(): {left}"


@pytest.mark.timeout(600)
def test_demo_pipeline_on_a_standalone_cluster(cluster: StandaloneCluster, tmp_path: Path) -> None:
    run = run_demo(
        "--master",
        cluster.master_url,
        "--rows",
        str(ROWS),
        "--seconds",
        "5",
        "--workdir",
        str(tmp_path / "demo"),
        env=demo_env(SPARK_LOCAL_IP="127.0.0.1"),
        timeout=480,
    )
    try:
        assert_demo_passed(run, ROWS)
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- executors ---\n{cluster.executor_logs()}") from None

    # The work really ran on the cluster: one finished application with executors on both workers.
    apps = cluster.state()["completedapps"]
    assert [app["name"] for app in apps] == ["durastream-demo"], apps
    executor_dirs = sorted((cluster.root / "work").glob("worker-*/app-*/*"))
    assert {path.parts[-3] for path in executor_dirs} == {"worker-0", "worker-1"}, executor_dirs
