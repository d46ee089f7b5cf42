"""A bulk call of several requests (``protocol/bulk.py``) has them in flight together, against a real
server: its entries are independent, so the server applies one request's while the next arrives (the
driver's commit of a batch routed to 2,000 streams waited for four requests one after the other)."""

from __future__ import annotations

import threading
import uuid

from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol import bulk
from durastream_spark.protocol.client import StreamClient


def test_the_requests_of_one_bulk_call_overlap_and_answer_every_entry_in_order(
    durastream_server,
) -> None:
    client = StreamClient(
        ConnectionOptions.parse({"url": durastream_server.base_url + "/v1/stream"})
    )
    writes = bulk.BulkWrites(client, "application/json")
    assert writes.supported()
    base = f"overlap-{uuid.uuid4().hex[:8]}"
    paths = [f"{base}/s{i}" for i in range(2 * bulk.MAX_ENTRIES + 5)]  # three ensure requests
    # The first two requests of the call wait for each other here: sent one after the other, the
    # first would wait alone and the barrier break (BrokenBarrierError fails the call).
    meet = threading.Barrier(2, timeout=30)
    calls = []
    original = client._checked

    def observed(method, url, *args, **kwargs):
        calls.append(url)
        if len(calls) <= 2:
            meet.wait()
        return original(method, url, *args, **kwargs)

    client._checked = observed  # type: ignore[method-assign]
    ensured = writes.ensure(paths, create=True)
    client._checked = original  # type: ignore[method-assign]
    assert len(calls) == 3
    assert [e.path for e in ensured] == paths and all(e.created for e in ensured)
    entries = [
        bulk.CommitEntry(p, (), (f"p-{i}", 0, 0), key="k", inline=b'{"i": %d}' % i)
        for i, p in enumerate(paths)
    ]
    answers = writes.commit(entries)
    assert [isinstance(a, Exception) for a in answers] == [False] * len(paths)
    assert [a.duplicate for a in writes.commit(entries)] == [True] * len(paths)
    assert client.read(paths[-1], "-1").body.strip().startswith(b"[")
