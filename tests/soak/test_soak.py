"""The chaos soak, short: 2 minutes of faults (fixed seed), then nothing lost and nothing duplicated.

Runs ``bench/soak.py --minutes 2 --seed 9 --variant shuffle`` in a subprocess (it starts its own server,
proxy and two Spark driver processes, and SIGKILLs them on purpose) and checks its summary: zero lost,
zero duplicated, every message compared in A, B and the table, and every fault type really injected.
The long run and how to replay a seed: ``bench/soak.py --help`` and ``docs/benchmarks.md`` ("Soak").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEED = 9
MINUTES = 2
# The fault types the soak injects, from the soak itself (bench/ is not a package).
sys.path.insert(0, str(REPO / "bench"))
from soak import FAULT_TYPES  # noqa: E402


@pytest.mark.timeout(1500)
def test_two_minute_chaos_soak_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "soak"
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    process = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "--minutes",
            str(MINUTES),
            "--seed",
            str(SEED),
            "--variant",
            "shuffle",
            "--workdir",
            str(workdir),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=1400)
    except subprocess.TimeoutExpired:
        process.terminate()  # the soak cleans up its server, drivers and tmpfs on SIGTERM
        output, _ = process.communicate(timeout=120)
    summary_path = workdir / "summary.json"
    assert summary_path.exists(), f"the soak did not finish:\n{output[-6000:]}"
    summary = json.loads(summary_path.read_text())
    soak_line = next((line for line in output.splitlines() if line.startswith("SOAK ")), "")
    context = f"{soak_line}\nproblems: {summary['problems']}\n{output[-4000:]}"
    assert summary["drained"], context
    assert summary["messages_in"] > 1000, context
    assert summary["lost"] == 0, context
    assert summary["duplicated"] == 0, context
    assert summary["messages_out"] == summary["messages_in"], context
    for stage in ("A", "B", "table"):
        assert summary["detail"][stage]["messages"] == summary["messages_in"], context
    assert summary["problems"] == [], context
    not_injected = [kind for kind in FAULT_TYPES if summary["faults"].get(kind, 0) < 1]
    assert not not_injected, f"faults never injected: {not_injected}\n{context}"
    assert process.returncode == 0, context
