"""``bulk-write`` with ``--workers N`` (decision 0009, "What is left" 2): a bulk request split by shard.

A bulk ``ensure``, ``stages`` or ``commits`` request names streams of every shard, and each worker
holds only its own. The worker that receives one checks every entry as it would serve it (its path,
its token's scope, a stage's or an inline commit's headers: every error that names an entry's index
is found here, against the request's own indexes), answers the entries that fail, and splits the
others by the shard holding each path (``shard_of``, or a fork's placement: ``forks.py``): its own shard's it serves itself (``bulk.ensure_streams``,
``bulk.txn_entries``: the one-process code), every other shard's go to that shard's worker as a bulk
request of the same resource and body shape, with the client's headers and token, marked as a
shard's part (``fanout.request_head``; the mark counts only on a worker's Unix socket,
``fanout.is_shard_page``), all at once. Their answers are put back at their entries' indexes: one
document, as one process answers it.

Semantics are decision 0008's, unchanged: each entry is answered as its own request, and nothing is
atomic across streams (nor, therefore, across shards). What is new is a shard that does not answer:
the whole request is then 503 ``SHARD_UNAVAILABLE`` with ``Retry-After`` (after every part has
finished: the other shards' entries are applied, and answered nowhere). That is safe because a bulk
request is safe to retry whole: an ``ensure`` of a stream that exists answers it as it is
(``created`` false), and a commit retried (inline or of handles) is deduplicated by its producer
tuple (and commit key): a 204. A per-entry 503 would have been as safe but makes every client retry
entries one by one. A shard's 4xx for its whole part (its checks are the ones this worker already
made, so only a token or limit that differs between workers could cause one) is the answer to the
whole request, never a 503.

Staged appends are split the same way: a handle belongs to the one stream it was staged into (its
staging file lives in that stream's directory, and a commit or abort is a ``POST`` of that stream
naming only that stream's handles), so a ``stages`` entry and a ``commits`` entry that commits or
aborts handles go to their stream's shard like an inline commit. A retried ``stages`` request is as
safe as a retried ``commits``: a stage carrying a producer tuple (the connector's always do) is a 204
duplicate of the same handle's earlier stage, not a second copy; an abort retried aborts the same
names again (204). A stage *without* producer headers is not deduplicated by anyone, with one
process or N: a 503 leaves it as uncertain as a single stage whose connection dropped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from durastream_server.errors import ProtocolError, ShardUnavailable
from durastream_server.http import bulk
from durastream_server.shards.fanout import is_shard_page, request_head

if TYPE_CHECKING:
    from durastream_server.http.handlers import Request
    from durastream_server.shards.router import ShardRouter

Answers = list[dict[str, Any]]


class ShardRefused(ProtocolError):
    """A shard's 4xx to its whole part, answered to the whole request as that shard gave it (its
    status and its error's code and message)."""

    @classmethod
    def of(cls, status: int, document: dict[str, Any] | None) -> ShardRefused:
        error = document.get("error") if document is not None else None
        if not isinstance(error, dict):
            error = {}
        refused = cls(str(error.get("message", f"a shard answered {status} to its part")))
        refused.status = status
        refused.code = str(error.get("code", "BAD_REQUEST"))
        return refused


