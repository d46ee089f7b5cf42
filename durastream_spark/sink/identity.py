"""Who is writing: the (writer key, epoch, partition, attempt) of a task, and the names derived from it.

Exactly-once rests on naming every write after something that is the same when Spark replays it and
different when it is new data:

- **writer key**: for a streaming query, its id (the ``sql.streaming.queryId`` local property), which is
  stable across restarts from the same checkpoint; for ``df.write``, a random id minted once per job on the
  driver (a re-run job is new data).
- **epoch**: the micro-batch id (``streaming.sql.batchId``); ``0`` for ``df.write``. Spark replays a batch
  under the same id with the same input, and never goes back to an older one.
- **partition**: ``TaskContext.partitionId()``, the same for every attempt of a task.
- **attempt**: ``TaskContext.attemptNumber()``, different for retries and speculative copies. Only
  transactional handles use it; producer tuples must not (a retry has to repeat, not add).

Producer ids are ``<producerId>-<writer key>-<partition>``: one producer per partition and stream, whose
epoch is the batch. Task attempts of one partition share it, so the server deduplicates their requests; an
attempt of an older batch still running (a zombie) is fenced by the newer epoch.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from pyspark import TaskContext

from durastream_spark.sink.errors import TaskIdentityError

STREAMING_QUERY_ID = "sql.streaming.queryId"
STREAMING_BATCH_ID = "streaming.sql.batchId"

_HANDLE_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")
_MAX_HANDLE = 200


@dataclass(frozen=True)
class TaskIdentity:
    writer_key: str
    epoch: int
    partition: int
    attempt: int

    @classmethod
    def of_streaming_task(cls) -> TaskIdentity:
        """From the running task; fails if Spark did not attach the streaming query's properties."""
        context = _task_context()
        query_id = context.getLocalProperty(STREAMING_QUERY_ID)
        batch_id = context.getLocalProperty(STREAMING_BATCH_ID)
        if not query_id or batch_id is None:
            raise TaskIdentityError(
                "The durastream sink could not find the streaming query id and batch id of this task "
                f"(Spark local properties '{STREAMING_QUERY_ID}' = {query_id!r}, '{STREAMING_BATCH_ID}' = "
                f"{batch_id!r}). Exactly-once writes need both; this Spark version or deployment does not "
                "provide them to Python writers."
            )
        try:
            epoch = int(batch_id)
        except ValueError:
            raise TaskIdentityError(
                f"Spark local property '{STREAMING_BATCH_ID}' is {batch_id!r}, not a batch number."
            ) from None
        return cls(query_id, epoch, context.partitionId(), context.attemptNumber())

    @classmethod
    def of_batch_task(cls, job_id: str) -> TaskIdentity:
        context = _task_context()
        return cls(job_id, 0, context.partitionId(), context.attemptNumber())

    def describe(self) -> str:
        return (
            f"batch {self.epoch}, partition {self.partition}, attempt {self.attempt} of writer "
            f"{self.writer_key}"
        )


def _task_context() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise TaskIdentityError(
            "The durastream sink's write() runs outside a Spark task (no TaskContext); it must be called "
            "by Spark."
        )
    return context


def new_job_id() -> str:
    """A writer key for one ``df.write`` job (minted on the driver, pickled into every task)."""
    return uuid.uuid4().hex


def producer_id(prefix: str, writer_key: str, partition: int) -> str:
    return f"{prefix}-{writer_key}-{partition}"


def handle_name(prefix: str, identity: TaskIdentity, nonce: str, index: int) -> str:
    """A staged-append handle unique to one task attempt (``nonce``) and request ``index``.

    The nonce matters: a query restarted from its checkpoint replays a batch with attempt numbers starting
    at 0 again, and must not stage into a handle left behind (possibly truncated) by the earlier run.
    """
    # Short, because a commit lists up to thousands of them in one header; the writer key is left out
    # (the random nonce already makes the name unique) and the rest keeps it readable in logs.
    name = f"{prefix}-{identity.epoch}-{identity.partition}-{identity.attempt}-{nonce}-{index}"
    name = _HANDLE_UNSAFE.sub("_", name)
    if len(name) > _MAX_HANDLE:  # keep the unique tail
        name = name[-_MAX_HANDLE:]
    return name


def new_nonce() -> str:
    return uuid.uuid4().hex[:12]
