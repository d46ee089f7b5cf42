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


def _start_driver(config: dict, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.sink.crash_driver", json.dumps(config)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and its workers die together
        )


def _run_until_blocked(config: dict, block: str, log: Path) -> None:
    config = {**config, "block": block}
    batch = block.split(":")[1]
    child = _start_driver(config, log)
    try:
        markers = [Path(t["markers"]) / f"blocked-{batch}" for t in config["targets"].values()]

        def blocked() -> bool:
            if child.poll() is not None:
                raise AssertionError(f"the driver exited early:\n{log.read_text()[-3000:]}")
            return all(marker.exists() for marker in markers)

        poll_until(blocked, f"the queries to block in commit ({block})", timeout=300)
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


def test_mode_switches_across_driver_kills(durastream_server, tmp_path) -> None:
    """Issue 15, item 1, across real driver kills: the batch a transactional run committed (and Spark
    never recorded) is finished by an ordered restart, which skips its committed parts; the batch that
    ordered run committed (unrecorded too) is refused by a transactional restart, loudly, and nothing
    changes in the stream."""
    root = durastream_server.base_url + "/v1/stream"
    markers = tmp_path / "markers"
    markers.mkdir()
    target = {
        "stream": unique("driver-crash-switch"),
        "markers": str(markers),
        "checkpoint": str(tmp_path / "checkpoint"),
    }

    def config(mode: str) -> dict:
        return {"url": root, "rows": ROWS, "targets": {"switch": {**target, "mode": mode}}}

    log = tmp_path / "driver.log"
    _run_until_blocked(config("transactional"), "after:0", log)
    assert len(read_stream(root, target["stream"])) == ROWS
    _run_until_blocked(config("ordered"), "after:1", log)  # replays batch 0, then batch 1
    assert_exactly_once(read_stream(root, target["stream"]), range(2 * ROWS))

    child = _start_driver({**config("transactional"), "block": "after:2"}, log)
    try:
        assert child.wait(300) != 0, "the transactional replay of an ordered batch must fail"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    text = log.read_text()
    assert "BatchModeConflict" in text or "an earlier run of this batch wrote" in text
    assert "exactlyOnce=ordered" in text
    assert_exactly_once(read_stream(root, target["stream"]), range(2 * ROWS))
