"""Issue 4, test 2: the driver dies between the tasks finishing and the commit (and right after a commit),
and the query restarts from its checkpoint.

The driver runs in a subprocess (``crash_driver.py``, its own SparkSession) with one query per mode. Its
sink blocks inside the driver-side commit of a chosen batch; the test SIGKILLs the whole driver there and
starts it again from the same checkpoints:

1. run 1 blocks *after* the commit of batch 0: the data is in the stream, but Spark never recorded the batch
   as done, so run 2 replays batch 0 and commits it again, under the same producer tuples;
2. run 2 blocks *before* the commit of batch 1: every task finished, nothing was committed, so run 3
   replays batch 1 (new task attempts, new staged handles) and commits it;
3. run 3 blocks after the commit of batch 2, and is killed too.

The streams must then hold batches 0-2 exactly once. Three Spark starts make this the slowest sink test,
which is why both modes share each run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.spark.sink.support import assert_exactly_once, read_stream, unique
from tests.support.http import poll_until

ROWS = 600
MODES = ("transactional", "ordered")
REPO = Path(__file__).resolve().parents[3]


def _run_until_blocked(config: dict, block: str, log: Path) -> None:
    config = {**config, "block": block}
    batch = block.split(":")[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    with open(log, "ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.sink.crash_driver", json.dumps(config)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and its workers die together
        )
    try:
        markers = [Path(t["markers"]) / f"blocked-{batch}" for t in config["targets"].values()]

        def blocked() -> bool:
            if child.poll() is not None:
                raise AssertionError(f"the driver exited early:\n{log.read_text()[-3000:]}")
            return all(marker.exists() for marker in markers)

        poll_until(blocked, f"both queries to block in commit ({block})", timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)


def test_driver_killed_around_commit_then_restarted_from_checkpoint(
    durastream_server, tmp_path
) -> None:
    root = durastream_server.base_url + "/v1/stream"
    targets = {}
    for mode in MODES:
        markers = tmp_path / mode / "markers"
        markers.mkdir(parents=True)
        targets[mode] = {
            "stream": unique(f"driver-crash-{mode}"),
            "markers": str(markers),
            "checkpoint": str(tmp_path / mode / "checkpoint"),
        }
    config = {"url": root, "rows": ROWS, "targets": targets}
    log = tmp_path / "driver.log"
    _run_until_blocked(config, "after:0", log)
    for target in targets.values():  # batch 0 is visible although Spark never finished it
        assert len(read_stream(root, target["stream"])) == ROWS
    _run_until_blocked(config, "before:1", log)
    _run_until_blocked(config, "after:2", log)
    for target in targets.values():
        assert_exactly_once(read_stream(root, target["stream"]), range(3 * ROWS))
