"""The official Durable Streams conformance suite (the acceptance test) against a fresh real server.

Runs ``tests/conformance/conformance.test.mjs`` with vitest (installed by ``make npm``), reads vitest's JSON
report, and requires every one of the suite's tests, including the reserved subscription APIs, to pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.server_process import ServerProcess

CONFORMANCE_DIR = Path(__file__).resolve().parents[1] / "conformance"
EXPECTED_TESTS = 338
SUITE_TIMEOUT_SECONDS = 1200


def _failures(report: dict) -> list[str]:
    failed = []
    for file_result in report.get("testResults", []):
        for assertion in file_result.get("assertionResults", []):
            if assertion.get("status") != "passed":
                first_line = next(iter(assertion.get("failureMessages") or [""]), "").splitlines()
                why = first_line[0] if first_line else ""
                failed.append(f"{assertion.get('fullName')} [{assertion.get('status')}] {why}")
        if file_result.get("status") == "failed" and not file_result.get("assertionResults"):
            failed.append(f"{file_result.get('name')}: {file_result.get('message', '')[:500]}")
    return failed


@pytest.mark.timeout(SUITE_TIMEOUT_SECONDS + 60)
def test_official_conformance_suite(tmp_path: Path) -> None:
    if shutil.which("npx") is None:
        pytest.fail("npx (Node 20) is required for the conformance suite")
    if not (CONFORMANCE_DIR / "node_modules" / "@durable-streams").is_dir():
        pytest.fail("conformance npm dependencies are missing: run `make npm`")
    report_path = tmp_path / "result.json"
    with ServerProcess(tmp_path / "data", long_poll_timeout=0.5) as server:
        env = dict(os.environ, DURASTREAM_BASE_URL=server.base_url, CONFORMANCE_SUBSCRIPTIONS="1")
        completed = subprocess.run(
            ["npx", "--no", "vitest", "run", "--reporter=json", f"--outputFile={report_path}"],
            cwd=CONFORMANCE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
        )
        server_log = server.log_tail(40)
    assert report_path.exists(), (
        f"vitest wrote no report (exit {completed.returncode}):\n"
        f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    )
    report = json.loads(report_path.read_text())
    failed = _failures(report)
    total = report.get("numTotalTests")
    passed = report.get("numPassedTests")
    assert not failed and passed == total == EXPECTED_TESTS, (
        f"conformance: {passed}/{total} passed (expected {EXPECTED_TESTS}); failed:\n"
        + "\n".join(failed)
        + f"\n--- server log tail ---\n{server_log}"
    )
