"""The subscription service in-process, on a fake engine, with webhooks answered by a mock transport.

These cover what is awkward to provoke through a real server: a persisted retry schedule honored by a
restarted service, links reconciled with streams changed while state was not recorded, and a missing
wake stream. Each test drives its own event loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from durastream_server.engine.api import AppendRequest, AppendResult, StreamInfo, StreamListing
from durastream_server.errors import NotFound
from durastream_server.offsets import format_offset
from durastream_server.subscriptions.http_types import SubscriptionHttpRequest
from durastream_server.subscriptions.model import START_OFFSET
from durastream_server.subscriptions.service import SubscriptionService

ROOT = "http://127.0.0.1:1/v1/stream"
HOOK = "http://127.0.0.1:9/hook"  # never dialled: the mock transport answers


class FakeEngine:
    """Just the engine surface the service uses: listing, head, append, observers."""

    def __init__(self) -> None:
        self.streams: dict[str, tuple[str, int]] = {}  # path -> (content type, tail position)
        self.appended: dict[str, list[bytes]] = {}
        self.observers: list[Any] = []

    def add_observer(self, observer: Any) -> None:
        self.observers.append(observer)

    def list_streams(self, prefix: str = "") -> list[StreamListing]:
        return [
            StreamListing(path, ctype, format_offset(tail), False)
            for path, (ctype, tail) in sorted(self.streams.items())
            if path.startswith(prefix)
        ]

    def head(self, path: str) -> StreamInfo:
        if path not in self.streams:
            raise NotFound(f"no stream {path}")
        ctype, tail = self.streams[path]
        return StreamInfo(path, "id", ctype, format_offset(tail), False, None, None)

    async def append(self, request: AppendRequest) -> AppendResult:
        ctype, tail = self.head(request.path).content_type, self.streams[request.path][1]
        self.appended.setdefault(request.path, []).append(request.body)
        self.streams[request.path] = (ctype, tail + len(request.body))
        offset = format_offset(tail + len(request.body))
        for observer in self.observers:
            observer.on_appended(request.path, offset)
        return AppendResult(next_offset=offset, closed=False)

    def create(self, path: str, body: bytes = b"", *, notify: bool = True) -> None:
        self.streams[path] = ("application/json", len(body))
        if notify:
            for observer in self.observers:
                observer.on_created(path, format_offset(len(body)))


class Hook:
    """Mock webhook receiver: records request times and answers with a configurable reply."""

    def __init__(self, status: int = 200, reply: dict[str, Any] | None = None) -> None:
        self.status = status
        self.reply = reply or {}
        self.calls: list[tuple[float, dict[str, Any]]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((time.time(), json.loads(request.content)))
        return httpx.Response(self.status, json=self.reply)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))


def call(
    service: SubscriptionService,
    method: str,
    subpath: str,
    body: Any = None,
    token: str | None = None,
):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    raw = json.dumps(body).encode() if body is not None else b""

    async def read_body() -> bytes:
        return raw

    return service.handle(SubscriptionHttpRequest(method, subpath, "", headers, read_body))


async def eventually(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
    return value


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def webhook(pattern: str, **extra: Any) -> dict[str, Any]:
    return {"type": "webhook", "pattern": pattern, "webhook": {"url": HOOK}, **extra}


async def started(engine: FakeEngine, state_dir: Path, hook: Hook) -> SubscriptionService:
    service = SubscriptionService(
        engine, state_dir, stream_root_url=ROOT, http_client=hook.client(), rng=random.Random(7)
    )
    await service.start()
    return service


def test_retry_schedule_is_persisted_and_honored_after_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        failing = Hook(status=500)
        service = await started(engine, tmp_path, failing)
        response = await call(
            service, "PUT", "subscriptions/s1", webhook("ev/*", lease_ttl_ms=30_000)
        )
        assert response.status == 201
        engine.create("ev/a", b"[1]")
        await eventually(lambda: failing.calls)
        await eventually(lambda: service._subs["s1"].retry.attempts == 1)
        await service.close()

        state = json.loads(next((tmp_path / "subscriptions").glob("*.json")).read_text())
        next_attempt_at = state["retry"]["next_attempt_at"]
        assert state["retry"]["attempts"] == 1
        assert 0.8 <= next_attempt_at - failing.calls[0][0] <= 1.2 + 0.5  # 1 s +-20%

        healthy = Hook(reply={"done": True})
        restarted = await started(engine, tmp_path, healthy)
        described = json.loads((await call(restarted, "GET", "subscriptions/s1")).body)
        assert described["status"] == "failed"
        await eventually(lambda: healthy.calls)
        assert healthy.calls[0][0] >= next_attempt_at  # not before the persisted schedule
        assert healthy.calls[0][1]["generation"] == 2
        await eventually(lambda: restarted._subs["s1"].status == "active")
        await restarted.close()

    run(scenario)


def test_restart_reconciles_links_with_existing_streams(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        hook = Hook(reply={"done": True})
        service = await started(engine, tmp_path, hook)
        engine.create("ev/gone")
        engine.create("manual/x", b"[1,2]")
        config = webhook("ev/*", streams=["manual/x"])
        assert (await call(service, "PUT", "subscriptions/s1", config)).status == 201
        await service.close()

        # While no state was recorded: one stream vanished, another matching one appeared with data,
        # and the explicit one was re-created smaller than its cursor.
        del engine.streams["ev/gone"]
        engine.create("ev/new", b"[3]", notify=False)
        engine.streams["manual/x"] = ("application/json", 1)

        restarted = await started(engine, tmp_path, hook)
        links = {s.path: s for s in restarted._subs["s1"].links.values()}
        assert set(links) == {"ev/new", "manual/x"}
        assert links["manual/x"].acked_offset == START_OFFSET
        await eventually(lambda: hook.calls)
        pending = {s["path"] for s in hook.calls[0][1]["streams"] if s["has_pending"]}
        assert pending == {"ev/new", "manual/x"}  # delivered from the start, not skipped
        await restarted.close()

    run(scenario)


def test_missing_wake_stream_leaves_the_wake_claimable(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        service = await started(engine, tmp_path, Hook())
        config = {"type": "pull-wake", "pattern": "ev/*", "wake_stream": "wake/none"}
        assert (await call(service, "PUT", "subscriptions/p1", config)).status == 201
        engine.create("ev/a", b"[1]")
        claim = await call(service, "POST", "subscriptions/p1/claim", {"worker": "w"})
        assert claim.status == 200
        assert json.loads(claim.body)["generation"] == 1
        await service.close()

    run(scenario)


def test_wake_events_are_written_to_the_wake_stream(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        service = await started(engine, tmp_path, Hook())
        engine.create("wake/pool")
        config = {"type": "pull-wake", "pattern": "**", "wake_stream": "wake/pool"}
        assert (await call(service, "PUT", "subscriptions/p1", config)).status == 201
        engine.create("ev/a", b"[1]")
        engine.create("ev/b", b"[2]")  # a wake is already in flight: no second one
        written = await eventually(lambda: engine.appended.get("wake/pool"))
        events = json.loads(written[0])
        assert [(e["type"], e["stream"], e["generation"]) for e in events] == [("wake", "ev/a", 1)]
        # The pattern "**" matches the wake stream, but a subscription never watches its own.
        assert "wake/pool" not in service._subs["p1"].links
        await service.close()

    run(scenario)


def test_jwks_and_method_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await started(FakeEngine(), tmp_path, Hook())
        jwks = await call(service, "GET", "jwks.json")
        assert jwks.status == 200 and jwks.headers["Content-Type"] == "application/jwk-set+json"
        assert json.loads(jwks.body)["keys"][0]["kid"].startswith("ds_")
        wrong = await call(service, "POST", "jwks.json")
        assert wrong.status == 405 and wrong.headers["Allow"] == "GET, HEAD"
        unknown = await call(service, "GET", "subscriptions/s1/unknown")
        assert unknown.status == 404
        assert json.loads(unknown.body)["error"]["code"] == "NOT_FOUND"
        await service.close()

    run(scenario)
