"""docs/deploy.md's ``--py-files`` recipe, in a Python environment that does not have the connector.

The environment sees this venv's packages (pyspark, pyarrow, requests) through a ``.pth`` line, but not
the editable install of ``durastream_spark`` (its finder is installed by a ``.pth`` *file*, which a path
added that way does not run). The connector reaches the app, the planner workers and the tasks only as a
zip in ``spark.submit.pyFiles`` plus the same zip on the driver's ``PYTHONPATH``: without the latter,
PySpark 4.3 fails to plan a streaming read (its source planner worker gets no ``--py-files``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.demo.support import tail

ROOT = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("py_files_app.py")


def isolated_python(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "parent-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def zip_connector(archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for path in sorted((ROOT / "durastream_spark").rglob("*.py")):
            out.write(path, path.relative_to(ROOT).as_posix())
    return archive


@pytest.mark.timeout(600)
def test_connector_shipped_as_py_files_zip(durastream_server, tmp_path: Path) -> None:
    python = isolated_python(tmp_path / "env")
    probe = subprocess.run(
        [str(python), "-c", "import pyspark, pyarrow, requests, durastream_spark"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "No module named 'durastream_spark'" in probe.stderr, "premise: not installed there"

    archive = zip_connector(tmp_path / "durastream_spark.zip")
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(archive),
        "PYSPARK_PYTHON": str(python),
        "PYSPARK_DRIVER_PYTHON": str(python),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.update({k: v for k, v in os.environ.items() if k in ("JAVA_HOME", "TMPDIR", "LANG")})
    run = subprocess.run(
        [
            str(python),
            str(APP),
            str(archive),
            durastream_server.base_url + "/v1/stream",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=540,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("PY-FILES-RESULT ")]
    assert run.returncode == 0 and lines, (
        f"{run.returncode}\n{tail(run.stdout, 30)}\n{tail(run.stderr, 60)}"
    )
    result = json.loads(lines[-1].split(" ", 1)[1])
    assert result["read"] == result["distinct"] == result["rows"], result
    assert ".zip" in result["driver_module"], result
    assert ".zip" in result["executor_module"], result
