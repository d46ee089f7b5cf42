"""RetryPolicy arithmetic and the idempotency rules, without any network."""

from __future__ import annotations

import email.utils
import pickle
import random

import pytest

from durastream_spark.protocol.retry import (
    RetryPolicy,
    parse_retry_after,
    request_is_idempotent,
)

POLICY = RetryPolicy(max_attempts=10, max_elapsed_s=60, initial_backoff_s=0.1, max_backoff_s=2.0)


def test_backoff_cap_grows_exponentially_then_saturates() -> None:
    caps = [POLICY.backoff_cap(n) for n in range(1, 9)]
    assert caps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])
    assert POLICY.backoff_cap(10_000) == 2.0  # no overflow for absurd retry numbers


def test_full_jitter_spans_zero_to_cap() -> None:
    assert POLICY.delay(3, rng=lambda: 0.0) == 0.0
    assert POLICY.delay(3, rng=lambda: 0.5) == pytest.approx(0.2)
    assert POLICY.delay(3, rng=lambda: 0.999999) == pytest.approx(0.4, rel=1e-5)
    generator = random.Random(7)
    samples = [POLICY.delay(4, rng=generator.random) for _ in range(2000)]
    assert all(0.0 <= s <= 0.8 for s in samples)
    assert min(samples) < 0.08 and max(samples) > 0.72  # really jittered over the whole range


def test_retry_after_is_a_floor_not_a_cap() -> None:
    assert POLICY.delay(1, rng=lambda: 0.5, retry_after_s=7.0) == 7.0
    assert POLICY.delay(6, rng=lambda: 1.0, retry_after_s=0.5) == 2.0


def test_parse_retry_after_seconds_and_http_date() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after("5", now) == 5.0
    assert parse_retry_after(" 0 ", now) == 0.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(past, now) == 0.0
    for junk in (None, "", "soon", "-5", "1.5", "Mon, 99 Foo 2020"):
        assert parse_retry_after(junk, now) is None


def test_policy_validates_and_pickles() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff_s=2, max_backoff_s=1)
    assert pickle.loads(pickle.dumps(POLICY)) == POLICY


@pytest.mark.parametrize(
    ("method", "headers", "body", "expected"),
    [
        ("GET", {}, 0, True),
        ("HEAD", {}, 0, True),
        ("PUT", {"Content-Type": "application/json"}, 0, True),
        ("DELETE", {}, 0, False),
        # a plain append: never repeated once it may have reached the server (hazard 11)
        ("POST", {"Content-Type": "application/json"}, 10, False),
        ("POST", {"Content-Type": "application/json", "Stream-Seq": "5"}, 10, False),
        (
            "POST",
            {"Content-Type": "text/plain", "Stream-Closed": "true"},
            10,
            False,
        ),  # append+close
        # producer appends are deduplicated by the server
        ("POST", {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "3"}, 10, True),
        ("POST", {"producer-id": "p", "producer-epoch": "0", "producer-seq": "3"}, 10, True),
        # close-only is idempotent by the protocol
        ("POST", {"Stream-Closed": "true"}, 0, True),
        ("POST", {"Stream-Closed": "yes"}, 0, False),
        # staged appends
        ("POST", {"Durastream-Txn": "h1", "Content-Type": "application/json"}, 10, False),
        (
            "POST",
            {
                "Durastream-Txn": "h1",
                "Producer-Id": "p",
                "Producer-Epoch": "0",
                "Producer-Seq": "0",
            },
            10,
            True,
        ),
        (
            "POST",
            {
                "Durastream-Commit": "h1",
                "Producer-Id": "p",
                "Producer-Epoch": "3",
                "Producer-Seq": "0",
            },
            0,
            True,
        ),
        ("POST", {"Durastream-Abort": "h1, h2"}, 0, True),
    ],
)
def test_which_requests_are_safe_to_repeat(
    method: str, headers: dict[str, str], body: int, expected: bool
) -> None:
    assert request_is_idempotent(method, headers, body) is expected
