"""Callback and claim tokens (sections 7.1, 7.2, 12.9).

A token is ``ds1.<payload>.<mac>``: ``payload`` is base64url JSON naming the subscription (id and
incarnation, so a token outlives neither a delete nor a re-create under the same id), the wake (generation
and wake id), the use (``callback`` for webhooks, ``claim`` for pull-wake leases) and an expiry; ``mac`` is
HMAC-SHA256 over ``ds1.<payload>`` with a server secret persisted in the state directory (so tokens
survive a restart). MACs are compared in constant time. Tokens are accepted only from
``Authorization: Bearer`` and are never logged.

A valid signature proves the server minted the token; whether its wake is still *current* is the state
machine's decision (fencing, section 7.3).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from durastream_server.subscriptions.store import atomic_write

TokenUse = Literal["callback", "claim"]

_PREFIX = "ds1"
_SECRET_FILE = "token-secret"
_SECRET_BYTES = 32
MAX_TOKEN_LENGTH = 4096


class InvalidToken(Exception):
    """Malformed, forged, expired or misdirected. The message is safe to return (it never echoes the token)."""


@dataclass(frozen=True)
class TokenClaims:
    subscription_id: str
    incarnation: str
    generation: int
    wake_id: str
    use: TokenUse
    expires_at: float  # Unix seconds


class TokenAuthority:
    """Mints and verifies tokens with one HMAC secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("token secret too short")
        self._secret = secret

    @classmethod
    def load_or_create(cls, state_dir: Path) -> TokenAuthority:
        """Persisted so tokens issued before a restart stay verifiable after it (blocking)."""
        path = state_dir / _SECRET_FILE
        try:
            secret = path.read_bytes()
        except FileNotFoundError:
            secret = secrets.token_bytes(_SECRET_BYTES)
            state_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, secret, mode=0o600)
        else:
            os.chmod(path, 0o600)
        return cls(secret)

    def mint(self, claims: TokenClaims) -> str:
        payload = {
            "sub": claims.subscription_id,
            "inc": claims.incarnation,
            "gen": claims.generation,
            "wake": claims.wake_id,
            "use": claims.use,
            "exp": int(claims.expires_at),
        }
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8"))
        signed = f"{_PREFIX}.{body}"
        return f"{signed}.{_b64(self._mac(signed))}"

    def verify(self, token: str, *, now: float) -> TokenClaims:
        if len(token) > MAX_TOKEN_LENGTH:
            raise InvalidToken("token too long")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != _PREFIX:
            raise InvalidToken("malformed token")
        try:
            payload_bytes = _unb64(parts[1])
            mac = _unb64(parts[2])
        except ValueError:
            raise InvalidToken("malformed token") from None
        if not hmac.compare_digest(mac, self._mac(f"{parts[0]}.{parts[1]}")):
            raise InvalidToken("token signature is invalid")
        try:
            payload = json.loads(payload_bytes)
            claims = TokenClaims(
                subscription_id=str(payload["sub"]),
                incarnation=str(payload["inc"]),
                generation=int(payload["gen"]),
                wake_id=str(payload["wake"]),
                use=payload["use"],
                expires_at=float(payload["exp"]),
            )
        except (ValueError, KeyError, TypeError):
            raise InvalidToken("malformed token") from None
        if claims.expires_at <= now:
            raise InvalidToken("token expired")
        return claims

    def _mac(self, signed: str) -> bytes:
        return hmac.new(self._secret, signed.encode("ascii"), hashlib.sha256).digest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(ch not in _B64_ALPHABET for ch in text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_B64_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
