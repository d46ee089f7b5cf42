"""Each micro-batch's figures, as dicts, for code in the user's process (a ``StreamingQueryListener``).

The source and the sink log one INFO line per micro-batch from the driver (``source/progress.py``
``BatchSummary``, ``sink/commit.py`` ``BatchFigures``). Those objects live in the Python worker that Spark
runs a data source's driver-side code in, not in the Python process where a notebook's
``StreamingQueryListener.onQueryProgress`` runs, and Spark offers Python data sources no channel between the
two: ``DataSourceStreamReader``/``DataSourceStreamWriter`` cannot report custom metrics into the query
progress (PySpark 4.0 to 4.3: the source runner has no metrics call, ``SourceProgress.metrics`` stays empty),
and accumulators do not reach the driver-side workers. So the channel is a file both processes see:

- With option ``batchFiguresPath`` (an absolute directory on the driver, one per query like a checkpoint),
  the source appends one JSON line per planned batch to ``<dir>/source.jsonl`` and the sink one per
  committed batch to ``<dir>/sink.jsonl``. Without it nothing is written or computed: unused, it costs
  nothing. A file is rotated to ``<name>.1`` past ``MAX_FILE_BYTES`` (about 2,000 batches), so a
  directory holds at most four files of 1 MiB.
- ``for_batch(path, progress)``, called with ``event.progress`` in ``onQueryProgress`` (or with
  ``query.lastProgress``), returns the figures of that batch: ``{"queryId", "batchId", "source": [...],
  "sink": {...} | None}``.

How a record finds its batch. The sink's commit knows the query id (every task's writer key) and the batch
id, so its lines are keyed by both. The source's driver-side reader is told neither; it is given the batch's
end offset, which Spark also reports in the progress (``sources[i].endOffset``), so its lines are keyed by a
digest of that offset (SHA-256 of the canonical JSON). A query with two durastream sources gets one entry per
source, in the order of ``progress.sources``.

A batch recorded more than once (a batch replayed after a restart, planned or committed again): the last
record wins, and ``recorded`` says how many records there were (2 or more: a replay; only records still in the
files are counted).

Where it works: local mode and a cluster's driver (the notebook's Python process and Spark's Python workers
share the driver's file system), and Spark Connect when the client runs on the Spark Connect server's machine.
A remote Spark Connect client cannot read the driver's files.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durastream_spark.errors import OptionError
from durastream_spark.options import OptionReader

log = logging.getLogger(__name__)

BATCH_FIGURES_PATH = "batchFiguresPath"
FIGURES_KEYS: frozenset[str] = frozenset({BATCH_FIGURES_PATH})
ACCEPTED = (
    "an absolute directory on the driver (e.g. /tmp/figures/my-query or file:///tmp/figures/q)"
)

SOURCE_FILE = "source.jsonl"
SINK_FILE = "sink.jsonl"
ROTATED_SUFFIX = ".1"
MAX_FILE_BYTES = 1024 * 1024
_FILE_SCHEME = "file:"


@dataclass(frozen=True)
class FiguresOptions:
    """``batchFiguresPath``, checked once: ``directory`` is ``None`` when the figures are not wanted."""

    directory: str | None = None

    @classmethod
    def parse(cls, reader: OptionReader) -> FiguresOptions:
        raw = reader.string(BATCH_FIGURES_PATH, accepted=ACCEPTED)
        if raw is None:
            return cls()
        path = raw.strip()
        if path.lower().startswith(_FILE_SCHEME):
            path = "/" + path[len(_FILE_SCHEME) :].lstrip("/")
        elif "://" in path or (":" in path.split("/", 1)[0] and not path.startswith("/")):
            raise OptionError(
                BATCH_FIGURES_PATH,
                raw,
                ACCEPTED,
                reason="the figures are written and read on the driver's local file system; "
                "other file systems (dbfs:, s3:, abfss:, ...) are not supported",
            )
        if not os.path.isabs(path):
            raise OptionError(
                BATCH_FIGURES_PATH,
                raw,
                ACCEPTED,
                reason="a relative path would be resolved in Spark's Python worker, whose working "
                "directory is not the notebook's",
            )
        if os.path.exists(path) and not os.path.isdir(path):
            raise OptionError(BATCH_FIGURES_PATH, raw, ACCEPTED, reason="it is a file")
        return cls(os.path.normpath(path))

    def refuse_outside_streaming(self, what: str) -> None:
        """A batch read or ``df.write`` has no micro-batches and no listener: the option would be
        silently ignored, so it is refused."""
        if self.directory is not None:
            raise OptionError(
                BATCH_FIGURES_PATH,
                self.directory,
                "this option only with spark.readStream / df.writeStream",
                reason=f"{what} has no micro-batches to record",
            )


def offset_document(offset: Mapping[str, Any] | str) -> Any:
    """An offset as a progress shows it, parsed: JSON text (Spark's), a dict, or, in ``query.lastProgress``
    and ``recentProgress`` of PySpark 4.0, the Python repr of the parsed JSON (``{'s': '0_5'}``)."""
    if not isinstance(offset, str):
        return offset
    try:
        return json.loads(offset)
    except ValueError:
        return ast.literal_eval(offset)  # literals only; raises ValueError/SyntaxError otherwise


def offset_digest(offset: Mapping[str, Any] | str) -> str:
    """The key of a source record: SHA-256 of the offset's canonical JSON (key order and spacing do not
    matter, so Spark's text of the offset and the reader's dict give the same digest)."""
    document = offset_document(offset)
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class FiguresLog:
    """Appends records to one direction's file in a figures directory; never fails the query.

    Each record is one ``write`` of one line to a file opened with ``O_APPEND``, so two sources of one
    query (two processes) do not interleave their lines. A write that fails (directory not writable, disk
    full) is logged once as a warning naming the option: the figures are for people, the data must flow.
    """

    def __init__(self, directory: str, name: str) -> None:
        self.path = Path(directory) / name
        self._warned = False

    def append(self, prefix: dict[str, Any], figures: Mapping[str, Any]) -> None:
        record = {**prefix, "recordedAtMs": int(time.time() * 1000), "figures": dict(figures)}
        line = (_compact(record) + "\n").encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size > MAX_FILE_BYTES:
                os.replace(self.path, self.path.with_name(self.path.name + ROTATED_SUFFIX))
        except OSError as error:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot write the batch figures to %s (option %s): %s; the query goes on without "
                    "them",
                    self.path,
                    BATCH_FIGURES_PATH,
                    error,
                )


def record_source(options: FiguresOptions, end_offset: Mapping[str, Any], figures: Mapping) -> None:
    """The source planned a batch ending at ``end_offset`` (the dict Spark passed to ``partitions``)."""
    if options.directory is not None:
        FiguresLog(options.directory, SOURCE_FILE).append(
            {"endOffset": offset_digest(end_offset)}, figures
        )


def record_sink(options: FiguresOptions, query_id: str, batch_id: int, figures: Mapping) -> None:
    """The sink committed batch ``batch_id`` of query ``query_id``."""
    if options.directory is not None:
        FiguresLog(options.directory, SINK_FILE).append(
            {"queryId": query_id, "batchId": batch_id}, figures
        )


# ---- reading: the user's process ----------------------------------------------------------------------------


def for_batch(path: str | os.PathLike[str], progress: Any) -> dict[str, Any]:
    """The figures of the batch ``progress`` describes, from the ``batchFiguresPath`` directory ``path``.

    ``progress``: ``event.progress`` in ``StreamingQueryListener.onQueryProgress``, or
    ``query.lastProgress``/an entry of ``query.recentProgress`` (objects or dicts). Returns ``{"queryId":
    str, "batchId": int, "source": [dict, ...], "sink": dict | None}``: one source entry per durastream
    source found among ``progress.sources`` (those whose end offset has a record), each the source's dict
    (``streams``, ``tasks``, ``messages``, ``bytes``, ``behind``, ``planning_ms``) plus ``recorded``; the
    sink's dict (``batch``, ``mode``, ``streams``, ``rows``, ``bytes``, ``partitions``, ``task_requests``,
    ``task_retries``, ``commit_requests``, ``commit_retries``, ``commit_ms``) plus ``recorded``, or
    ``None`` when the sink is not durastream or did not record this batch.

    The files are written before Spark reports the batch, so a listener finds them. Reading costs a scan of
    at most four 1 MiB files; only lines with the batch's key are parsed.
    """
    directory = Path(os.fspath(path))
    query_id = str(_field(progress, "id"))
    batch_id = int(_field(progress, "batchId"))
    sources: list[dict[str, Any]] = []
    for source in _field(progress, "sources") or ():
        end = _field(source, "endOffset")
        digest = _digest_or_none(end)
        if digest is None:
            continue
        found = _latest(directory / SOURCE_FILE, _key({"endOffset": digest}))
        if found is not None:
            sources.append(found)
    sink = _latest(directory / SINK_FILE, _key({"queryId": query_id, "batchId": batch_id}))
    return {"queryId": query_id, "batchId": batch_id, "source": sources, "sink": sink}


def _latest(path: Path, key: str) -> dict[str, Any] | None:
    """The last record whose line starts with ``key``, with how many there were (``recorded``)."""
    last: str | None = None
    count = 0
    for line in _lines(path.with_name(path.name + ROTATED_SUFFIX), path):
        if line.startswith(key):
            last, count = line, count + 1
    if last is None:
        return None
    try:
        figures = dict(json.loads(last)["figures"])
    except (ValueError, KeyError, TypeError):
        return None  # a line cut short by a crash while it was written
    figures["recorded"] = count
    return figures


def _lines(*paths: Path) -> Iterator[str]:
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                yield from fh
        except FileNotFoundError:
            continue


def _key(prefix: dict[str, Any]) -> str:
    """The text every record with this prefix starts with (records are written with ``_compact``)."""
    return _compact(prefix)[:-1] + ","


def _compact(document: Mapping[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def _digest_or_none(end: Any) -> str | None:
    if end is None:
        return None
    try:
        return offset_digest(end)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None  # another source's offset that is not JSON


def _field(progress: Any, name: str) -> Any:
    if isinstance(progress, Mapping):
        return progress.get(name)
    return getattr(progress, name, None)


def records(path: str | os.PathLike[str], direction: str) -> list[dict[str, Any]]:
    """Every record still in the directory for ``direction`` (``"source"`` or ``"sink"``), oldest first:
    for a look at past batches without their progress (a notebook after the query ended)."""
    names = {"source": SOURCE_FILE, "sink": SINK_FILE}
    if direction not in names:
        raise ValueError(f"direction must be 'source' or 'sink', got {direction!r}")
    file = Path(os.fspath(path)) / names[direction]
    found = []
    for line in _lines(file.with_name(file.name + ROTATED_SUFFIX), file):
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


__all__ = [
    "BATCH_FIGURES_PATH",
    "FiguresOptions",
    "for_batch",
    "offset_digest",
    "offset_document",
    "records",
]
