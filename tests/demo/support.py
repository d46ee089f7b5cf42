"""Run ``python -m durastream_spark.demo`` as a subprocess and check its exactly-once summary.

Shared by the demo test (bundled server), the subprocess-server twin of the docker-compose test, and the
standalone-cluster test: all of them run the same pipeline and apply the same checks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SUMMARY = re.compile(
    r"durastream-demo: (?P<verdict>EXACTLY-ONCE|FAILED) produced=(?P<produced>\d+) "
    r"read=(?P<read>\d+) live=(?P<live>\d+) duplicates=(?P<duplicates>\d+) missing=(?P<missing>\d+)"
    r"(?: restarts=(?P<restarts>\d+))?"
)


@dataclass(frozen=True)
class DemoRun:
    returncode: int
    stdout: str
    stderr: str

    def explain(self) -> str:
        return (
            f"exit code {self.returncode}\n--- stdout (tail) ---\n{tail(self.stdout, 40)}\n"
            f"--- stderr (tail) ---\n{tail(self.stderr, 60)}"
        )


def tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def demo_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.update(extra)
    return env


def run_demo(
    *args: str, env: dict[str, str] | None = None, timeout: float = 400, cwd: Path | None = None
) -> DemoRun:
    """Run the demo to completion; on timeout kill its whole session (the driver JVM included)."""
    command = [sys.executable, "-m", "durastream_spark.demo", "--no-live", *args]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env or demo_env(),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"the demo did not finish within {timeout:g}s\n"
            + DemoRun(process.returncode, stdout, stderr).explain()
        ) from None
    return DemoRun(process.returncode, stdout, stderr)


def parse_summary(output: str) -> dict[str, int | str]:
    matches = list(SUMMARY.finditer(output))
    assert matches, "no summary line in the output"
    found = matches[-1].groupdict()
    return {k: (v if k == "verdict" else int(v)) for k, v in found.items() if v is not None}


def assert_exactly_once(output: str, rows: int) -> dict[str, int | str]:
    """The checks every run of the demo pipeline must pass, wherever it ran."""
    summary = parse_summary(output)
    assert summary["verdict"] == "EXACTLY-ONCE", summary
    assert summary["produced"] == rows, summary
    assert summary["read"] == summary["produced"], summary
    assert summary["live"] == summary["produced"], summary
    assert summary["duplicates"] == 0, summary
    assert summary["missing"] == 0, summary
    return summary


def assert_demo_passed(run: DemoRun, rows: int) -> dict[str, int | str]:
    assert run.returncode == 0, run.explain()
    try:
        return assert_exactly_once(run.stdout, rows)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{run.explain()}") from None
