"""A batch is finished in the mode that first made part of it visible (docs/decisions/0006).

The two exactly-once modes write under the same producer on every target stream: ``(<producerId>-<writer
key>-<partition>, epoch = batch id, seq)``. So the server's producer state of that stream is where an
earlier run of a batch left its mark, per (stream, partition), and a replay meets it at seq 0:

- ordered mode appended requests under seqs 0, 1, ... (each remembered by its payload digest);
- transactional mode made one commit under seq 0, with the sink's commit key (``COMMIT_KEY``): the server
  keeps a digest of the key, not of the handles, so a replay's commit with other handles is recognised
  as the same commit (204) and anything else under the tuple is refused (409).

A replay may run in the other mode: the ``exactlyOnce`` option changed, or ``auto`` decided again after a
server swap, or a proxy hid the extension advertisement. Then, per (stream, partition):

- **ordered replay, part committed transactionally**: the part is complete (a commit is atomic and holds
  every row of the partition for that stream, from one successful attempt), so the replay skips it. The
  replay's first request of the part (seq 0) gets 409 ``DUPLICATE_PAYLOAD_MISMATCH``; before reporting a
  reordered retry, the writer asks the server whether the tuple holds the sink's keyed commit
  (``committed_transactionally``). That costs a request only on this path.
- **transactional replay, part started in ordered mode**: which rows the visible requests hold depends on
  how ordered mode cut them, so a commit cannot add exactly the rest. The commit is refused at seq 0
  (409, or a 204 reporting a higher seq than a commit ever uses), nothing of the replay becomes visible
  for the part, and the batch fails with ``BatchModeConflict``: restart with ``exactlyOnce=ordered``,
  which completes every part, including parts the transactional run committed meanwhile (first case).

So no sequence of mode changes loses or duplicates a row: each part is completed by the mode that started
it or fails loudly, and ordered mode can always finish a batch (under its usual row-order precondition).
"""

from __future__ import annotations

from durastream_spark.protocol.client import StreamClient
from durastream_spark.sink.errors import BatchModeConflict
from durastream_spark.sink.options import AUTO, EXACTLY_ONCE, ORDERED, SinkOptions

# The key of every transactional commit of the sink (Durastream-Commit-Key); never used by anything else.
COMMIT_KEY = "durastream-spark.transactional"
# The seq of a transactional commit: the only request of its producer epoch on a stream.
COMMIT_SEQ = 0


def committed_transactionally(
    client: StreamClient, stream: str, producer_id: str, epoch: int
) -> bool:
    """Whether an earlier run of batch ``epoch`` committed this (stream, producer) transactionally.

    Asked after the first seq of the epoch was refused as a reused tuple: True means the part is complete
    and must be skipped; False means the tuple holds an ordered request (a reordered retry)."""
    return client.committed_under_key(stream, (producer_id, epoch, COMMIT_SEQ), COMMIT_KEY)


def ordered_run_conflict(
    options: SinkOptions,
    *,
    stream: str,
    batch: int,
    partition: int,
    producer_id: str,
    highest_seq: int | None,
    request_id: str | None = None,
) -> BatchModeConflict:
    """The error for a transactional commit that found an ordered run's requests under its tuple
    (``request_id``: the server's id of the refused commit, when it refused one)."""
    visible = highest_seq + 1 if highest_seq is not None else 1
    chosen = (
        f"{EXACTLY_ONCE}=auto chose transactional: the server advertises staged appends"
        if options.exactly_once == AUTO
        else f"{EXACTLY_ONCE}={options.exactly_once}"
    )
    return BatchModeConflict(
        f"Batch {batch}, partition {partition}, stream '{stream}': an earlier run of this batch wrote "
        f"this partition in ordered mode ({visible} request(s) of producer '{producer_id}', epoch "
        f"{batch}, are visible), and this run is transactional ({chosen}). A transactional commit "
        "cannot complete a part that ordered mode started, so nothing of this run became visible for it "
        "(its staged copy is discarded) and nothing is lost or duplicated. To finish the batch exactly "
        f"once, restart the query from its checkpoint with {EXACTLY_ONCE}={ORDERED}: the earlier run's "
        "requests are then recognised as duplicates and the rest is added (ordered mode needs the rows "
        "of each partition in the same order as that run; parts committed transactionally meanwhile "
        f"are kept as they are). Once batch {batch} is committed you may switch back. See "
        "docs/guarantees.md." + (f" [request id {request_id}]" if request_id else ""),
        batch=batch,
        partition=partition,
        stream=stream,
        visible_requests=visible,
    )
