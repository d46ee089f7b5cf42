"""Databricks source-format notebooks (``notebooks/*.py``), parsed and executed cell by cell.

The format: the first line is ``# Databricks notebook source``; cells are separated by lines
``# COMMAND ----------``; a cell whose lines all start with ``# MAGIC`` is a magic cell (``%md`` markdown,
``%pip`` installs, ``%run ./other`` includes). The runner executes the Python cells in order in one
namespace, skips markdown and ``%pip`` cells, runs a ``%run ./name`` cell as Databricks does (the notebook
``name`` from the same folder, in the same namespace), and refuses any other magic (``%sql``, ``%sh``): a
notebook cell the tests cannot run could rot unnoticed. A failing cell raises ``NotebookCellError`` naming the notebook and the cell; the
cell is compiled with its real file name and line numbers, so the traceback points into the notebook.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"
MAGIC = "# MAGIC"

MARKDOWN, PIP, RUN, CODE = "markdown", "pip", "run", "code"


class NotebookFormatError(ValueError):
    """The file is not a well-formed Databricks source notebook."""


class NotebookCellError(RuntimeError):
    """A cell failed; the message names the notebook, the cell number and its first line."""


@dataclass(frozen=True)
class Cell:
    notebook: str
    number: int  # 1-based, as Databricks shows them
    first_line: int  # 1-based line of the cell's first line in the file
    source: str  # the cell's lines, exactly as in the file

    @property
    def magic_command(self) -> str | None:
        """``%md``, ``%pip``, ... for a magic cell; None for a Python cell."""
        lines = [line for line in self.source.splitlines() if line.strip()]
        if not lines or not all(line.startswith(MAGIC) for line in lines):
            return None
        first = lines[0][len(MAGIC) :].strip()
        return first.split()[0] if first else ""

    @property
    def kind(self) -> str:
        command = self.magic_command
        if command is None:
            return CODE
        if command == "%md":
            return MARKDOWN
        if command == "%pip":
            return PIP
        if command == "%run":
            return RUN
        return f"magic {command or '(none)'}"

    @property
    def where(self) -> str:
        """``01_quickstart.py cell 5 (line 42)``: the line is the cell's first non-blank line."""
        lines = self.source.splitlines()
        blank = next((i for i, line in enumerate(lines) if line.strip()), 0)
        return f"{self.notebook} cell {self.number} (line {self.first_line + blank})"


def parse(path: Path) -> list[Cell]:
    """The cells of a notebook; raises ``NotebookFormatError`` if the file is not in source format."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != HEADER:
        raise NotebookFormatError(f"{path.name}: the first line must be {HEADER!r}")
    cells: list[Cell] = []
    current: list[str] = []
    start = 2
    for number, line in enumerate(lines[1:], start=2):
        if line.rstrip() == SEPARATOR:
            cells.append(_cell(path, len(cells) + 1, start, current))
            current, start = [], number + 1
        else:
            current.append(line)
    cells.append(_cell(path, len(cells) + 1, start, current))
    return cells


def _cell(path: Path, number: int, start: int, lines: list[str]) -> Cell:
    cell = Cell(path.name, number, start, "\n".join(lines) + "\n")
    if not cell.source.strip():
        raise NotebookFormatError(f"{cell.where}: empty cell")
    mixed = any(line.startswith(MAGIC) for line in lines) and cell.magic_command is None
    if mixed:
        raise NotebookFormatError(f"{cell.where}: mixes '# MAGIC' lines with Python lines")
    return cell


def included(cell: Cell, folder: Path) -> Path:
    """The notebook a ``%run ./name`` cell includes: only a sibling, named without ``.py``, as in a
    workspace."""
    words = cell.source.split(MAGIC, 1)[1].split()
    target = words[1] if len(words) == 2 else ""
    name = target.removeprefix("./")
    if not target.startswith("./") or not name or "/" in name:
        raise NotebookFormatError(f"{cell.where}: expected '%run ./<notebook>', got {target!r}")
    return folder / f"{name}.py"


def run(path: Path, namespace: MutableMapping[str, Any]) -> list[Cell]:
    """Execute every Python cell of ``path`` (and of the notebooks it ``%run``s) in ``namespace``;
    returns the cells that ran."""
    ran: list[Cell] = []
    for cell in parse(path):
        if cell.kind in (MARKDOWN, PIP):
            continue
        if cell.kind == RUN:
            ran.extend(run(included(cell, Path(path).parent), namespace))
            continue
        if cell.kind != CODE:
            raise NotebookCellError(
                f"{cell.where}: {cell.kind} cells cannot run outside Databricks"
            )
        # Pad with newlines so that tracebacks show the notebook's own line numbers.
        code = compile("\n" * (cell.first_line - 1) + cell.source, str(path), "exec")
        try:
            exec(code, namespace)  # noqa: S102 (running the notebook is the point)
        except Exception as exc:
            raise NotebookCellError(f"{cell.where} failed: {type(exc).__name__}: {exc}") from exc
        ran.append(cell)
    return ran