class BulkFanOut:
    """Serves an ``ensure``, ``stages`` or ``commits`` request across every shard (module docstring)."""

    def __init__(self, router: ShardRouter) -> None:
        self._router = router

    def is_shard_part(self, request: Request) -> bool:
        """Another worker sending this shard its entries: served here alone."""
        return is_shard_page(self._router, request)

    async def ensure(
        self,
        request: Request,
        body: bulk.EnsureBody,
        here: Callable[[bulk.EnsureBody], Awaitable[Answers]],
    ) -> Answers:
        """Every path's answer: each ensured in its shard's worker."""
        results: Answers = [{}] * len(body.streams)
        parts: dict[int, list[int]] = {}
        holder = self._router.holders()  # a fork lives in its source's shard (forks.py)
        for index, raw in enumerate(body.streams):
            try:
                path = bulk.ensure_path(request, raw, index)
            except ProtocolError as exc:
                results[index] = bulk.error_answer(exc)
                continue
            parts.setdefault(holder(path), []).append(index)

        def part(indexes: list[int]) -> bulk.EnsureBody:
            return body._replace(streams=[body.streams[i] for i in indexes])

        await self._gather(
            request, parts, results, lambda i: here(part(i)), lambda i: part(i).encode()
        )
        return results

    async def commits(
        self,
        request: Request,
        entries: list[bulk.Entry],
        here: Callable[[list[bulk.Entry]], Awaitable[Answers]],
    ) -> Answers:
        """Every entry's answer: each commit (inline or of handles) and abort in its stream's
        shard's worker."""
        shared = bulk.SharedAppendHeaders()

        def check(entry: bulk.Entry, index: int) -> str:
            return bulk.commit_entry(request, entry, index, shared)[0]

        return await self._entries(request, entries, here, check)

    async def stages(
        self,
        request: Request,
        entries: list[bulk.Entry],
        here: Callable[[list[bulk.Entry]], Awaitable[Answers]],
    ) -> Answers:
        """Every entry's answer: each stage in its stream's shard's worker (where its handle is)."""

        def check(entry: bulk.Entry, index: int) -> str:
            return bulk.stage_entry(request, entry, index)

        return await self._entries(request, entries, here, check)

    async def _entries(
        self,
        request: Request,
        entries: list[bulk.Entry],
        here: Callable[[list[bulk.Entry]], Awaitable[Answers]],
        check: Callable[[bulk.Entry, int], str],
    ) -> Answers:
        """A ``DSR1`` request's answers: each entry ``check``ed here (its path, or its error at its
        index), then served in its path's shard."""
        results: Answers = [{}] * len(entries)
        parts: dict[int, list[int]] = {}
        holder = self._router.holders()
        for index, entry in enumerate(entries):
            try:
                path = check(entry, index)
            except ProtocolError as exc:
                results[index] = bulk.error_answer(exc)
                continue
            parts.setdefault(holder(path), []).append(index)

        def part(indexes: list[int]) -> list[bulk.Entry]:
            return [entries[i] for i in indexes]

        await self._gather(
            request,
            parts,
            results,
            lambda i: here(part(i)),
            lambda i: bulk.encode_requests(part(i)),
        )
        return results

    async def _gather(
        self,
        request: Request,
        parts: dict[int, list[int]],
        results: Answers,
        here: Callable[[list[int]], Awaitable[Answers]],
        encode: Callable[[list[int]], bytes],
    ) -> None:
        """Serve this shard's part here and send every other its own, concurrently; their answers
        go to ``results`` at their indexes. Raises after every part has finished: a shard's 4xx, as
        it answered it; ``ShardUnavailable`` when one did not answer; this worker's own error."""
        own = self._router.index
        shards = sorted(parts)
        runs = [
            here(parts[shard])
            if shard == own
            else self._remote(request, shard, encode(parts[shard]), len(parts[shard]))
            for shard in shards
        ]
        outcomes = await asyncio.gather(*runs, return_exceptions=True)
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            # A client's error first (a shard's 4xx), then this worker's own failure, then a
            # shard not answering: the most specific answer a retry would not change.
            failures.sort(key=_precedence)
            raise failures[0]
        for shard, answers in zip(shards, outcomes, strict=True):
            assert not isinstance(answers, BaseException)
            for index, answer in zip(parts[shard], answers, strict=True):
                results[index] = answer

    async def _remote(self, request: Request, shard: int, body: bytes, count: int) -> Answers:
        """``shard``'s answers to its part (``body``, ``count`` entries), in the part's order."""
        head = request_head(request, method=b"POST", body=body)
        status, answer = await self._router.fetch(shard, head)
        document = _document(answer)
        if 400 <= status < 500:
            raise ShardRefused.of(status, document)
        results = document.get("results") if status == 200 and document is not None else None
        if not isinstance(results, list) or len(results) != count:
            raise ShardUnavailable(
                f"the worker of shard {shard} answered {status} to its part of the bulk request; "
                "retry shortly (the request is safe to retry whole)",
                headers={"Retry-After": "1"},
            )
        return results


def _document(answer: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(answer)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _precedence(failure: BaseException) -> int:
    if isinstance(failure, ShardRefused):
        return 0
    if isinstance(failure, ShardUnavailable):
        return 2
    return 1
