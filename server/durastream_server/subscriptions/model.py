"""Subscription configuration (section 6.2) and stream links (section 6.1), as plain values.

``parse_config`` turns a PUT body into a ``SubscriptionConfig`` once; nothing downstream re-reads JSON.
The configuration is immutable for the life of a subscription: re-confirmation compares ``config_hash``
(a SHA-256 over a canonical JSON form of the normalized fields), so two PUTs that differ only in member
order, duplicate ``streams`` entries or an omitted default compare equal.

Explicit links added later through ``POST .../streams`` are *state*, not configuration: they do not change
the hash, so re-confirming with the original body still answers 200.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from durastream_server.offsets import format_offset
from durastream_server.subscriptions import jsonbody
from durastream_server.subscriptions.errors import InvalidField, InvalidJson
from durastream_server.subscriptions.glob import InvalidPattern, compile_pattern
from durastream_server.subscriptions.urls import WebhookUrlPolicy

WEBHOOK = "webhook"
PULL_WAKE = "pull-wake"
SubscriptionType = Literal["webhook", "pull-wake"]

DEFAULT_LEASE_TTL_MS = 30_000
MIN_LEASE_TTL_MS = 1_000
MAX_LEASE_TTL_MS = 600_000
MAX_PATH_LENGTH = 4096
MAX_DESCRIPTION_LENGTH = 4096
MAX_STREAMS = 10_000
MAX_ID_LENGTH = 256
RESERVED_PREFIX = "__ds"

# The cursor of a link whose stream has no data yet (or does not exist yet): "before everything".
START_OFFSET = format_offset(0)

_CONFIG_FIELDS = frozenset(
    {"type", "pattern", "streams", "webhook", "wake_stream", "lease_ttl_ms", "description"}
)


@dataclass(frozen=True)
class SubscriptionConfig:
    type: SubscriptionType
    pattern: str | None
    streams: tuple[str, ...]  # sorted, without duplicates
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    description: str | None = None

    def canonical(self) -> dict[str, Any]:
        """The normalized form that is hashed and persisted."""
        return {
            "type": self.type,
            "pattern": self.pattern,
            "streams": list(self.streams),
            "webhook": {"url": self.webhook_url} if self.webhook_url is not None else None,
            "wake_stream": self.wake_stream,
            "lease_ttl_ms": self.lease_ttl_ms,
            "description": self.description,
        }

    def config_hash(self) -> str:
        text = json.dumps(
            self.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=True
        )
        return hashlib.sha256(text.encode("ascii")).hexdigest()

    @classmethod
    def from_canonical(cls, data: dict[str, Any]) -> SubscriptionConfig:
        webhook = data.get("webhook")
        return cls(
            type=data["type"],
            pattern=data.get("pattern"),
            streams=tuple(data.get("streams") or ()),
            webhook_url=webhook["url"] if webhook else None,
            wake_stream=data.get("wake_stream"),
            lease_ttl_ms=int(data.get("lease_ttl_ms", DEFAULT_LEASE_TTL_MS)),
            description=data.get("description"),
        )


@dataclass
class Link:
    """One subscribed stream and its cursor. A stream may be linked both ways at once."""

    path: str
    acked_offset: str = START_OFFSET
    explicit: bool = False
    glob: bool = False

    @property
    def link_type(self) -> str:
        return "explicit" if self.explicit else "glob"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "link_type": self.link_type, "acked_offset": self.acked_offset}

    def to_state(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "acked_offset": self.acked_offset,
            "explicit": self.explicit,
            "glob": self.glob,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Link:
        return cls(
            path=data["path"],
            acked_offset=data["acked_offset"],
            explicit=bool(data.get("explicit")),
            glob=bool(data.get("glob")),
        )


@dataclass(frozen=True)
class StreamAck:
    stream: str
    offset: str


@dataclass(frozen=True)
class WakeRequest:
    """The body of a callback, ack or release (sections 7.1, 7.2)."""

    wake_id: str
    generation: int
    acks: tuple[StreamAck, ...] = field(default=())
    done: bool = False


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        value = jsonbody.loads(body) if body.strip() else None
    except ValueError as exc:  # not UTF-8, not JSON, or nested deeper than jsonbody.MAX_DEPTH
        raise InvalidJson(f"request body is not accepted JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidJson("request body must be a JSON object")
    return value


def validate_subscription_id(text: str) -> str:
    if not text or len(text) > MAX_ID_LENGTH:
        raise InvalidField("id", f"must be 1 to {MAX_ID_LENGTH} characters")
    if "/" in text or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise InvalidField("id", "must not contain '/' or control characters")
    return text


def validate_stream_path(value: object, field_name: str) -> str:
    """A stream-root-relative path, as used in request and response bodies."""
    if not isinstance(value, str) or not value:
        raise InvalidField(
            field_name, "must be a non-empty stream path string such as 'events/abc'"
        )
    if len(value) > MAX_PATH_LENGTH:
        raise InvalidField(field_name, f"must be at most {MAX_PATH_LENGTH} characters")
    if value.startswith("/"):
        raise InvalidField(field_name, "must be stream-root-relative (no leading '/')")
    if value == RESERVED_PREFIX or value.startswith(RESERVED_PREFIX + "/"):
        raise InvalidField(field_name, f"'{RESERVED_PREFIX}/' paths are reserved, not streams")
    if "\x00" in value:
        raise InvalidField(field_name, "must not contain NUL")
    return value


def parse_stream_list(value: object, field_name: str = "streams") -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidField(field_name, "must be an array of stream path strings")
    if len(value) > MAX_STREAMS:
        raise InvalidField(field_name, f"must have at most {MAX_STREAMS} entries")
    paths = {validate_stream_path(item, f"{field_name}[{i}]") for i, item in enumerate(value)}
    return tuple(sorted(paths))


def parse_config(body: bytes, url_policy: WebhookUrlPolicy) -> SubscriptionConfig:
    """Validate and normalize a PUT body. Every rejection names the field and what is accepted."""
    data = parse_json_object(body)
    unknown = sorted(set(data) - _CONFIG_FIELDS)
    if unknown:
        raise InvalidField(
            unknown[0], f"unknown field; accepted fields are {', '.join(sorted(_CONFIG_FIELDS))}"
        )

    kind = data.get("type")
    if kind not in (WEBHOOK, PULL_WAKE):
        raise InvalidField("type", "is required and must be 'webhook' or 'pull-wake'")

    pattern = data.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise InvalidField("pattern", "must be a glob string such as 'events/*'")
        if len(pattern) > MAX_PATH_LENGTH:
            raise InvalidField("pattern", f"must be at most {MAX_PATH_LENGTH} characters")
        try:
            compile_pattern(pattern)
        except InvalidPattern as exc:
            raise InvalidField("pattern", str(exc)) from None

    streams: tuple[str, ...] = ()
    if data.get("streams") is not None:
        streams = parse_stream_list(data["streams"])
    if pattern is None and not streams:
        raise InvalidField(
            "pattern", "at least one of 'pattern' or a non-empty 'streams' is required"
        )

    webhook_url = None
    wake_stream = None
    if kind == WEBHOOK:
        webhook = data.get("webhook")
        if not isinstance(webhook, dict) or "url" not in webhook:
            raise InvalidField("webhook.url", "is required for type 'webhook'")
        extra = sorted(set(webhook) - {"url"})
        if extra:
            raise InvalidField(f"webhook.{extra[0]}", "unknown field; 'webhook' accepts only 'url'")
        webhook_url = url_policy.validate(webhook["url"])
        if data.get("wake_stream") is not None:
            raise InvalidField("wake_stream", "is only accepted for type 'pull-wake'")
    else:
        if data.get("webhook") is not None:
            raise InvalidField("webhook", "is only accepted for type 'webhook'")
        if data.get("wake_stream") is None:
            raise InvalidField("wake_stream", "is required for type 'pull-wake'")
        wake_stream = validate_stream_path(data["wake_stream"], "wake_stream")
        if wake_stream in streams:
            raise InvalidField("streams", "must not include the subscription's own wake_stream")

    lease_ttl_ms = data.get("lease_ttl_ms", DEFAULT_LEASE_TTL_MS)
    if lease_ttl_ms is None:
        lease_ttl_ms = DEFAULT_LEASE_TTL_MS
    if (
        isinstance(lease_ttl_ms, bool)
        or not isinstance(lease_ttl_ms, int)
        or not MIN_LEASE_TTL_MS <= lease_ttl_ms <= MAX_LEASE_TTL_MS
    ):
        raise InvalidField(
            "lease_ttl_ms",
            f"must be an integer from {MIN_LEASE_TTL_MS} (1 s) to {MAX_LEASE_TTL_MS} (10 min)",
        )

    description = data.get("description")
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION_LENGTH
    ):
        raise InvalidField(
            "description", f"must be a string of at most {MAX_DESCRIPTION_LENGTH} characters"
        )

    return SubscriptionConfig(
        type=kind,
        pattern=pattern,
        streams=streams,
        webhook_url=webhook_url,
        wake_stream=wake_stream,
        lease_ttl_ms=lease_ttl_ms,
        description=description,
    )


def parse_wake_request(body: bytes) -> WakeRequest:
    """Parse a callback/ack/release body. Offsets are checked against stream tails later."""
    data = parse_json_object(body)
    wake_id = data.get("wake_id")
    if not isinstance(wake_id, str) or not wake_id:
        raise InvalidField("wake_id", "is required: the wake_id of the wake being answered")
    generation = data.get("generation")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise InvalidField(
            "generation", "is required: the non-negative integer generation of the wake"
        )
    done = data.get("done", False)
    if not isinstance(done, bool):
        raise InvalidField("done", "must be true or false")
    raw_acks = data.get("acks", [])
    if raw_acks is None:
        raw_acks = []
    if not isinstance(raw_acks, list):
        raise InvalidField("acks", "must be an array of {stream, offset} objects")
    acks = []
    for i, item in enumerate(raw_acks):
        if not isinstance(item, dict):
            raise InvalidField(f"acks[{i}]", "must be an object {stream, offset}")
        stream = validate_stream_path(item.get("stream"), f"acks[{i}].stream")
        offset = item.get("offset")
        if not isinstance(offset, str) or not offset:
            raise InvalidField(
                f"acks[{i}].offset", "must be an offset string returned by the server"
            )
        acks.append(StreamAck(stream=stream, offset=offset))
    return WakeRequest(wake_id=wake_id, generation=generation, acks=tuple(acks), done=done)
