"""Subscription config parsing, normalization and the re-confirmation hash (section 6.2)."""

from __future__ import annotations

import json

import pytest

from durastream_server.subscriptions.errors import InvalidField, InvalidJson, WebhookUrlRejected
from durastream_server.subscriptions.model import (
    DEFAULT_LEASE_TTL_MS,
    SubscriptionConfig,
    parse_config,
    parse_wake_request,
)
from durastream_server.subscriptions.urls import WebhookUrlPolicy

POLICY = WebhookUrlPolicy()


def parse(body: object) -> SubscriptionConfig:
    return parse_config(json.dumps(body).encode(), POLICY)


def webhook(**extra: object) -> dict[str, object]:
    return {
        "type": "webhook",
        "pattern": "events/*",
        "webhook": {"url": "https://hooks.example.com/x"},
        **extra,
    }


def test_equivalent_bodies_hash_equal() -> None:
    a = parse(webhook(streams=["b", "a", "a"]))
    b = parse(
        {
            "webhook": {"url": "https://hooks.example.com/x"},
            "streams": ["a", "b"],
            "pattern": "events/*",
            "type": "webhook",
            "lease_ttl_ms": DEFAULT_LEASE_TTL_MS,
        }
    )
    assert a.streams == ("a", "b")
    assert a.config_hash() == b.config_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"pattern": "events/**"},
        {"streams": ["x"]},
        {"webhook": {"url": "https://hooks.example.com/y"}},
        {"lease_ttl_ms": 1000},
        {"description": "other"},
    ],
)
def test_every_configured_field_changes_the_hash(change: dict[str, object]) -> None:
    assert parse(webhook()).config_hash() != parse(webhook(**change)).config_hash()


def test_canonical_round_trip() -> None:
    config = parse(webhook(streams=["s/1"], description="d", lease_ttl_ms=5000))
    again = SubscriptionConfig.from_canonical(json.loads(json.dumps(config.canonical())))
    assert again == config
    assert again.config_hash() == config.config_hash()


def test_pull_wake_requires_wake_stream() -> None:
    with pytest.raises(InvalidField) as info:
        parse({"type": "pull-wake", "pattern": "events/*"})
    assert info.value.field == "wake_stream"
    config = parse({"type": "pull-wake", "pattern": "events/*", "wake_stream": "wake/pool"})
    assert config.wake_stream == "wake/pool" and config.webhook_url is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"pattern": "events/*"}, "type"),
        ({"type": "carrier-pigeon", "pattern": "x"}, "type"),
        ({"type": "webhook", "webhook": {"url": "https://a.example.com"}}, "pattern"),
        (
            {"type": "webhook", "streams": [], "webhook": {"url": "https://a.example.com"}},
            "pattern",
        ),
        (webhook(lease_ttl_ms=999), "lease_ttl_ms"),
        (webhook(lease_ttl_ms=600_001), "lease_ttl_ms"),
        (webhook(lease_ttl_ms="30000"), "lease_ttl_ms"),
        (webhook(lease_ttl_ms=True), "lease_ttl_ms"),
        (webhook(pattern=5), "pattern"),
        (webhook(pattern="/abs/*"), "pattern"),
        (webhook(streams="a"), "streams"),
        (webhook(streams=["ok", ""]), "streams[1]"),
        (webhook(streams=["__ds/x"]), "streams[0]"),
        (webhook(description=7), "description"),
        (webhook(wake_stream="w"), "wake_stream"),
        (webhook(extra=1), "extra"),
        ({"type": "webhook", "pattern": "e/*"}, "webhook.url"),
        (
            {
                "type": "pull-wake",
                "pattern": "e/*",
                "wake_stream": "w",
                "webhook": {"url": "https://a.example.com"},
            },
            "webhook",
        ),
        ({"type": "pull-wake", "pattern": "e/*", "wake_stream": "w", "streams": ["w"]}, "streams"),
    ],
)
def test_bad_input_names_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidField) as info:
        parse(body)
    assert info.value.field == field
    assert info.value.status == 400


def test_unsafe_webhook_url_has_its_own_code() -> None:
    with pytest.raises(WebhookUrlRejected) as info:
        parse(webhook(webhook={"url": "http://10.0.0.1/hook"}))
    assert info.value.code == "WEBHOOK_URL_REJECTED"
    assert info.value.field == "webhook.url"


@pytest.mark.parametrize("body", [b"", b"not json", b"[1]", b"\xff\xfe"])
def test_invalid_json(body: bytes) -> None:
    with pytest.raises(InvalidJson):
        parse_config(body, POLICY)


def test_wake_request_parsing() -> None:
    request = parse_wake_request(
        json.dumps(
            {
                "wake_id": "w_1",
                "generation": 3,
                "acks": [{"stream": "a", "offset": "o"}],
                "done": True,
            }
        ).encode()
    )
    assert (request.wake_id, request.generation, request.done) == ("w_1", 3, True)
    assert request.acks[0].stream == "a" and request.acks[0].offset == "o"
    for bad, field in [
        ({"generation": 1}, "wake_id"),
        ({"wake_id": "w", "generation": "1"}, "generation"),
        ({"wake_id": "w", "generation": 1, "done": "yes"}, "done"),
        ({"wake_id": "w", "generation": 1, "acks": [{"stream": "a"}]}, "acks[0].offset"),
    ]:
        with pytest.raises(InvalidField) as info:
            parse_wake_request(json.dumps(bad).encode())
        assert info.value.field == field
