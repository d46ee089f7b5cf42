"""Webhook signing: Ed25519 over ``<t>.<body>``, JWKS with RFC 7638 kids (sections 6.5, 7.1)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import stat
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from durastream_server.subscriptions.signing import WebhookSigner

HEADER_RE = re.compile(r"^t=(\d+),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)$")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify(jwks: dict, header: str, body: bytes) -> None:
    """What a receiver does: parse the header, pick the key by kid, verify. Raises on failure."""
    match = HEADER_RE.match(header)
    assert match is not None, header
    timestamp, kid, signature = match.groups()
    jwk = next(key for key in jwks["keys"] if key["kid"] == kid)
    public = Ed25519PublicKey.from_public_bytes(unb64(jwk["x"]))
    public.verify(unb64(signature), timestamp.encode() + b"." + body)


def test_signature_verifies_with_published_key(tmp_path: Path) -> None:
    signer = WebhookSigner.load_or_create(tmp_path)
    body = b'{"subscription_id":"s"}'
    header = signer.signature_header(body, now=1_700_000_000.5)
    assert header.startswith("t=1700000000,kid=ds_")
    verify(signer.jwks(), header, body)
    with pytest.raises(InvalidSignature):
        verify(signer.jwks(), header, body + b" ")


def test_jwks_shape_and_thumbprint_kid(tmp_path: Path) -> None:
    signer = WebhookSigner.load_or_create(tmp_path)
    (key,) = signer.jwks()["keys"]
    assert {k: key[k] for k in ("kty", "crv", "use", "alg")} == {
        "kty": "OKP",
        "crv": "Ed25519",
        "use": "sig",
        "alg": "EdDSA",
    }
    assert "d" not in key  # never the private part
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": key["x"]}, separators=(",", ":"))
    expected = base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=")
    assert key["kid"] == "ds_" + expected.decode()
    assert signer.active_kid == key["kid"]


def test_key_survives_restart_and_is_private(tmp_path: Path) -> None:
    first = WebhookSigner.load_or_create(tmp_path)
    header = first.signature_header(b"x", now=1.0)
    second = WebhookSigner.load_or_create(tmp_path)
    assert second.active_kid == first.active_kid
    verify(second.jwks(), header, b"x")
    mode = stat.S_IMODE((tmp_path / "webhook-signing-keys.json").stat().st_mode)
    assert mode == 0o600


def test_rotation_keeps_publishing_old_keys(tmp_path: Path) -> None:
    signer = WebhookSigner.load_or_create(tmp_path)
    old_header = signer.signature_header(b"body", now=1.0)
    new_kid = signer.rotate()
    assert new_kid != HEADER_RE.match(old_header).group(2)
    reloaded = WebhookSigner.load_or_create(tmp_path)
    assert reloaded.active_kid == new_kid
    verify(reloaded.jwks(), old_header, b"body")
    verify(reloaded.jwks(), reloaded.signature_header(b"body", now=2.0), b"body")
