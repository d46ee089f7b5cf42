"""Webhook signing keys and signatures (sections 6.5, 7.1, 12.10).

The server signs every webhook with an Ed25519 private key and publishes the public keys as a JWK Set.
Keys live in ``<state_dir>/webhook-signing-keys.json`` (mode 0600), so receivers that cached the JWKS keep
verifying across restarts. Each ``kid`` is ``ds_`` + the RFC 7638 JWK thumbprint of the public key: stable
for the key's lifetime, unique per key, and derivable by anyone holding the public key.

The keyring can hold several keys; ``rotate()`` makes a new key active and keeps publishing the old ones,
because deliveries signed with them may still be inside a receiver's replay window.

Header: ``Webhook-Signature: t=<unix seconds>,kid=<kid>,ed25519=<unpadded base64url>``, signed over the
bytes ``<t>.<raw body>``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from durastream_server.subscriptions.store import atomic_write

log = logging.getLogger(__name__)

_KEYRING_FILE = "webhook-signing-keys.json"
JWKS_CONTENT_TYPE = "application/jwk-set+json"
SIGNATURE_HEADER = "Webhook-Signature"


@dataclass(frozen=True)
class SigningKey:
    kid: str
    private_key: Ed25519PrivateKey
    created_at: float

    @classmethod
    def generate(cls, now: float) -> SigningKey:
        key = Ed25519PrivateKey.generate()
        return cls(kid=thumbprint_kid(public_x(key)), private_key=key, created_at=now)

    def public_jwk(self) -> dict[str, str]:
        return {
            "kty": "OKP",
            "crv": "Ed25519",
            "kid": self.kid,
            "use": "sig",
            "alg": "EdDSA",
            "x": public_x(self.private_key),
        }


def public_x(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return b64url(raw)


def thumbprint_kid(x: str) -> str:
    """RFC 7638: SHA-256 over the required members, lexicographic order, no whitespace."""
    canonical = json.dumps(
        {"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True
    )
    return "ds_" + b64url(hashlib.sha256(canonical.encode("ascii")).digest())


class WebhookSigner:
    """The keyring: signs with the active key, publishes every key it still holds."""

    def __init__(self, path: Path, keys: list[SigningKey], active_kid: str) -> None:
        self._path = path
        self._keys = keys
        self._active = next(key for key in keys if key.kid == active_kid)

    @classmethod
    def load_or_create(cls, state_dir: Path, *, now: float | None = None) -> WebhookSigner:
        """Blocking; called once at start."""
        path = state_dir / _KEYRING_FILE
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            key = SigningKey.generate(time.time() if now is None else now)
            signer = cls(path, [key], key.kid)
            signer._persist()
            # DEBUG: a kid is a public key's thumbprint, not a secret, but an operator reading
            # "ds_..." at start-up cannot tell; it is in GET .../jwks.json for whoever needs it.
            log.debug("generated webhook signing key %s", key.kid)
            return signer
        keys = [_key_from_state(item) for item in data["keys"]]
        return cls(path, keys, data["active"])

    @property
    def active_kid(self) -> str:
        return self._active.kid

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.public_jwk() for key in self._keys]}

    def signature_header(self, body: bytes, *, now: float) -> str:
        timestamp = int(now)
        signature = self._active.private_key.sign(f"{timestamp}.".encode("ascii") + body)
        return f"t={timestamp},kid={self._active.kid},ed25519={b64url(signature)}"

    def rotate(self, *, now: float | None = None) -> str:
        """Activate a fresh key; old keys stay published. Blocking (persists the keyring)."""
        key = SigningKey.generate(time.time() if now is None else now)
        self._keys.append(key)
        self._active = key
        self._persist()
        return key.kid

    def _persist(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "active": self._active.kid,
            "keys": [
                {
                    "kid": key.kid,
                    "created_at": key.created_at,
                    "private_key": b64url(
                        key.private_key.private_bytes(
                            Encoding.Raw, PrivateFormat.Raw, NoEncryption()
                        )
                    ),
                }
                for key in self._keys
            ],
        }
        atomic_write(self._path, json.dumps(state, indent=1).encode("ascii"), mode=0o600)


def _key_from_state(item: dict[str, Any]) -> SigningKey:
    raw = base64.urlsafe_b64decode(item["private_key"] + "=" * (-len(item["private_key"]) % 4))
    key = Ed25519PrivateKey.from_private_bytes(raw)
    kid = thumbprint_kid(public_x(key))
    if kid != item["kid"]:
        raise ValueError(f"webhook signing keyring is inconsistent: {item['kid']} != {kid}")
    return SigningKey(kid=kid, private_key=key, created_at=float(item.get("created_at", 0)))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
