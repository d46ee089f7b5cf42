"""The README's quick start runs as written, so it cannot rot: the blocks marked ``<!-- readme-test -->``.

- The bash block: ``python -m venv`` and ``pip install`` made this test's own environment (both distributions
  from this checkout; ``tests/packaging`` installs the wheels into fresh venvs), so they are not run again.
  The ``durastream-server`` command runs as written, with the installed entry point, in a temporary
  directory, plus ``--port 0`` so that it cannot collide with a server on 4437. Any other command fails the
  test: the block holds nothing that is not run.
- The server's start-up line must be the one the README shows (with the real port); its stream root
  replaces ``http://127.0.0.1:4437/v1/stream`` in the Python block, and the block's work directory becomes a
  temporary one.
- The Python block runs like a notebook cell, ``SparkSession.builder.getOrCreate()`` returning the test's
  session. Then what the README says around it is checked against what happened: the default columns, the
  JSON the sink wrote, the count the streaming query printed, and the sink's input rules.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durastream_server import __version__ as server_version
from durastream_spark.source.arrow import DEFAULT_SCHEMA
from tests.support.server_process import read_line

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- readme-test -->"
README_ROOT = "http://127.0.0.1:4437/v1/stream"
README_WORK = "/tmp/durastream-quickstart"
SETUP_COMMANDS = ("python -m venv ", "pip install ")


def marked_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block right after the marker."""
    pattern = re.escape(MARKER) + r"\n```(\w+)\n(.*?)^```"
    return re.findall(pattern, text, re.MULTILINE | re.DOTALL)


def commands(bash: str) -> list[tuple[str, str]]:
    """``(command, comment)`` per line."""
    found = []
    for line in bash.splitlines():
        command, _, comment = line.partition(" #")
        if command.strip():
            found.append((command.strip(), comment.strip()))
    return found


def table(text: str, title: str) -> list[list[str]]:
    """The rows of the first table after the paragraph starting with ``title``."""
    after = text.split(title, 1)[1]
    lines = [line for line in after.split("\n\n")[1].splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


@pytest.fixture
def readme_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The README's server command, run: ``(stream root, start-up line)``."""
    bash = next(
        code for language, code in marked_blocks(README.read_text("utf-8")) if language == "bash"
    )
    server_lines = []
    for command, comment in commands(bash):
        if command.startswith(SETUP_COMMANDS):
            continue
        assert command.startswith("durastream-server ") and command.endswith("&"), (
            f"the README's quick start runs {command!r}, which tests/docs/test_readme.py does not run"
        )
        server_lines.append((command, comment))
    ((command, comment),) = server_lines
    argv = shlex.split(command.rstrip("&"))
    argv[0] = str(Path(sys.executable).parent / "durastream-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURASTREAM_")}
    process = subprocess.Popen(
        [*argv, "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = read_line(process, timeout=60).rstrip("\n")
        match = re.search(r" serving (http://127\.0\.0\.1:(\d+)/v1/stream) ", line)
        assert match, line
        shown = comment.removeprefix("prints: ").removesuffix("(...)")
        assert line.startswith(shown.replace(":4437/", f":{match.group(2)}/")), (line, shown)
        assert f"durastream-server {server_version} " in shown
        assert (tmp_path / "durastream-data" / "LOCK").exists()  # --data-dir as written
        yield match.group(1), line
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def run_python_block(root: str, work: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    (code,) = [
        c for language, c in marked_blocks(README.read_text("utf-8")) if language == "python"
    ]
    assert f'"{README_ROOT}"' in code and f'"{README_WORK}"' in code
    code = code.replace(README_ROOT, root).replace(README_WORK, str(work))
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    capsys.readouterr()
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 (running the README is the point)
    namespace["printed"] = capsys.readouterr().out
    return namespace


def test_the_quick_start_runs_and_shows_what_the_readme_says(
    spark, readme_server: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = readme_server
    ns = run_python_block(root, tmp_path / "work", capsys)
    text = README.read_text("utf-8")

    # The streaming query's count, printed last, is the one in the README's comment.
    assert ns["printed"].strip().splitlines()[-1] == "100"

    # The default columns: the table lists exactly the source's default schema.
    columns = [
        (name.strip("`"), kind) for name, kind, _ in table(text, "**Rows the source returns**")
    ]
    assert columns == [(f.name, f.dataType.simpleString().upper()) for f in DEFAULT_SCHEMA.fields]
    assert ns["raw"].schema == DEFAULT_SCHEMA

    # The sink wrote each row as the JSON object the README shows.
    rows = ns["raw"].collect()
    assert len(rows) == 100 and {r["stream"] for r in rows} == {"orders"}
    shown = re.search(r"`(\{\"id\":0[^`]*\})` above", text)
    assert shown, "the sink rules show the first row's JSON"
    (first,) = [r["value"].decode() for r in rows if json.loads(r["value"])["id"] == 0]
    assert first == shown.group(1)
    typed = ns["typed"].collect()
    assert sorted(r["id"] for r in typed) == list(range(100))
    assert {r["customer"] for r in typed} == {0, 1, 2}


def test_the_sink_rules_in_the_readme(spark, durastream_server) -> None:
    """The rules table: a ``value`` column is written as it is (other columns not), a ``stream`` column
    routes rows and is not written."""
    rules = {
        row[0].split(" (")[0]: row[1] for row in table(README.read_text("utf-8"), "**What the sink")
    }
    assert set(rules) == {"a `value` column", "no `value` column", "a `stream` column"}
    url = durastream_server.base_url + "/v1/stream"
    base = f"readme-rules/{uuid.uuid4().hex[:8]}"

    def read(stream: str) -> list[bytes]:
        frame = spark.read.format("durastream").option("url", url).option("streams", stream).load()
        return [r["value"] for r in frame.orderBy("offset").collect()]

    values = spark.createDataFrame(
        [('{"a":1}', "not written"), ('{"a":2}', "x")], "value STRING, note STRING"
    )
    values.write.format("durastream").option("url", url).option("stream", f"{base}/values").mode(
        "append"
    ).save()
    assert sorted(read(f"{base}/values")) == [
        b'{"a":1}',
        b'{"a":2}',
    ]  # partitions commit in any order

    routed = spark.createDataFrame(
        [(f"{base}/one", 1), (f"{base}/two", 2), (f"{base}/one", 3)], "stream STRING, n INT"
    )
    routed.write.format("durastream").option("url", url).mode("append").save()
    assert sorted(json.loads(v)["n"] for v in read(f"{base}/one")) == [1, 3]
    assert [json.loads(v) for v in read(f"{base}/two")] == [{"n": 2}]


def test_the_two_fresh_machine_commands_stay() -> None:
    text = README.read_text("utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    make = [b for b in blocks if b.lstrip().startswith("make ")]
    assert [c.split()[:2] for c, _ in commands(make[0])] == [["make", "demo"], ["make", "test"]]
    assert (README.parent / ".ci" / "run").read_text("utf-8").rstrip().endswith("exec make test")
