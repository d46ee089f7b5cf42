"""Webhook delivery (section 7.1): one signed POST per wake, and the retry backoff policy.

``WebhookSender.send`` performs one attempt and reports what happened; it never touches subscription
state. The service decides what the outcome means (auto-ack on ``{"done": true}``, retry on failure), so
delivery can be tested against a local receiver on its own.

Before each attempt the target host is resolved and every address is checked against the URL policy
(a name validated at creation may point somewhere private today). Redirects are not followed and proxy
environment variables are ignored: both would let the request leave the validated target.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from durastream_server.subscriptions import jsonbody
from durastream_server.subscriptions.errors import WebhookUrlRejected
from durastream_server.subscriptions.signing import SIGNATURE_HEADER, WebhookSigner
from durastream_server.subscriptions.urls import WebhookUrlPolicy, literal_address

log = logging.getLogger(__name__)
# httpx logs every request line at INFO; webhook URLs may carry credentials in their query string.
logging.getLogger("httpx").setLevel(logging.WARNING)

INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
JITTER = 0.2
MAX_RESPONSE_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 10.0


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Delay before retry number ``attempt`` (1-based): 1 s doubling to 60 s, +-20% jitter."""
    base = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2 ** max(0, attempt - 1))
    return base * rng.uniform(1.0 - JITTER, 1.0 + JITTER)


@dataclass(frozen=True)
class DeliveryOutcome:
    delivered: bool  # a 2xx answer
    done: bool = False  # ... whose body was {"done": true}
    detail: str = ""  # why it failed, for logs (never contains the token)


def encode_payload(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class WebhookSender:
    def __init__(
        self,
        signer: WebhookSigner,
        policy: WebhookUrlPolicy,
        *,
        clock: Callable[[], float],
        timeout: float = DEFAULT_TIMEOUT_S,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._signer = signer
        self._policy = policy
        self._clock = clock
        self._client = client or httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
            headers={"User-Agent": "durastream-server"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(self, url: str, body: bytes, *, timeout: float | None = None) -> DeliveryOutcome:
        """One attempt. ``timeout`` caps the whole exchange (the service passes the lease, so a slow
        receiver cannot hold a delivery open past the wake it belongs to)."""
        try:
            await self._check_target(url)
        except WebhookUrlRejected as exc:
            return DeliveryOutcome(delivered=False, detail=f"target refused: {exc.message}")
        except OSError as exc:
            return DeliveryOutcome(delivered=False, detail=f"cannot resolve host: {exc}")
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: self._signer.signature_header(body, now=self._clock()),
        }
        try:
            request = self._client.stream(
                "POST",
                url,
                content=body,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
            async with request as response:
                raw = await _read_capped(response)
                status = response.status_code
        except httpx.HTTPError as exc:
            return DeliveryOutcome(delivered=False, detail=f"{type(exc).__name__}: {exc}")
        if not 200 <= status < 300:
            return DeliveryOutcome(delivered=False, detail=f"receiver answered HTTP {status}")
        return DeliveryOutcome(delivered=True, done=_is_done(raw))

    async def _check_target(self, url: str) -> None:
        self._policy.validate(url)
        parts = urlsplit(url)
        host = parts.hostname or ""
        if literal_address(host) is not None:
            return  # validated above: nothing to resolve
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        self._policy.check_resolved(host, [str(info[4][0]) for info in infos])


async def _read_capped(response: httpx.Response) -> bytes:
    """Read at most MAX_RESPONSE_BYTES: a receiver cannot make the server buffer without bound."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            break
    return b"".join(chunks)[:MAX_RESPONSE_BYTES]


def _is_done(raw: bytes) -> bool:
    """Whether the receiver answered ``{"done": true}``. Anything else, malformed or nested without
    bound included, is a delivery without ``done``: the wake stays in flight until a callback."""
    try:
        value = jsonbody.loads(raw) if raw.strip() else None
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("done") is True
