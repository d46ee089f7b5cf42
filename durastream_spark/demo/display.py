"""Progress display: redrawn in place on a terminal, a plain line every few seconds otherwise.

The redraw is plain ANSI (cursor up, erase to end of screen), no curses: it works in any terminal and
degrades to periodic lines when stdout is a pipe or a file (CI logs, ``docker compose logs``), or with
``--no-live``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from durastream_spark.demo.pipeline import QueryStats

PLAIN_INTERVAL_SECONDS = 5.0


@dataclass
class Snapshot:
    elapsed: float
    phase: str
    expected: int
    produced: int
    writer: QueryStats
    live: QueryStats
    ingest_runs: list[QueryStats] = field(default_factory=list)


def human_bytes(count: int | None) -> str:
    if count is None:
        return "n/a"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def bar(done: int, total: int, width: int = 24) -> str:
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def render_lines(snapshot: Snapshot) -> list[str]:
    s = snapshot
    behind = max(0, s.produced - s.live.rows)
    lines = [
        f"durastream demo   {s.elapsed:5.1f} s   {s.phase}",
        f"  writer  rate -> durastream sink (exactly once)  {bar(s.produced, s.expected)} "
        f"{s.produced:>8,} / {s.expected:,} rows   {s.writer.batch_count:>3} batches",
        f"  live    durastream source -> counts per key     read {s.live.rows:>8,} rows   "
        f"{s.live.batch_count:>3} batches   lag {behind:,} rows ({human_bytes(s.live.lag_bytes)})",
    ]
    for run in s.ingest_runs:
        state = "done" if run.finished else "running"
        lines.append(
            f"  ingest  AvailableNow -> parquet, {run.name:<12} read {run.rows:>8,} rows   "
            f"{run.batch_count:>3} batches   {state}"
        )
    return lines


def plain_line(snapshot: Snapshot) -> str:
    s = snapshot
    ingest = ", ".join(
        f"{run.name} {run.rows} rows{' done' if run.finished else ''}" for run in s.ingest_runs
    )
    return (
        f"[{s.elapsed:5.1f}s] {s.phase}: written {s.produced}/{s.expected} "
        f"({s.writer.batch_count} batches), read live {s.live.rows} ({s.live.batch_count} batches, "
        f"lag {max(0, s.produced - s.live.rows)} rows / {human_bytes(s.live.lag_bytes)})"
        + (f", {ingest}" if ingest else "")
    )


class Display:
    def __init__(self, live: bool, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.live = live and self.out.isatty()
        self._drawn = 0
        self._last_plain = -PLAIN_INTERVAL_SECONDS
        self._last_phase: str | None = None

    def show(self, snapshot: Snapshot, force: bool = False) -> None:
        if self.live:
            lines = render_lines(snapshot)
            up = f"\x1b[{self._drawn}F" if self._drawn else ""
            self.out.write(up + "\x1b[J" + "\n".join(lines) + "\n")
            self.out.flush()
            self._drawn = len(lines)
            return
        now = time.monotonic()
        if (
            force
            or snapshot.phase != self._last_phase
            or now - self._last_plain >= PLAIN_INTERVAL_SECONDS
        ):
            self.out.write(plain_line(snapshot) + "\n")
            self.out.flush()
            self._last_plain = now
            self._last_phase = snapshot.phase

    def finish(self) -> None:
        """Leave the last frame on screen: later output goes below it and never redraws over it."""
        self._drawn = 0

    def message(self, text: str) -> None:
        """A line above the live block (the block is redrawn below it next time)."""
        if self.live and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0
        self.out.write(text + "\n")
        self.out.flush()
