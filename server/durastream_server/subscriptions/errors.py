"""Subscription errors: the shared ``ProtocolError`` types plus the codes sections 6-7 define.

Each error carries its status in its type and may carry extra JSON members (``details``) that the protocol
puts next to ``code``, e.g. ``current_holder`` for ``ALREADY_CLAIMED``. ``field`` names the request member
that was rejected, so a client can tell *which* input to fix.
"""

from __future__ import annotations

from typing import Any

from durastream_server.errors import (
    BadRequest,
    Conflict,
    InvalidJson,
    MethodNotAllowed,
    NotFound,
    ProtocolError,
    Unauthorized,
)

__all__ = [
    "AlreadyClaimed",
    "BadRequest",
    "ConfigMismatch",
    "Fenced",
    "InvalidJson",
    "InvalidField",
    "MethodNotAllowed",
    "NoPendingWork",
    "NotFound",
    "ProtocolError",
    "SubscriptionNotFound",
    "Unauthorized",
    "WebhookUrlRejected",
    "WrongSubscriptionType",
    "error_body",
]


class InvalidField(BadRequest):
    """A request member is missing or malformed. The message says what is accepted."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class WebhookUrlRejected(InvalidField):
    code = "WEBHOOK_URL_REJECTED"

    def __init__(self, message: str) -> None:
        super().__init__("webhook.url", message)


class SubscriptionNotFound(NotFound):
    code = "SUBSCRIPTION_NOT_FOUND"


class ConfigMismatch(Conflict):
    """PUT of an existing id with a different normalized configuration (section 6.2)."""

    code = "SUBSCRIPTION_CONFIG_MISMATCH"


class Fenced(Conflict):
    """Stale or mismatched wake_id/generation/token (section 7.3)."""

    code = "FENCED"


class AlreadyClaimed(Conflict):
    code = "ALREADY_CLAIMED"

    def __init__(self, holder: str, generation: int) -> None:
        super().__init__(f"subscription is claimed by {holder!r} at generation {generation}")
        self.details = {"current_holder": holder, "generation": generation}


class NoPendingWork(Conflict):
    """A claim when no linked stream has unacked data: there is nothing to lease."""

    code = "NO_PENDING_WORK"


class WrongSubscriptionType(Conflict):
    """E.g. a claim on a webhook subscription: the operation exists, but not for this delivery type."""

    code = "WRONG_SUBSCRIPTION_TYPE"


def error_body(error: ProtocolError) -> dict[str, Any]:
    inner: dict[str, Any] = {"code": error.code, "message": error.message}
    field = getattr(error, "field", None)
    if field is not None:
        inner["field"] = field
    inner.update(getattr(error, "details", {}))
    return {"error": inner}
