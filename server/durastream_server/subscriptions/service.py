"""The subscription service: routes ``/v1/stream/__ds/...`` requests and drives every subscription.

Wiring (app start-up)::

    service = SubscriptionService(
        engine, data_dir.meta_path("subscriptions"), stream_root_url="https://ds.example/v1/stream"
    )
    await service.start()            # loads state, registers itself as the engine's StreamObserver
    response = await service.handle(SubscriptionHttpRequest(...))
    await service.close()            # before the engine closes

The service owns three things the pure state machine (``state.py``) does not:

* the **tail index** (path -> durable next offset), fed by the engine's observer hooks and its stream
  listing, so deciding "is work pending" never reads a stream (and never touches a stream's TTL);
* **side effects** of transitions: persisting state (``store.py``) *before* a wake is delivered or
  announced, webhook POSTs (``webhook.py``), wake events (``pullwake.py``);
* **timers**: one per subscription, at its earliest lease expiry or retry time.

URLs the service hands out (``callback_url`` in webhooks, ``jwks_url`` in descriptions) are built from
``stream_root_url``, which the server derives from ``--public-url``: never from a request's ``Host``,
which the client chooses (a re-confirming PUT with ``Host: attacker.example`` used to redirect every
later callback there).

Callers are authenticated before their body is read and before the subscription is looked up: a
callback, ack or release with a missing, invalid or foreign token gets the same 401 whether the id
exists or not, so ids cannot be probed. (The other routes are guarded by the server's own tokens, in the
HTTP layer, before the service sees them.)

Every transition runs synchronously on the loop (no ``await`` between reading state and changing it), so
two requests racing for one subscription are serialized without locks.

Routes (``subpath`` is relative to ``__ds/``, still percent-encoded):

=======  ===================================  ===============================================
GET      ``jwks.json``                        webhook signing keys (section 6.5)
PUT      ``subscriptions/{id}``               create (201) or re-confirm (200) (section 6.2)
GET      ``subscriptions/{id}``               read (section 6.3)
DELETE   ``subscriptions/{id}``               delete (204)
POST     ``subscriptions/{id}/streams``       add explicit links (204) (section 6.4)
DELETE   ``subscriptions/{id}/streams/{p}``   remove an explicit link (204)
POST     ``subscriptions/{id}/callback``      webhook callback (section 7.1)
POST     ``subscriptions/{id}/claim``         pull-wake claim (section 7.2)
POST     ``subscriptions/{id}/ack``           pull-wake ack / heartbeat
POST     ``subscriptions/{id}/release``       pull-wake release (204)
=======  ===================================  ===============================================
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx

from durastream_server.engine.engine import Engine, StreamObserver
from durastream_server.errors import ProtocolError, StorageFailure
from durastream_server.shards.subscriptions import PeerFeeds, PeerWakeWriter
from durastream_server.subscriptions.errors import (
    ConfigMismatch,
    InvalidField,
    MethodNotAllowed,
    NotFound,
    SubscriptionNotFound,
    Unauthorized,
    WrongSubscriptionType,
    error_body,
)
from durastream_server.subscriptions.glob import compile_pattern
from durastream_server.subscriptions.http_types import (
    ClientGone,
    SubscriptionHttpRequest,
    SubscriptionHttpResponse,
)
from durastream_server.subscriptions.model import (
    PULL_WAKE,
    START_OFFSET,
    WEBHOOK,
    parse_config,
    parse_json_object,
    parse_stream_list,
    parse_wake_request,
    validate_subscription_id,
)
from durastream_server.subscriptions.pullwake import WakeStreamWriter, parse_claim
from durastream_server.subscriptions.signing import JWKS_CONTENT_TYPE, WebhookSigner
from durastream_server.subscriptions.state import RetryState, Subscription, Wake
from durastream_server.subscriptions.store import SubscriptionStore
from durastream_server.subscriptions.tokens import (
    InvalidToken,
    TokenAuthority,
    TokenClaims,
    TokenUse,
    bearer_token,
)
from durastream_server.subscriptions.urls import WebhookUrlPolicy
from durastream_server.subscriptions.webhook import (
    DEFAULT_TIMEOUT_S,
    WebhookSender,
    backoff_delay,
    encode_payload,
)
from durastream_server.timers import RESOLUTION

log = logging.getLogger(__name__)

# Fencing (generation + wake id) is what really bounds a token; the expiry is a second line of defence
# that must outlive any realistic lease kept alive by heartbeats.
TOKEN_TTL_S = 24 * 3600.0
_JSON_HEADERS = {"Content-Type": "application/json", "Cache-Control": "no-store"}
_ACTIONS = ("callback", "claim", "ack", "release")


class _Observer(StreamObserver):
    """Forwards the engine's post-durability hooks; a failure here must never fail the stream write."""

    def __init__(self, service: SubscriptionService) -> None:
        self._service = service

    def on_created(self, path: str, next_offset: str) -> None:
        self._guard(self._service._stream_created, path, next_offset)

    def on_appended(self, path: str, next_offset: str) -> None:
        self._guard(self._service._stream_appended, path, next_offset)

    def on_deleted(self, path: str) -> None:
        self._guard(self._service._stream_deleted, path)

    @staticmethod
    def _guard(handler: Callable[..., None], *args: str) -> None:
        try:
            handler(*args)
        except Exception:
            log.exception("subscription observer failed for %r", args[0])


