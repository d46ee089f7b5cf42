"""The Databricks notebooks (``notebooks/``) run, cell by cell, against local Spark and the bundled server.

Each notebook runs as it would in a workspace: in one fresh namespace, top to bottom, with ``spark`` (the
shared local session) predefined as Databricks predefines it, and without ``dbutils``, so its configuration
comes from the environment variables (``DURASTREAM_URL``, ``DURASTREAM_AUTH_HEADER``,
``DURASTREAM_STREAM_PREFIX``, ``DURASTREAM_WORK_DIR``) and ``display`` falls back to ``df.show()``. Markdown
and ``%pip`` cells are skipped (``tests/notebooks/runner.py``). The assertions read the variables the
notebooks leave behind, so a notebook that stops doing what its text says fails here.
"""

from __future__ import annotations

import ast
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from durastream_spark.compat import HAS_ADMISSION_CONTROL
from tests.notebooks import runner

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("0*.py"))
SETUP = NOTEBOOK_DIR / "_setup.py"  # included by every notebook with `%run ./_setup`
EXPECTED = ["01_quickstart.py", "02_exactly_once_sink.py", "03_incremental_ingest.py"]
ENV_KEYS = (
    "DURASTREAM_URL",
    "DURASTREAM_AUTH_HEADER",
    "DURASTREAM_STREAM_PREFIX",
    "DURASTREAM_WORK_DIR",
)


# ---- static checks (no Spark) -------------------------------------------------------------------------------


