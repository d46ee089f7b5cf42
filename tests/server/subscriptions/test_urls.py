"""Webhook URL validation: SSRF prevention (sections 6.2, 12.8)."""

from __future__ import annotations

import pytest

from durastream_server.subscriptions.errors import WebhookUrlRejected
from durastream_server.subscriptions.urls import WebhookUrlPolicy, literal_address

POLICY = WebhookUrlPolicy()
STRICT = WebhookUrlPolicy(allow_local_dev=False)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/x",
        "https://93.184.216.34/hook",
        "https://[2606:4700::1111]/hook",
        "http://localhost/hook",
        "http://localhost:8080/hook",
        "http://127.0.0.1:4000/webhook",
        "http://127.0.0.9/webhook",
        "https://127.0.0.1/webhook",
    ],
)
def test_accepted(url: str) -> None:
    assert POLICY.validate(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "https://10.0.0.1/hook",
        "https://172.16.5.4/",
        "https://192.168.1.1/",
        "https://169.254.169.254/latest/meta-data",
        "https://100.100.100.200/",  # CGNAT (a cloud metadata address)
        "https://127.0.1.1/",  # loopback outside the 127.0.0.x exception
        "https://[::1]/",
        "https://[fe80::1]/",
        "https://[fd00:ec2::254]/",
        "https://[::ffff:10.0.0.1]/",
        "https://0.0.0.0/",
        "https://224.0.0.1/",
        "https://2130706433/",  # 127.0.0.1 as one number: resolvers accept it
        "https://0x7f.1/",
        "https://012.0.0.1/",  # octal 10.0.0.1
        "http://hooks.example.com/x",  # plain http to a public host
        "https://metadata.google.internal/",
        "https://printer.local/",
        "https://foo.localhost/",
        "https://intranet/",
        "ftp://hooks.example.com/",
        "https://user:pw@hooks.example.com/",
        "https:///nohost",
        "https://hooks.example.com:99999/",
        "https://hooks.example.com/a b",
        "",
        5,
    ],
)
def test_rejected(url: object) -> None:
    with pytest.raises(WebhookUrlRejected) as info:
        POLICY.validate(url)
    assert info.value.field == "webhook.url"
    assert info.value.status == 400


def test_development_exception_can_be_switched_off() -> None:
    for url in ("http://localhost/x", "http://127.0.0.1/x"):
        with pytest.raises(WebhookUrlRejected):
            STRICT.validate(url)
    assert STRICT.validate("https://hooks.example.com/") == "https://hooks.example.com/"


def test_resolved_addresses_are_checked_at_delivery_time() -> None:
    POLICY.check_resolved("hooks.example.com", ["93.184.216.34"])
    POLICY.check_resolved("localhost", ["127.0.0.1", "::1"])
    with pytest.raises(WebhookUrlRejected):
        POLICY.check_resolved("hooks.example.com", ["93.184.216.34", "10.1.2.3"])
    with pytest.raises(WebhookUrlRejected):
        STRICT.check_resolved("localhost", ["127.0.0.1"])


def test_literal_address_understands_legacy_spellings() -> None:
    assert str(literal_address("2130706433")) == "127.0.0.1"
    assert str(literal_address("0x7f.0.0.1")) == "127.0.0.1"
    assert literal_address("cafe.be") is None
    assert literal_address("hooks.example.com") is None
