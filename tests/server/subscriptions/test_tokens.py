"""Callback/claim tokens: HMAC-signed, scoped, expiring, persisted secret (sections 7, 12.9)."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from durastream_server.subscriptions.tokens import (
    InvalidToken,
    TokenAuthority,
    TokenClaims,
    bearer_token,
)

CLAIMS = TokenClaims(
    subscription_id="sub-1",
    incarnation="inc",
    generation=7,
    wake_id="w_abc",
    use="callback",
    expires_at=2_000.0,
)


def test_round_trip() -> None:
    authority = TokenAuthority(b"k" * 32)
    assert authority.verify(authority.mint(CLAIMS), now=1_000.0) == CLAIMS


def test_expired_token_is_rejected() -> None:
    authority = TokenAuthority(b"k" * 32)
    with pytest.raises(InvalidToken, match="expired"):
        authority.verify(authority.mint(CLAIMS), now=2_000.0)


def test_tampered_payload_is_rejected() -> None:
    authority = TokenAuthority(b"k" * 32)
    prefix, payload, mac = authority.mint(CLAIMS).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["gen"] = 8
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(InvalidToken, match="signature"):
        authority.verify(f"{prefix}.{forged}.{mac}", now=1_000.0)


def test_token_from_another_secret_is_rejected() -> None:
    token = TokenAuthority(b"a" * 32).mint(CLAIMS)
    with pytest.raises(InvalidToken):
        TokenAuthority(b"b" * 32).verify(token, now=1_000.0)


@pytest.mark.parametrize(
    "token", ["", "x", "ds1.a", "ds2.a.b", "ds1.é.b", "ds1.!!.??", "ds1." + "a" * 5000 + ".b"]
)
def test_malformed_tokens_are_rejected(token: str) -> None:
    with pytest.raises(InvalidToken):
        TokenAuthority(b"k" * 32).verify(token, now=0.0)


def test_secret_is_persisted_privately(tmp_path: Path) -> None:
    first = TokenAuthority.load_or_create(tmp_path)
    token = first.mint(CLAIMS)
    second = TokenAuthority.load_or_create(tmp_path)
    assert second.verify(token, now=1_000.0) == CLAIMS
    mode = stat.S_IMODE((tmp_path / "token-secret").stat().st_mode)
    assert mode == 0o600


def test_bearer_header_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None