def test_the_three_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_in_databricks_source_format(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith(runner.HEADER + "\n")
    assert text.endswith("\n") and not text.endswith("\n\n")
    # Databricks writes each separator between blank lines; an import keeps the cells as they are.
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("# COMMAND"):
            assert line == runner.SEPARATOR, f"{path.name}:{number}: malformed separator {line!r}"
    assert text.count("\n\n" + runner.SEPARATOR + "\n\n") == text.count(runner.SEPARATOR)

    cells = runner.parse(path)
    kinds = [cell.kind for cell in cells]
    assert set(kinds) <= {runner.MARKDOWN, runner.PIP, runner.RUN, runner.CODE}, kinds
    assert kinds[0] == runner.MARKDOWN, "the first cell says what the notebook does"
    assert runner.PIP in kinds, "the notebook installs the connector"
    for cell in cells:
        if cell.kind == runner.CODE:
            ast.parse(cell.source, filename=cell.where)
        else:  # magic lines are exactly '# MAGIC' or '# MAGIC <text>'
            for line in filter(None, cell.source.splitlines()):
                assert line == runner.MAGIC or line.startswith(runner.MAGIC + " "), cell.where

    intro = cells[0].source
    for needle in ("15.4 LTS", "serverless", "4.2"):
        assert needle in intro, (
            f"{path.name}: the first cell states the runtime requirement ({needle})"
        )


def test_every_notebook_takes_its_configuration_from_the_setup_notebook() -> None:
    """Widgets and secrets on Databricks, environment variables elsewhere: one text, in ``_setup.py``,
    which every notebook ``%run``s before its first code cell."""
    for path in NOTEBOOKS:
        cells = runner.parse(path)
        runs = [cell for cell in cells if cell.kind == runner.RUN]
        assert [runner.included(cell, NOTEBOOK_DIR) for cell in runs] == [SETUP], path.name
        first_code = next(i for i, cell in enumerate(cells) if cell.kind == runner.CODE)
        assert cells.index(runs[0]) < first_code, f"{path.name}: %run ./_setup comes first"
    setup = SETUP.read_text(encoding="utf-8")
    assert setup.startswith(runner.HEADER + "\n")
    for cell in runner.parse(SETUP):
        assert cell.kind in (runner.MARKDOWN, runner.CODE), cell.where
        if cell.kind == runner.CODE:
            ast.parse(cell.source, filename=cell.where)
    for needle in ("dbutils.widgets", "dbutils.secrets", *ENV_KEYS):
        assert needle in setup


@pytest.mark.parametrize("target", ["../_setup", "/Shared/x", "./a/b", "_setup", "./"])
def test_run_only_includes_a_sibling_notebook(tmp_path: Path, target: str) -> None:
    notebook = tmp_path / "n.py"
    notebook.write_text(f"{runner.HEADER}\n# MAGIC %run {target}\n")
    with pytest.raises(runner.NotebookFormatError):
        runner.run(notebook, {})


def test_a_failing_cell_is_reported_with_notebook_and_cell_number(tmp_path: Path) -> None:
    notebook = tmp_path / "broken.py"
    notebook.write_text(
        f"{runner.HEADER}\n# MAGIC %md\n# MAGIC # Title\n\n{runner.SEPARATOR}\n\n"
        f"# MAGIC %pip install nothing-at-all\n\n{runner.SEPARATOR}\n\n"
        f"x = 1\n\n{runner.SEPARATOR}\n\n"
        f"y = x +\\\n    undefined_name\n"
    )
    namespace: dict[str, Any] = {}
    with pytest.raises(runner.NotebookCellError) as failure:
        runner.run(notebook, namespace)
    assert str(failure.value).startswith("broken.py cell 4 (line 15) failed: NameError")
    assert namespace["x"] == 1  # cell 3 ran; cells 1 (markdown) and 2 (%pip) were skipped
    # The traceback points at the notebook's own file and line.
    frame = traceback.extract_tb(failure.value.__cause__.__traceback__)[-1]
    assert (frame.filename, frame.lineno) == (str(notebook), 16)

    notebook.write_text(f"{runner.HEADER}\n# MAGIC %sql\n# MAGIC SELECT 1\n")
    with pytest.raises(runner.NotebookCellError, match=r"broken.py cell 1 .*magic %sql"):
        runner.run(notebook, {})


# ---- the notebooks, executed ----------------------------------------------------------------------------------


@pytest.fixture
def run_notebook(
    spark, durastream_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., dict[str, Any]]]:
    """Run a notebook like a fresh notebook session: its own namespace, the shared ``spark``."""
    prefix = f"notebook-tests/{uuid.uuid4().hex[:10]}"

    def run(name: str, *, server: Any = None, auth_header: str | None = None) -> dict[str, Any]:
        for key in ENV_KEYS:
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("DURASTREAM_URL", (server or durastream_server).base_url + "/v1/stream")
        monkeypatch.setenv("DURASTREAM_STREAM_PREFIX", prefix)
        work_dir = tmp_path / name.removesuffix(".py")
        work_dir.mkdir()
        monkeypatch.setenv("DURASTREAM_WORK_DIR", str(work_dir))
        if auth_header is not None:
            monkeypatch.setenv("DURASTREAM_AUTH_HEADER", auth_header)
        namespace: dict[str, Any] = {"__name__": "__notebook__", "spark": spark}
        runner.run(NOTEBOOK_DIR / name, namespace)
        assert namespace["STREAM_PREFIX"] == prefix
        assert [q.name for q in spark.streams.active] == [], f"{name} left a query running"
        return namespace

    try:
        yield run
    finally:
        for query in spark.streams.active:
            query.stop()


def check_quickstart(ns: dict[str, Any]) -> None:
    assert ns["raw_count"] == 6
    rows = ns["typed_rows"]
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["customer"] for r in rows] == ["alice", "bob", "alice", "carol", "bob", "dave"]
    assert all(r["_offset"] and r["_timestamp"] is not None for r in rows)
    # The sink's partitions commit in any order; the HTTP append came after them.
    offsets = [r["_offset"] for r in rows]
    assert len(set(offsets)) == 6 and sorted(offsets)[4:] == offsets[4:]
    assert ns["totals"] == {"alice": 42.5, "bob": 13.7, "carol": 12.5, "dave": 1.2}


