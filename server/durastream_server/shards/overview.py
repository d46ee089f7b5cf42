"""``/healthz`` and ``/metrics`` of the whole server with ``--workers N`` (decision 0009, "What is left" 4).

A load balancer or Prometheus reaches whichever worker the kernel gives its connection, so answering
for that worker alone would describe a random shard. The worker that receives either request asks
every other worker for its own answer (the same request, marked as a shard's part, over the Unix
sockets the router keeps open: ``fanout.request_head``, ``router.ShardRouter.fetch``; a worker
answers for itself alone only when the mark arrives on that socket, ``fanout.is_shard_page``) and
answers one document for all of them:

- **Health** (``whole_health``): the receiving worker's own document, its figures summed over the
  shards, plus ``shards`` (each worker's own document, with its ``index``) and ``unhealthy_shards``.
  The server is healthy (200, ``ok``) when every shard answers ``ok``; a shard draining, answering
  anything else or not answering within ``PEER_ANSWER_SECONDS`` makes it 503 ``unhealthy``, naming
  the shard, so a load balancer stops sending to a server that would fail some streams' requests.
- **Metrics** (``metrics/shards.py``): every shard's series with a ``shard`` label, and
  ``durastream_shard_up``; a shard that does not answer only loses its series (never a 5xx: a scrape
  must still show the shards that do answer).

The bound is short (a health probe or a scrape has its own timeout, often a few seconds) and applies
to each worker separately: they are asked at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Final

from durastream_server.errors import ShardUnavailable
from durastream_server.shards.fanout import request_head

if TYPE_CHECKING:
    from durastream_server.http.handlers import Request
    from durastream_server.shards.router import ShardRouter

logger = logging.getLogger(__name__)

# How long the receiving worker waits for another worker's own health or metrics (each, concurrently).
PEER_ANSWER_SECONDS: Final = 2.0
# Top-level health figures that are counts of each shard's: the whole server's is their sum.
_SUMMED: Final = (
    "waiters",
    "streams_pending",
    "packed_streams",
    "packs_bytes",
    "quarantined_count",
)

Answer = tuple[int, bytes]


async def ask_the_others(router: ShardRouter, request: Request) -> dict[int, Answer | None]:
    """Every other worker's answer to ``request`` (as a shard's part), by shard; None for a worker
    that did not answer within ``PEER_ANSWER_SECONDS``."""
    head = request_head(request)
    others = [shard for shard in range(router.count) if shard != router.index]
    answers = await asyncio.gather(*(_ask(router, shard, head) for shard in others))
    return dict(zip(others, answers, strict=True))


async def _ask(router: ShardRouter, shard: int, head: bytes) -> Answer | None:
    try:
        return await asyncio.wait_for(router.fetch(shard, head), PEER_ANSWER_SECONDS)
    except (ShardUnavailable, asyncio.TimeoutError):
        logger.warning(
            "the worker of shard %d did not answer %s within %.0f s",
            shard,
            head.split(b" ", 2)[1].decode("latin-1"),
            PEER_ANSWER_SECONDS,
        )
        return None


def _shard_health(shard: int, answer: Answer | None) -> dict[str, Any]:
    """One shard's entry of ``shards``: its own document, or why there is none."""
    if answer is None:
        return {
            "index": shard,
            "status": "unavailable",
            "error": f"did not answer within {PEER_ANSWER_SECONDS:g} s (restarting?)",
        }
    status, body = answer
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if not isinstance(document, dict) or "status" not in document:
        return {"index": shard, "status": "unavailable", "error": f"answered {status}"}
    return {"index": shard, **document}


def whole_health(
    own_index: int, own: dict[str, Any], answers: dict[int, Answer | None], quarantine_list: int
) -> tuple[int, dict[str, Any]]:
    """The whole server's health (module docstring) and its status code, from this worker's own
    document ``own`` and the others' ``answers``."""
    shards = sorted(
        [{"index": own_index, **own}, *(_shard_health(k, a) for k, a in answers.items())],
        key=lambda entry: entry["index"],
    )
    unhealthy = [entry["index"] for entry in shards if entry["status"] != "ok"]
    document = dict(own)
    if own["status"] == "ok" and unhealthy:
        document["status"] = "unhealthy"
    answered = [entry for entry in shards if "error" not in entry]
    for name in _SUMMED:
        if name in own:
            document[name] = sum(entry.get(name, 0) for entry in answered)
    if "recovering" in own:
        document["recovering"] = any(entry.get("recovering", False) for entry in answered)
    if "quarantined" in own:
        listed = [
            {"shard": entry["index"], **item}
            for entry in answered
            for item in entry.get("quarantined", [])
        ]
        document["quarantined"] = listed[:quarantine_list]
    document["shards"] = shards
    document["unhealthy_shards"] = unhealthy
    return (200 if not unhealthy else 503), document
