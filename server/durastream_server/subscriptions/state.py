"""One subscription's state machine: links and cursors, wakes, generations and leases (section 7).

Pure and synchronous: every transition takes ``now`` (Unix seconds) and, where it needs them, the current
stream tails (``Tails``: path -> durable next offset). No I/O and no clock of its own, so tests drive it
with a fake clock, and the service can apply a transition and persist its result with no ``await`` in
between (which serializes transitions for free on one event loop).

States::

    idle --(pending work, no retry scheduled)--> wake in flight
        webhook:   lease runs from the wake's issue; valid callbacks extend it
        pull-wake: unclaimed until a claim; the lease runs from the claim; acks without done extend it
    wake in flight --(done / release / lease expiry / delivery failure)--> idle
        (and straight back to a *new* wake, generation + 1, if work is still pending)

A callback, ack or release must match the current wake exactly (token, token generation, request
generation and wake id), else it is ``FENCED`` (section 7.3). Cursors only move forward.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durastream_server.offsets import InvalidOffset, parse_position
from durastream_server.subscriptions.errors import (
    AlreadyClaimed,
    Fenced,
    InvalidField,
    NoPendingWork,
    Unauthorized,
    WrongSubscriptionType,
)
from durastream_server.subscriptions.glob import GlobPattern, cached_pattern
from durastream_server.subscriptions.model import (
    PULL_WAKE,
    START_OFFSET,
    WEBHOOK,
    Link,
    StreamAck,
    SubscriptionConfig,
    WakeRequest,
)
from durastream_server.subscriptions.tokens import TokenClaims, TokenUse

Tails = Mapping[str, str]
STATE_VERSION = 1


def new_wake_id() -> str:
    return "w_" + uuid.uuid4().hex


@dataclass
class StreamSnapshot:
    """A linked stream as a wake saw it."""

    path: str
    link_type: str
    acked_offset: str
    tail_offset: str

    @property
    def has_pending(self) -> bool:
        return self.tail_offset > self.acked_offset

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "link_type": self.link_type,
            "acked_offset": self.acked_offset,
            "tail_offset": self.tail_offset,
            "has_pending": self.has_pending,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> StreamSnapshot:
        return cls(data["path"], data["link_type"], data["acked_offset"], data["tail_offset"])


@dataclass
class Wake:
    wake_id: str
    generation: int
    issued_at: float
    streams: list[StreamSnapshot]
    holder: str | None = None  # pull-wake: the worker that claimed it
    lease_expires_at: float | None = None  # None: no lease running (unclaimed pull-wake)
    announced: bool = False  # webhook delivered / wake event written

    def to_state(self) -> dict[str, Any]:
        return {
            "wake_id": self.wake_id,
            "generation": self.generation,
            "issued_at": self.issued_at,
            "streams": [s.to_json() for s in self.streams],
            "holder": self.holder,
            "lease_expires_at": self.lease_expires_at,
            "announced": self.announced,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Wake:
        return cls(
            wake_id=data["wake_id"],
            generation=int(data["generation"]),
            issued_at=float(data["issued_at"]),
            streams=[StreamSnapshot.from_state(s) for s in data["streams"]],
            holder=data.get("holder"),
            lease_expires_at=data.get("lease_expires_at"),
            announced=bool(data.get("announced")),
        )


@dataclass
class RetryState:
    """Webhook redelivery after failed attempts; persisted so a restart honors the schedule."""

    attempts: int = 0
    next_attempt_at: float | None = None


@dataclass
class Subscription:
    id: str
    incarnation: str  # random per create: tokens of a deleted namesake never validate
    config: SubscriptionConfig
    created_at: str  # RFC 3339, for responses
    links: dict[str, Link] = field(default_factory=dict)
    generation: int = 0
    wake: Wake | None = None
    retry: RetryState = field(default_factory=RetryState)
    deleted: bool = False

    def __post_init__(self) -> None:
        self.config_hash = self.config.config_hash()
        self.pattern: GlobPattern | None = (
            cached_pattern(self.config.pattern) if self.config.pattern is not None else None
        )

    @property
    def lease_ttl(self) -> float:
        return self.config.lease_ttl_ms / 1000.0

    @property
    def status(self) -> str:
        return "failed" if self.retry.attempts > 0 else "active"

    # -- membership (section 6.1, 6.4) -------------------------------------------------------------

    def wants(self, path: str) -> bool:
        """Whether the pattern covers ``path``. A subscription never watches its own wake stream."""
        return (
            self.pattern is not None
            and path != self.config.wake_stream
            and self.pattern.matches(path)
        )

    def link_glob(self, path: str, acked_offset: str) -> bool:
        link = self.links.get(path)
        if link is None:
            self.links[path] = Link(path=path, acked_offset=acked_offset, glob=True)
            return True
        if not link.glob:
            link.glob = True
            return True
        return False

    def link_explicit(self, path: str, acked_offset: str) -> bool:
        """Link at ``acked_offset`` (the current tail); an existing link keeps its cursor."""
        link = self.links.get(path)
        if link is None:
            self.links[path] = Link(path=path, acked_offset=acked_offset, explicit=True)
            return True
        if not link.explicit:
            link.explicit = True
            return True
        return False

    def unlink_explicit(self, path: str) -> bool:
        link = self.links.get(path)
        if link is None or not link.explicit:
            return False
        if link.glob:
            link.explicit = False
        else:
            del self.links[path]
        return True

    def stream_deleted(self, path: str) -> bool:
        """A deleted stream's glob link goes; an explicit link stays, rewound for a re-created stream."""
        link = self.links.get(path)
        if link is None:
            return False
        if link.explicit:
            link.glob = False
            link.acked_offset = START_OFFSET
        else:
            del self.links[path]
        return True

    # -- pending work (section 7) ------------------------------------------------------------------

    def snapshot(self, tails: Tails) -> list[StreamSnapshot]:
        return [
            StreamSnapshot(
                path=link.path,
                link_type=link.link_type,
                acked_offset=link.acked_offset,
                tail_offset=tails.get(link.path, link.acked_offset),
            )
            for link in sorted(self.links.values(), key=lambda item: item.path)
        ]

    def has_pending(self, tails: Tails) -> bool:
        return any(
            tails.get(path, link.acked_offset) > link.acked_offset
            for path, link in self.links.items()
        )

    # -- wakes -------------------------------------------------------------------------------------

    def maybe_wake(self, now: float, tails: Tails) -> Wake | None:
        """Issue a new wake if idle, not waiting out a retry, and work is pending."""
        if self.deleted or self.wake is not None:
            return None
        if self.retry.next_attempt_at is not None and now < self.retry.next_attempt_at:
            return None
        if not self.has_pending(tails):
            return None
        self.generation += 1
        self.wake = Wake(
            wake_id=new_wake_id(),
            generation=self.generation,
            issued_at=now,
            streams=self.snapshot(tails),
            # Webhook leases start when the wake is issued; pull-wake leases start at the claim.
            lease_expires_at=now + self.lease_ttl if self.config.type == WEBHOOK else None,
        )
        return self.wake

    def expire(self, now: float) -> bool:
        """Clear a wake whose lease ran out (holder and token with it). True if one was cleared."""
        wake = self.wake
        if wake is None or wake.lease_expires_at is None or now < wake.lease_expires_at:
            return False
        self.wake = None
        return True

    def claim(self, worker: str, now: float, tails: Tails) -> Wake:
        if self.config.type != PULL_WAKE:
            raise WrongSubscriptionType("claim is only available for pull-wake subscriptions")
        self.expire(now)
        wake = self.wake
        if wake is not None and wake.holder is not None:
            raise AlreadyClaimed(wake.holder, wake.generation)
        if not self.has_pending(tails):
            self.wake = None
            raise NoPendingWork("no linked stream has data past its acked offset")
        if wake is None:
            wake = self.maybe_wake(now, tails)
            assert wake is not None
        wake.streams = self.snapshot(tails)
        wake.holder = worker
        wake.lease_expires_at = now + self.lease_ttl
        return wake

    def fence(self, claims: TokenClaims, request: WakeRequest, use: TokenUse, now: float) -> Wake:
        """The wake a callback/ack/release answers, if it is the current one (section 7.3)."""
        if claims.subscription_id != self.id or claims.use != use:
            raise Unauthorized(f"token is not a {use} token for this subscription")
        if claims.incarnation != self.incarnation:
            raise Fenced("token belongs to a deleted subscription with the same id")
        self.expire(now)
        wake = self.wake
        if wake is None:
            raise Fenced("no wake is in flight: it was completed, released or its lease expired")
        if claims.generation != wake.generation or request.generation != wake.generation:
            raise Fenced(f"generation is stale: the current generation is {wake.generation}")
        if claims.wake_id != wake.wake_id or request.wake_id != wake.wake_id:
            raise Fenced("wake_id does not match the current wake")
        if use == "claim" and wake.holder is None:
            raise Fenced("the wake is not claimed")
        return wake

    def complete(self, request: WakeRequest, now: float, tails: Tails) -> bool:
        """Apply a fenced callback/ack. ``done`` ends the wake; otherwise it is a heartbeat.

        Returns ``next_wake``: whether work is still pending after a done (a new wake follows).
        """
        self.apply_acks(request.acks, tails)
        assert self.wake is not None
        if not request.done:
            self.wake.lease_expires_at = now + self.lease_ttl
            return False
        self.wake = None
        return self.has_pending(tails)

    def release(self, tails: Tails) -> bool:
        """End a fenced wake without acking. Returns whether work is still pending."""
        self.wake = None
        return self.has_pending(tails)

    def apply_acks(self, acks: Iterable[StreamAck], tails: Tails) -> None:
        """Validate every ack first, then move cursors forward (all or nothing).

        Acks for streams no longer linked are ignored: the link (and its cursor) is gone, and failing the
        whole request would also drop the ``done`` that came with it.
        """
        updates: list[tuple[Link, str]] = []
        for i, ack in enumerate(acks):
            try:
                parse_position(ack.offset)
            except InvalidOffset:
                raise InvalidField(
                    f"acks[{i}].offset", "must be an offset token returned by the server"
                ) from None
            link = self.links.get(ack.stream)
            if link is None:
                continue
            tail = tails.get(ack.stream)
            if tail is not None and ack.offset > tail:
                raise InvalidField(
                    f"acks[{i}].offset", f"is beyond the stream's tail offset {tail}"
                )
            updates.append((link, ack.offset))
        for link, offset in updates:
            if offset > link.acked_offset:
                link.acked_offset = offset

    # -- webhook delivery outcomes (section 7.1) ---------------------------------------------------

    def is_current(self, wake: Wake) -> bool:
        return not self.deleted and self.wake is wake

    def delivery_succeeded(self, wake: Wake) -> None:
        if self.is_current(wake):
            wake.announced = True
        self.retry = RetryState()

    def auto_ack(self, wake: Wake, tails: Tails) -> bool:
        """``{"done": true}`` from the receiver: ack the snapshot's tails and end the wake.

        Returns whether work is still pending (events that arrived after the snapshot).
        """
        if not self.is_current(wake):
            return False
        for item in wake.streams:
            link = self.links.get(item.path)
            tail = tails.get(item.path)
            if link is None or (tail is not None and item.tail_offset > tail):
                continue  # unlinked, or the stream was re-created below the snapshot
            if item.tail_offset > link.acked_offset:
                link.acked_offset = item.tail_offset
        self.wake = None
        self.retry = RetryState()
        return self.has_pending(tails)

    def delivery_failed(self, wake: Wake, now: float, delay: float) -> bool:
        """End the wake and schedule a retry ``delay`` seconds out. False if the wake was stale."""
        if not self.is_current(wake):
            return False
        self.wake = None
        self.retry = RetryState(attempts=self.retry.attempts + 1, next_attempt_at=now + delay)
        return True

    def retry_due(self, now: float) -> bool:
        if self.retry.next_attempt_at is None or now < self.retry.next_attempt_at:
            return False
        self.retry.next_attempt_at = None
        return True

    def next_deadline(self) -> float | None:
        """When the service must next call ``expire``/``retry_due``: the earliest timer, if any."""
        deadlines = [
            t
            for t in (
                self.wake.lease_expires_at if self.wake is not None else None,
                self.retry.next_attempt_at,
            )
            if t is not None
        ]
        return min(deadlines) if deadlines else None

    # -- serialization -----------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "id": self.id,
            "incarnation": self.incarnation,
            "created_at": self.created_at,
            "config": self.config.canonical(),
            "links": [link.to_state() for link in self.links.values()],
            "generation": self.generation,
            "wake": self.wake.to_state() if self.wake is not None else None,
            "retry": {
                "attempts": self.retry.attempts,
                "next_attempt_at": self.retry.next_attempt_at,
            },
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Subscription:
        # State written before --public-url also holds "stream_root_url" (taken from a request's Host
        # header); it is ignored: callback URLs come from the server's configuration now.
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported subscription state version {data.get('version')!r}")
        retry = data.get("retry") or {}
        links = [Link.from_state(item) for item in data.get("links", [])]
        return cls(
            id=data["id"],
            incarnation=data["incarnation"],
            config=SubscriptionConfig.from_canonical(data["config"]),
            created_at=data["created_at"],
            links={link.path: link for link in links},
            generation=int(data.get("generation", 0)),
            wake=Wake.from_state(data["wake"]) if data.get("wake") else None,
            retry=RetryState(
                attempts=int(retry.get("attempts", 0)),
                next_attempt_at=retry.get("next_attempt_at"),
            ),
        )

    def to_json(self, *, signing: Mapping[str, str] | None) -> dict[str, Any]:
        """The GET/PUT response body (section 6.3). Never includes any secret."""
        webhook = None
        if self.config.webhook_url is not None:
            webhook = {"url": self.config.webhook_url}
            if signing is not None:
                webhook["signing"] = dict(signing)  # type: ignore[assignment]
        return {
            "id": self.id,
            "subscription_id": self.id,
            "type": self.config.type,
            "pattern": self.config.pattern,
            "streams": [
                link.to_json() for link in sorted(self.links.values(), key=lambda item: item.path)
            ],
            "webhook": webhook,
            "wake_stream": self.config.wake_stream,
            "lease_ttl_ms": self.config.lease_ttl_ms,
            "created_at": self.created_at,
            "status": self.status,
            "description": self.config.description,
        }
