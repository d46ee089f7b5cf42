"""What a task tells the driver: the commit message, pickled by Spark from executor to driver.

The driver's ``commit()`` has no ``TaskContext`` and, for streaming, re-creates the writer from the options
alone, so everything the commit needs travels here: which mode wrote, the producer tuple to commit under,
and per target stream either the staged handles (transactional) or the final partial request (ordered).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage


@dataclass(frozen=True)
class StreamPart:
    """What one task attempt wrote to one stream.

    - ``rows``/``bytes``: payload rows and request-body bytes, remainder included.
    - ``requests``: requests the task sent itself (ordered: full requests, seqs ``0..requests-1``; the
      remainder goes under seq ``requests``). Transactional: stage requests.
    - ``handles``: transactional only, the staged handles in order; the commit lists them all.
    - ``remainder``/``remainder_rows``: ordered only, the final partial request that ``commit()`` sends.
    - ``last_offset``: the stream's tail after this task's last visible append (ordered), if any.
    - ``committed_earlier``: ordered only, an earlier run of this batch committed the part in
      transactional mode: it is complete, nothing was (or is to be) sent (``batch_mode.py``).
    - ``inline``: transactional only, on ``bulk-write`` servers: the part's whole data, one small
      request that the task did not stage; the driver commits it inline (``transactional.py``).
    """

    stream: str
    rows: int
    bytes: int
    requests: int
    handles: tuple[str, ...] = ()
    remainder: bytes | None = None
    remainder_rows: int = 0
    last_offset: str | None = None
    committed_earlier: bool = False
    inline: bytes | None = None


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """One successful task attempt's report."""

    mode: str
    writer_key: str
    epoch: int
    partition: int
    attempt: int
    producer_id: str
    parts: tuple[StreamPart, ...]
    requests: int = 0  # requests the task sent (answered), for the batch's log line
    retries: int = 0  # retries among their attempts

    @property
    def rows(self) -> int:
        return sum(part.rows for part in self.parts)


@dataclass(frozen=True)
class PartResult:
    """What the driver's commit did for one (stream, partition).

    ``outcome`` is ``committed`` (made visible now), ``duplicate`` (already visible: an earlier run of this
    batch, or an earlier try of this commit, did it) or ``nothing`` (ordered mode, no remainder to send).
    """

    stream: str
    partition: int
    rows: int
    bytes: int
    outcome: str
    next_offset: str | None


COMMITTED = "committed"
DUPLICATE = "duplicate"
NOTHING = "nothing"