def test_01_quickstart(run_notebook) -> None:
    check_quickstart(run_notebook("01_quickstart.py"))


def test_01_quickstart_with_an_auth_header(run_notebook, server_factory) -> None:
    """DURASTREAM_AUTH_HEADER reaches the sink, the source and the notebook's own HTTP request."""
    token = "notebook-test-token-" + uuid.uuid4().hex
    server = server_factory(extra_args=["--auth-token", token])
    anonymous = requests.get(server.base_url + "/v1/stream/anything", timeout=10)
    assert anonymous.status_code == 401  # the server really enforces the token
    check_quickstart(run_notebook("01_quickstart.py", server=server, auth_header=f"Bearer {token}"))


def check_exactly_once_sink(ns: dict[str, Any]) -> None:
    # First run: every source row once; restart with more input: exactly the new rows added.
    assert ns["first_run"] == {"rows": 1000, "distinct_ids": 1000, "duplicates": 0, "missing": 0}
    assert ns["second_run"] == {"rows": 1500, "distinct_ids": 1500, "duplicates": 0, "missing": 0}
    assert ns["first_run_batches"] >= 2  # maxFilesPerTrigger=1 over several files
    # The listener got each batch's figures as dicts: the rows of every batch, in transactional mode.
    assert len(ns["first_run_figures"]) == ns["first_run_batches"]
    assert sum(f["rows"] for f in ns["first_run_figures"]) == 1000
    assert {(f["mode"], f["streams"]) for f in ns["first_run_figures"]} == {("transactional", 1)}
    # What breaks it: the same input through a new checkpoint is written again.
    assert ns["broken_rows"] == 2 * ns["broken_distinct_ids"] == 2 * 1500


def check_incremental_ingest(ns: dict[str, Any]) -> None:
    assert ns["TABLE_FORMAT"] in ("delta", "parquet")
    assert ns["first_run_rows"] == 500
    assert ns["second_run_new_rows"] == 300  # the rerun read only what was appended
    assert ns["total_rows"] == 800 and ns["duplicate_ids"] == 0
    assert ns["new_ids"] == (500, 799)
    assert ns["third_run_new_rows"] == 0  # nothing appended: nothing read
    rows_per_batch = {
        run: [rows for _, rows in batches] for run, batches in ns["batches_by_run"].items()
    }
    if HAS_ADMISSION_CONTROL:  # maxMessagesPerTrigger=200
        assert rows_per_batch == {1: [200, 200, 100], 2: [200, 100], 3: []}
    else:  # Spark's AvailableNow wrapper: one batch up to the tails at the start
        assert rows_per_batch == {1: [500], 2: [300], 3: []}


def test_02_exactly_once_sink(run_notebook) -> None:
    check_exactly_once_sink(run_notebook("02_exactly_once_sink.py"))


def test_03_incremental_ingest(run_notebook) -> None:
    check_incremental_ingest(run_notebook("03_incremental_ingest.py"))


# The variables the checks read; tests/connect runs the notebooks over Spark Connect and checks them too.
CHECKED_VARIABLES = {
    "01_quickstart.py": ("raw_count", "typed_rows", "totals"),
    "02_exactly_once_sink.py": (
        "first_run",
        "second_run",
        "first_run_batches",
        "first_run_figures",
        "broken_rows",
        "broken_distinct_ids",
    ),
    "03_incremental_ingest.py": (
        "TABLE_FORMAT",
        "first_run_rows",
        "second_run_new_rows",
        "total_rows",
        "duplicate_ids",
        "new_ids",
        "third_run_new_rows",
        "batches_by_run",
    ),
}
CHECKS = {
    "01_quickstart.py": check_quickstart,
    "02_exactly_once_sink.py": check_exactly_once_sink,
    "03_incremental_ingest.py": check_incremental_ingest,
}