class SubscriptionService:
    def __init__(
        self,
        engine: Engine,
        state_dir: Path,
        *,
        stream_root_url: str,
        clock: Callable[[], float] = time.time,
        allow_local_webhooks: bool = True,
        webhook_timeout: float = DEFAULT_TIMEOUT_S,
        http_client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        keys_dir: Path | None = None,
        peers: PeerFeeds | None = None,
    ) -> None:
        self._engine = engine
        self._state_dir = Path(state_dir)
        self._root = stream_root_url.rstrip("/")  # e.g. "https://ds.example/v1/stream"
        self._clock = clock
        self._policy = WebhookUrlPolicy(allow_local_dev=allow_local_webhooks)
        self._webhook_timeout = webhook_timeout
        self._http_client = http_client
        self._rng = rng or random.Random()
        self._store = SubscriptionStore(self._state_dir)
        self._subs: dict[str, Subscription] = {}
        self._tails: dict[str, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._signer: WebhookSigner | None = None
        self._tokens: TokenAuthority | None = None
        self._sender: WebhookSender | None = None
        self._wake_writer = WakeStreamWriter(engine, clock)
        # --workers N (shards/subscriptions.py): the server's one keyring, and the other shards' streams.
        self._keys_dir = self._state_dir if keys_dir is None else Path(keys_dir)
        self._peers = peers
        if peers is not None:
            self._wake_writer = PeerWakeWriter(self._wake_writer, peers, clock)
        self._synced = peers is None  # every shard's streams known (always, with one process)
        self._running = False
        self.observer: StreamObserver = _Observer(self)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load keys and state, reconcile links with the streams that exist, resume wakes and timers."""
        self._state_dir.mkdir(parents=True, exist_ok=True)
        self._signer = await asyncio.to_thread(WebhookSigner.load_or_create, self._keys_dir)
        self._tokens = await asyncio.to_thread(TokenAuthority.load_or_create, self._state_dir)
        self._sender = WebhookSender(
            self._signer,
            self._policy,
            clock=self._clock,
            timeout=self._webhook_timeout,
            client=self._http_client,
        )
        records = await asyncio.to_thread(self._store.load_all)
        self._tails = {item.path: item.next_offset for item in self._engine.list_streams()}
        for record in records:
            try:
                sub = Subscription.from_state(record)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("skipping subscription state %r: %s", record.get("id"), exc)
                continue
            self._subs[sub.id] = sub
        self._engine.add_observer(self.observer)
        self._running = True
        if self._peers is not None:
            self._peers.start(self)  # reconciles and resumes once every shard's streams are in
        else:
            self._reconcile_all()
        log.info("subscriptions started: %d loaded", len(self._subs))

    def _reconcile_all(self) -> None:
        for sub in self._subs.values():
            changed = self._reconcile(sub)
            self._resume(sub, changed)

    # -- the other shards' streams (--workers N, shards/subscriptions.py) ---------------------------

    def peer_changed(self, path: str, next_offset: str | None) -> None:
        """A stream of another shard changed, as this worker's own observer hooks would say it."""
        known = self._tails.get(path)
        if next_offset is None:
            if known is not None:
                self._stream_deleted(path)
            return
        if known is not None and next_offset < known:  # deleted and created again meanwhile
            self._stream_deleted(path)
            known = None
        if known is None:
            self._stream_created(path, next_offset)
        else:
            self._stream_appended(path, next_offset)

    async def _peer_tails_now(self, prefix: str | None, explicit: list[str]) -> None:
        """Before links are made at the streams' tails: the other shards' tails as they are now."""
        if self._peers is None:
            return
        for path, tail in await self._peers.tails_now(prefix, explicit):
            known = self._tails.get(path)
            if known is None or tail > known:  # the follower may have heard newer meanwhile
                self.peer_changed(path, tail)

    def peer_snapshot(self, shard: int, live: set[str]) -> None:
        """Every live stream of ``shard`` (after a reset): the ones missing were deleted meanwhile."""
        assert self._peers is not None
        holder = self._peers.holder  # a fork lives in its source's shard (shards/forks.py)
        for path in [p for p in self._tails if p not in live and holder(p) == shard]:
            self._stream_deleted(path)

    def peers_synced(self) -> None:
        """Every other shard's streams are known for the first time: reconcile and resume."""
        if self._synced or not self._running:
            return
        self._synced = True
        self._reconcile_all()
        log.info("subscriptions: every shard's streams known")

    async def close(self) -> None:
        self._running = False
        if self._peers is not None:
            await self._peers.close()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._store.flush()
        if self._sender is not None:
            await self._sender.aclose()

    # -- request routing ---------------------------------------------------------------------------

    async def handle(self, request: SubscriptionHttpRequest) -> SubscriptionHttpResponse:
        try:
            return await self._route(request)
        except ClientGone:
            raise  # nobody to answer
        except ProtocolError as exc:
            return _error_response(exc)
        except Exception:
            log.exception("subscription request %s %s failed", request.method, request.subpath)
            return _error_response(ProtocolError("internal error"))

    async def _route(self, request: SubscriptionHttpRequest) -> SubscriptionHttpResponse:
        if not self._running:
            raise StorageFailure("subscription service is not running")
        parts = request.subpath.split("/")
        method = request.method.upper()
        if parts == ["jwks.json"]:
            _allow(method, "GET", "HEAD")
            return self._jwks(head=method == "HEAD")
        if len(parts) < 2 or parts[0] != "subscriptions" or not parts[1]:
            raise NotFound(f"no control API at __ds/{request.subpath}")
        sub_id = validate_subscription_id(unquote(parts[1]))
        if self._peers is not None:
            self._peers.check_ready()  # 503 while another shard's streams are not known
        rest = parts[2:]
        if not rest:
            _allow(method, "GET", "PUT", "DELETE")
            if method == "PUT":
                return await self._put(sub_id, request)
            if method == "GET":
                return _json(200, self._describe(self._get(sub_id)))
            return await self._delete(sub_id)
        if rest == ["streams"]:
            _allow(method, "POST")
            return await self._add_streams(self._get(sub_id), request)
        if rest[0] == "streams" and len(rest) > 1 and all(rest[1:]):
            _allow(method, "DELETE")
            return await self._remove_stream(self._get(sub_id), unquote("/".join(rest[1:])))
        if len(rest) == 1 and rest[0] in _ACTIONS:
            _allow(method, "POST")
            if rest[0] == "claim":
                return await self._claim(self._get(sub_id), request)
            return await self._answer_wake(sub_id, rest[0], request)
        raise NotFound(f"no control API at __ds/{request.subpath}")

    def _get(self, sub_id: str) -> Subscription:
        sub = self._subs.get(sub_id)
        if sub is None:
            raise SubscriptionNotFound(f"subscription {sub_id!r} does not exist")
        return sub

    # -- handlers ----------------------------------------------------------------------------------

    def _jwks(self, *, head: bool) -> SubscriptionHttpResponse:
        assert self._signer is not None
        body = b"" if head else json.dumps(self._signer.jwks()).encode("ascii")
        return SubscriptionHttpResponse(
            status=200,
            headers={"Content-Type": JWKS_CONTENT_TYPE, "Cache-Control": "public, max-age=300"},
            body=body,
        )

    async def _put(self, sub_id: str, request: SubscriptionHttpRequest) -> SubscriptionHttpResponse:
        config = parse_config(await request.read_body(), self._policy)
        if self._subs.get(sub_id) is None:
            prefix = (
                None if config.pattern is None else compile_pattern(config.pattern).literal_prefix()
            )
            await self._peer_tails_now(prefix, list(config.streams))
        existing = self._subs.get(sub_id)
        if existing is not None:
            if existing.config_hash != config.config_hash():
                raise ConfigMismatch(
                    f"subscription {sub_id!r} exists with a different configuration; "
                    "delete it first to change it"
                )
            return _json(200, self._describe(existing))

        sub = Subscription(
            id=sub_id,
            incarnation=uuid.uuid4().hex,
            config=config,
            created_at=_rfc3339(self._clock()),
        )
        if sub.pattern is not None and self._peers is not None:
            # Every shard's streams, as the followers keep them (shards/subscriptions.py).
            for path, tail in list(self._tails.items()):
                if sub.wants(path):
                    sub.link_glob(path, tail)
        elif sub.pattern is not None:
            # Backfill (section 6.2): existing matches are linked at their tail, so no history replays.
            for listing in self._engine.list_streams(sub.pattern.literal_prefix()):
                self._tails[listing.path] = listing.next_offset
                if sub.wants(listing.path):
                    sub.link_glob(listing.path, listing.next_offset)
        for path in config.streams:
            sub.link_explicit(path, self._tails.get(path, START_OFFSET))
        self._subs[sub_id] = sub
        try:
            await self._save(sub)
        except StorageFailure:
            if self._subs.get(sub_id) is sub:
                del self._subs[sub_id]
            raise
        log.info("subscription %s created (%s, %d links)", sub_id, config.type, len(sub.links))
        return _json(201, self._describe(sub))

    async def _delete(self, sub_id: str) -> SubscriptionHttpResponse:
        sub = self._get(sub_id)
        del self._subs[sub_id]
        # In-flight callbacks/acks/releases now find no subscription (or a new incarnation): they fail
        # and move no cursor (section 6.3).
        sub.deleted = True
        sub.wake = None
        self._cancel_timer(sub_id)
        try:
            await self._store.delete(sub_id)
        except OSError as exc:
            raise StorageFailure(f"could not delete subscription state: {exc}") from None
        log.info("subscription %s deleted", sub_id)
        return SubscriptionHttpResponse(status=204, headers={"Cache-Control": "no-store"})

    async def _add_streams(
        self, sub: Subscription, request: SubscriptionHttpRequest
    ) -> SubscriptionHttpResponse:
        data = parse_json_object(await request.read_body())
        if "streams" not in data:
            raise InvalidField("streams", "is required: an array of stream paths")
        paths = parse_stream_list(data["streams"])
        if sub.config.wake_stream in paths:
            raise InvalidField("streams", "must not include the subscription's own wake_stream")
        await self._peer_tails_now(None, paths)
        changed = False
        for path in paths:
            changed |= sub.link_explicit(path, self._tails.get(path, START_OFFSET))
        if changed:
            await self._save(sub)
        return SubscriptionHttpResponse(status=204, headers={"Cache-Control": "no-store"})

    async def _remove_stream(self, sub: Subscription, path: str) -> SubscriptionHttpResponse:
        if sub.unlink_explicit(path):
            await self._save(sub)
        return SubscriptionHttpResponse(status=204, headers={"Cache-Control": "no-store"})

    async def _claim(
        self, sub: Subscription, request: SubscriptionHttpRequest
    ) -> SubscriptionHttpResponse:
        if sub.config.type != PULL_WAKE:
            raise WrongSubscriptionType("claim is only available for pull-wake subscriptions")
        worker = parse_claim(await request.read_body())
        now = self._clock()
        wake = sub.claim(worker, now, self._tails)
        wake.announced = True  # a claimed wake needs no wake event any more
        token = self._mint(sub, wake, "claim", now)
        self._reschedule(sub)
        await self._save(sub)
        log.info("subscription %s generation %d claimed", sub.id, wake.generation)
        return _json(
            200,
            {
                "wake_id": wake.wake_id,
                "generation": wake.generation,
                "token": token,
                "streams": [item.to_json() for item in wake.streams],
                "lease_ttl_ms": sub.config.lease_ttl_ms,
            },
        )

    async def _answer_wake(
        self, sub_id: str, action: str, request: SubscriptionHttpRequest
    ) -> SubscriptionHttpResponse:
        """callback (webhook), ack and release (pull-wake): authenticate, read, fence, apply."""
        claims = self._authenticate(request, sub_id)
        wake_request = parse_wake_request(await request.read_body())
        sub = self._get(sub_id)  # the token's holder knew the id: a deleted one is a plain 404
        expected_type = WEBHOOK if action == "callback" else PULL_WAKE
        if sub.config.type != expected_type:
            raise WrongSubscriptionType(
                f"{action} is only available for {expected_type} subscriptions"
            )
        now = self._clock()
        use: TokenUse = "callback" if action == "callback" else "claim"
        sub.fence(claims, wake_request, use, now)
        if action == "release":
            pending = sub.release(self._tails)
            next_wake = False
        else:
            pending = next_wake = sub.complete(wake_request, now, self._tails)
        if pending:
            self._wake_if_due(sub, now)
        self._reschedule(sub)
        await self._save(sub)
        if action == "release":
            return SubscriptionHttpResponse(status=204, headers={"Cache-Control": "no-store"})
        return _json(200, {"ok": True, "next_wake": next_wake})

    def _authenticate(self, request: SubscriptionHttpRequest, sub_id: str) -> TokenClaims:
        """The claims of a valid token minted for ``sub_id``, else 401.

        Decided from the token and the path alone, before the subscription is looked up: the answer
        is the same whether ``sub_id`` exists or not. (Whether the token's use and wake fit is for
        ``Subscription.fence`` to say, once the caller has shown it holds a token of this id.)
        """
        assert self._tokens is not None
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise Unauthorized(
                "an 'Authorization: Bearer <token>' header with the wake's token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            claims = self._tokens.verify(token, now=self._clock())
        except InvalidToken as exc:
            raise Unauthorized(str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
        if claims.subscription_id != sub_id:
            raise Unauthorized(
                "token was not issued for this subscription",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return claims

    def _describe(self, sub: Subscription) -> dict[str, Any]:
        signing = None
        if sub.config.type == WEBHOOK:
            assert self._signer is not None
            signing = {
                "alg": "ed25519",
                "kid": self._signer.active_kid,
                "jwks_url": f"{self._root}/__ds/jwks.json",
            }
        return sub.to_json(signing=signing)

    # -- stream events (engine observer) -----------------------------------------------------------

    def _stream_created(self, path: str, next_offset: str) -> None:
        if not self._running:
            return
        self._tails[path] = next_offset
        if not self._synced:
            return  # linked by the reconciliation once every shard's streams are known
        for sub in list(self._subs.values()):
            # Linked *before* the data that created the stream, so that data is pending work.
            linked = sub.wants(path) and sub.link_glob(path, START_OFFSET)
            self._after_stream_change(sub, path, linked)

    def _stream_appended(self, path: str, next_offset: str) -> None:
        if not self._running:
            return
        previous = self._tails.get(path, START_OFFSET)
        self._tails[path] = next_offset
        if not self._synced:
            return
        for sub in list(self._subs.values()):
            # A match we never saw created (e.g. lost in a crash) is linked before this append.
            linked = sub.wants(path) and path not in sub.links and sub.link_glob(path, previous)
            self._after_stream_change(sub, path, linked)

    def _stream_deleted(self, path: str) -> None:
        if not self._running:
            return
        self._tails.pop(path, None)
        for sub in list(self._subs.values()):
            if sub.stream_deleted(path):
                self._spawn(self._save_logged(sub))

    def _after_stream_change(self, sub: Subscription, path: str, linked: bool) -> None:
        if path not in sub.links:
            return
        if not self._wake_if_due(sub, self._clock()) and linked:
            self._spawn(self._save_logged(sub))

    # -- wakes, delivery and timers ----------------------------------------------------------------

    def _wake_if_due(self, sub: Subscription, now: float) -> bool:
        """Issue a wake if the state machine allows one, and start delivering it."""
        wake = sub.maybe_wake(now, self._tails)
        if wake is None:
            return False
        log.debug("subscription %s wake generation %d", sub.id, wake.generation)
        self._dispatch(sub, wake)
        return True

    def _dispatch(self, sub: Subscription, wake: Wake) -> None:
        self._reschedule(sub)
        if sub.config.type == WEBHOOK:
            self._spawn(self._deliver(sub, wake))
        else:
            self._spawn(self._announce(sub, wake))

    async def _deliver(self, sub: Subscription, wake: Wake) -> None:
        """One webhook attempt for ``wake``; persisted first, so a callback never outruns its wake."""
        assert self._sender is not None and sub.config.webhook_url is not None
        await self._save_logged(sub)
        if not sub.is_current(wake):
            return
        now = self._clock()
        callback_url = f"{self._root}/__ds/subscriptions/{quote(sub.id, safe='')}/callback"
        body = encode_payload(
            {
                "subscription_id": sub.id,
                "wake_id": wake.wake_id,
                "generation": wake.generation,
                "streams": [item.to_json() for item in wake.streams],
                "callback_url": callback_url,
                "callback_token": self._mint(sub, wake, "callback", now),
            }
        )
        url = sub.config.webhook_url
        outcome = await self._sender.send(
            url, body, timeout=min(self._webhook_timeout, sub.lease_ttl)
        )
        now = self._clock()
        if not outcome.delivered:
            delay = backoff_delay(sub.retry.attempts + 1, self._rng)
            if sub.delivery_failed(wake, now, delay):
                log.warning(
                    "webhook for subscription %s to %s failed (%s); retry %d in %.1f s",
                    sub.id,
                    urlsplit(url).netloc,
                    outcome.detail,
                    sub.retry.attempts,
                    delay,
                )
        elif outcome.done:
            if sub.auto_ack(wake, self._tails):
                self._wake_if_due(sub, now)
        else:
            sub.delivery_succeeded(wake)
        if not sub.deleted:
            self._reschedule(sub)
            await self._save_logged(sub)

    async def _announce(self, sub: Subscription, wake: Wake) -> None:
        """Write the wake events for an unclaimed pull-wake (after persisting the wake)."""
        assert sub.config.wake_stream is not None
        await self._save_logged(sub)
        if not sub.is_current(wake) or wake.holder is not None:
            return
        try:
            await self._wake_writer.announce(sub.id, sub.config.wake_stream, wake)
        except ProtocolError as exc:
            # The wake stays claimable; workers polling the subscription can still claim it.
            log.warning(
                "subscription %s: cannot write wake event to %r: %s",
                sub.id,
                sub.config.wake_stream,
                exc.message,
            )
            return
        if sub.is_current(wake):
            wake.announced = True
            await self._save_logged(sub)

    def _mint(self, sub: Subscription, wake: Wake, use: TokenUse, now: float) -> str:
        assert self._tokens is not None
        return self._tokens.mint(
            TokenClaims(
                subscription_id=sub.id,
                incarnation=sub.incarnation,
                generation=wake.generation,
                wake_id=wake.wake_id,
                use=use,
                expires_at=now + TOKEN_TTL_S,
            )
        )

    def _reschedule(self, sub: Subscription) -> None:
        self._cancel_timer(sub.id)
        deadline = sub.next_deadline()
        if deadline is None or sub.deleted or not self._running:
            return
        delay = max(RESOLUTION, deadline - self._clock())  # never a 0 ms re-arm (timers.py)
        self._timers[sub.id] = asyncio.get_running_loop().call_later(delay, self._on_timer, sub.id)

    def _cancel_timer(self, sub_id: str) -> None:
        handle = self._timers.pop(sub_id, None)
        if handle is not None:
            handle.cancel()

    def _on_timer(self, sub_id: str) -> None:
        self._timers.pop(sub_id, None)
        sub = self._subs.get(sub_id)
        if sub is None or not self._running:
            return
        try:
            now = self._clock()
            changed = sub.expire(now)
            if changed:
                log.info("subscription %s: lease expired", sub.id)
            retrying = sub.retry_due(now)
            if not self._wake_if_due(sub, now):
                if retrying:
                    sub.retry = RetryState()  # nothing left to deliver: healthy again
                if changed or retrying:
                    self._spawn(self._save_logged(sub))
            self._reschedule(sub)
        except Exception:
            log.exception("subscription %s timer failed", sub_id)

    # -- start-up ----------------------------------------------------------------------------------

    def _reconcile(self, sub: Subscription) -> bool:
        """Make links agree with the streams that exist now (changes may predate a crash)."""
        changed = False
        for path, link in list(sub.links.items()):
            tail = self._tails.get(path)
            if tail is None:
                if link.glob or link.acked_offset != START_OFFSET:
                    sub.stream_deleted(path)  # deleted while we were not watching
                    changed = True
            elif link.acked_offset > tail:
                # The stream was deleted and re-created below our cursor: start over on the new one.
                link.acked_offset = START_OFFSET
                changed = True
        for path in self._tails:
            if sub.wants(path) and path not in sub.links:
                # Its creation was not recorded before a crash: deliver it from the start.
                sub.link_glob(path, START_OFFSET)
                changed = True
        return changed

    def _resume(self, sub: Subscription, changed: bool) -> None:
        now = self._clock()
        changed |= sub.expire(now)
        wake = sub.wake
        if wake is not None and not wake.announced and wake.holder is None:
            self._dispatch(sub, wake)  # delivery or announcement may not have happened
        elif not self._wake_if_due(sub, now) and changed:
            self._spawn(self._save_logged(sub))
        self._reschedule(sub)

    # -- persistence and tasks ---------------------------------------------------------------------

    async def _save(self, sub: Subscription) -> None:
        if sub.deleted:
            return
        try:
            await self._store.save(sub.id, sub.to_state())
        except OSError as exc:
            raise StorageFailure(f"could not persist subscription state: {exc}") from None

    async def _save_logged(self, sub: Subscription) -> None:
        try:
            await self._save(sub)
        except StorageFailure as exc:
            log.error("subscription %s: %s", sub.id, exc.message)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("subscription task failed", exc_info=task.exception())


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise MethodNotAllowed(
            f"{method} is not supported here; use {', '.join(allowed)}",
            headers={"Allow": ", ".join(allowed)},
        )


def _json(status: int, body: dict[str, Any]) -> SubscriptionHttpResponse:
    return SubscriptionHttpResponse(
        status=status, headers=dict(_JSON_HEADERS), body=json.dumps(body).encode("utf-8")
    )


def _error_response(error: ProtocolError) -> SubscriptionHttpResponse:
    headers = dict(_JSON_HEADERS)
    headers.update(error.headers)
    return SubscriptionHttpResponse(
        status=error.status, headers=headers, body=json.dumps(error_body(error)).encode("utf-8")
    )


def _rfc3339(now: float) -> str:
    moment = datetime.fromtimestamp(now, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
