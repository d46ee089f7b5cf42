"""Packaging: both distributions build wheels with complete metadata, and each works installed alone.

- Both wheels are built with ``python -m build --wheel`` from copies of the sources (so no ``build/`` or
  ``*.egg-info`` lands in the work tree), as a user or a release job would build them.
- Metadata: the version is the package's ``__version__`` (single source: setuptools reads it), every
  dependency has a minimum version, the server does not depend on pyspark, and the rest (readme, license,
  authors, URLs, classifiers, keywords) is there.
- ``durastream-server`` alone: installed into a fresh venv (its dependencies from the pip cache or PyPI,
  nothing from this repository's venv), started, ``GET /healthz`` answers 200, a stream round-trips.
- ``durastream-spark`` alone: installed into another fresh venv (pyspark, pyarrow and requests resolved by
  pip), ``from durastream_spark import DurableStreamDataSource`` imports the wheel's files.

The venvs are made without pip (``venv --without-pip``) and filled by this interpreter's pip through
``pip --python``, which saves the ensurepip step. The dependencies are constrained to the versions of the
test environment (which ``make test`` installed, so they are in the pip cache): the check is that each
wheel's own requirements resolve and work, not which release PyPI has today. Wall time is dominated by
unpacking pyspark (~450 MB) into the connector's venv: 15-40 s from a warm cache on a 2-core machine.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

from tests.support.server_process import read_line

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
CONNECTOR = "durastream-spark"
SERVER = "durastream-server"
INIT = {
    CONNECTOR: REPO / "durastream_spark" / "__init__.py",
    SERVER: REPO / "server" / "durastream_server" / "__init__.py",
}
PYPROJECT = {CONNECTOR: REPO / "pyproject.toml", SERVER: REPO / "server" / "pyproject.toml"}
INSTALL_TIMEOUT_S = 900
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")

pytestmark = pytest.mark.timeout(1800)


def package_version(distribution: str) -> str:
    """``__version__`` of the distribution's package, read from the source without importing it."""
    tree = ast.parse(INIT[distribution].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise AssertionError(f"no __version__ in {INIT[distribution]}")


def clean_env() -> dict[str, str]:
    """The environment for child processes, without anything that would leak this repo onto sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(args: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} failed ({result.returncode}):\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("build", reason="the 'build' package (test extra) is not installed")
    src = tmp_path_factory.mktemp("sources")
    out = tmp_path_factory.mktemp("wheels")
    connector_src = src / "connector"
    connector_src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, connector_src / name)
    shutil.copytree(REPO / "durastream_spark", connector_src / "durastream_spark", ignore=_IGNORED)
    server_src = src / "server"
    shutil.copytree(REPO / "server", server_src, ignore=_IGNORED)

    built = {}
    for distribution, project in ((CONNECTOR, connector_src), (SERVER, server_src)):
        target = out / distribution
        run([sys.executable, "-m", "build", "--wheel", "--outdir", target, project], src)
        (wheel,) = target.glob("*.whl")
        built[distribution] = wheel
    return built


def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode("utf-8"))


# ---- metadata -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("distribution", [CONNECTOR, SERVER])
def test_wheel_metadata_is_complete(wheels: dict[str, Path], distribution: str) -> None:
    from packaging.requirements import Requirement

    meta = metadata(wheels[distribution])
    assert meta["Name"] == distribution
    assert meta["Version"] == package_version(distribution)
    assert wheels[distribution].name.startswith(
        f"{distribution.replace('-', '_')}-{package_version(distribution)}-py3-none-any"
    )
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["Summary"] and meta["Author"] and meta["Keywords"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert len(meta.get_payload()) > 500, "the readme is the long description"
    assert meta.get_all("Project-URL")
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3" in classifiers

    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    assert requirements
    for requirement in requirements:
        operators = {spec.operator for spec in requirement.specifier}
        assert operators & {">=", "~=", "=="}, f"{requirement} has no minimum version"
    if distribution == SERVER:
        assert not [r for r in requirements if r.name.lower() == "pyspark"], requirements
    else:
        runtime = {r.name.lower() for r in requirements if r.marker is None}
        assert runtime == {"pyspark", "pyarrow", "requests"}


@pytest.mark.parametrize("distribution", [CONNECTOR, SERVER])
def test_version_is_single_sourced(distribution: str) -> None:
    text = PYPROJECT[distribution].read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.MULTILINE), "version must not be static"
    assert re.search(r'^dynamic\s*=\s*\[[^\]]*"version"', project, re.MULTILINE)
    package = "durastream_spark" if distribution == CONNECTOR else "durastream_server"
    assert f'version = {{ attr = "{package}.__version__" }}' in text


def test_wheel_contents(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels[CONNECTOR]) as archive:
        names = archive.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"durastream_spark"}
    for module in ("source/stream.py", "sink/writer.py", "protocol/client.py", "options.py"):
        assert f"durastream_spark/{module}" in names
    with zipfile.ZipFile(wheels[SERVER]) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"durastream_server"}
    assert "durastream-server = durastream_server.cli:main" in scripts


def test_server_version_flag() -> None:
    out = run([sys.executable, "-m", "durastream_server", "--version"], REPO / "server")
    assert out.strip() == f"durastream-server {package_version(SERVER)}"


# ---- each distribution alone in a fresh venv ------------------------------------------------------------


def constraints(root: Path) -> Path:
    """The versions installed here, as pip constraints: the fresh venv resolves the wheel's requirements
    to wheels already in the pip cache instead of downloading a newer pyspark (~450 MB) mid-test."""
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():  # the first of a name is the one imported
        name = dist.metadata["Name"]
        if name and not name.lower().startswith("durastream"):
            pins.setdefault(name.lower(), f"{name}=={dist.version}")
    path = root / "constraints.txt"
    path.write_text("\n".join(sorted(pins.values())) + "\n", encoding="utf-8")
    return path


def fresh_venv(root: Path, wheel: Path) -> Path:
    """A venv with nothing but ``wheel`` and what pip resolves for it. Returns its python."""
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], root, timeout=120)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]
    run([*pip, "--constraint", constraints(root), wheel], root, timeout=INSTALL_TIMEOUT_S)
    return python


def installed(python: Path, root: Path) -> set[str]:
    out = run([sys.executable, "-m", "pip", "--python", python, "list", "--format=json"], root)
    return {item["name"].lower() for item in json.loads(out)}


def test_server_wheel_alone(wheels: dict[str, Path], tmp_path: Path) -> None:
    started = time.monotonic()
    python = fresh_venv(tmp_path, wheels[SERVER])
    packages = installed(python, tmp_path)
    assert "durastream-server" in packages
    assert not packages & {"pyspark", "durastream-spark", "pyarrow"}, packages
    script = python.parent / "durastream-server"
    version = run([script, "--version"], tmp_path).strip()
    assert version == f"durastream-server {package_version(SERVER)}"

    process = subprocess.Popen(
        [
            str(script),
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--log-level",
            "WARNING",
        ],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(process, timeout=60)
        match = re.search(r"serving (http://\S+)/v1/stream \(", line)
        assert match, f"unexpected first line: {line!r}"
        base = match.group(1)
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as response:
            assert response.status == 200
        stream = f"{base}/v1/stream/packaging"
        for method, body in (("PUT", None), ("POST", b'{"ok": true}')):
            request = urllib.request.Request(
                stream, data=body, method=method, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status in (200, 201, 204)
        with urllib.request.urlopen(f"{stream}?offset=-1", timeout=10) as response:
            assert json.loads(response.read()) == [{"ok": True}]
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    log.info(f"server wheel: fresh venv, install and start in {time.monotonic() - started:.1f} s")


def test_connector_wheel_alone(wheels: dict[str, Path], tmp_path: Path) -> None:
    started = time.monotonic()
    python = fresh_venv(tmp_path, wheels[CONNECTOR])
    packages = installed(python, tmp_path)
    assert {"durastream-spark", "pyspark", "pyarrow", "requests"} <= packages
    assert "durastream-server" not in packages
    probe = (
        "import json, durastream_spark\n"
        "from durastream_spark import DurableStreamDataSource\n"
        "print(json.dumps({'file': durastream_spark.__file__, 'version': durastream_spark.__version__,"
        " 'name': DurableStreamDataSource.name()}))\n"
    )
    found = json.loads(run([python, "-c", probe], tmp_path).strip().splitlines()[-1])
    assert found["name"] == "durastream"
    assert found["version"] == package_version(CONNECTOR)
    # The wheel's own files, not this repository's sources (nor its editable install).
    assert Path(found["file"]).resolve().is_relative_to((tmp_path / "venv").resolve()), found
    log.info(f"connector wheel: fresh venv and install in {time.monotonic() - started:.1f} s")
