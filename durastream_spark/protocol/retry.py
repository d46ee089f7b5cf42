"""Retrying requests that are safe to repeat, and only those.

A request is repeated only when repeating it cannot change the stream twice (hazard 11):

- GET, HEAD and PUT (create is "create or ensure exists": a repeat with the same configuration is a 200);
- POSTs carrying producer headers (``Producer-Id/Epoch/Seq``): the server deduplicates a repeat to a 204;
- close-only POSTs (``Stream-Closed: true``, empty body), idempotent by the protocol;
- staged-append requests that are idempotent by construction: aborts (``Durastream-Abort``) and commits
  (``Durastream-Commit``, which always carry producer headers). A stage *without* producer headers is not:
  a repeat would stage its body twice into the handle.

A plain append (no producer headers) is never sent twice once it may have reached the server: a lost response
or a 503 from a proxy does not say whether the server applied it, and a repeat could duplicate it. Such a
request is re-sent only when the connection could not even be opened (refused, DNS failure, connect timeout),
which proves nothing was sent. Otherwise the caller gets a ``TransportError`` (``maybe_applied=True``) or the
typed error for the status.

Retried conditions: status 429, 502, 503, 504, 507; connection errors and timeouts. 507 (insufficient
storage) is transient on durastream-server: the failed batch is cut off the log and the server accepts
appends again once space returns, without a restart. Never other 4xx or other 5xx (a 500 is a bug, not a
transient state). Waits use exponential backoff with full jitter (uniform in
``[0, min(max_backoff, initial * 2**(n-1))]`` before retry ``n``) so that many Spark tasks hitting one
recovering server do not retry in lockstep. The server's ``Retry-After`` (seconds or HTTP-date) is a floor.
Both the attempt count and the total elapsed time bound the loop: a wait that would end past the elapsed
budget is not started. Sleep, clocks and randomness are injectable so tests need no real time.
"""

from __future__ import annotations

import email.utils
import enum
import logging
import random
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

import requests
import urllib3.exceptions

from durastream_spark.errors import RequestContext, TransportError

log = logging.getLogger(__name__)

RETRY_STATUSES: frozenset[int] = frozenset({429, 502, 503, 504, 507})


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff parameters. Frozen and picklable: it travels inside ``ConnectionOptions``."""

    max_attempts: int = 10
    max_elapsed_s: float = 120.0
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 10.0
    multiplier: float = 2.0
    retry_statuses: frozenset[int] = RETRY_STATUSES

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_elapsed_s < 0:
            raise ValueError(f"max_elapsed_s must be >= 0, got {self.max_elapsed_s}")
        if self.initial_backoff_s <= 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(
                "need 0 < initial_backoff_s <= max_backoff_s, got "
                f"{self.initial_backoff_s} and {self.max_backoff_s}"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")

    def backoff_cap(self, retry: int) -> float:
        """Upper bound of the wait before retry number ``retry`` (1-based)."""
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, got {retry}")
        # Exponent clamped so that a large attempt count cannot overflow the float.
        growth = self.multiplier ** min(retry - 1, 64)
        return min(self.max_backoff_s, self.initial_backoff_s * growth)

    def delay(
        self, retry: int, rng: Callable[[], float], retry_after_s: float | None = None
    ) -> float:
        """Full-jitter wait before retry ``retry``, never shorter than the server's ``Retry-After``."""
        jittered = rng() * self.backoff_cap(retry)
        if retry_after_s is not None:
            return max(jittered, retry_after_s)
        return jittered


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or HTTP-date), or None if absent/invalid.

    ``now`` is the wall-clock time (``time.time()``) an HTTP-date is measured against; a date in the past
    means "now" (0 seconds).
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment is None or moment.tzinfo is None:
        return None  # HTTP-dates are always GMT; a zone-less value is not one
    return max(0.0, moment.timestamp() - now)


def request_is_idempotent(method: str, headers: Mapping[str, str], body_length: int) -> bool:
    """Whether repeating this request can never change the stream twice (see the module docstring)."""
    method = method.upper()
    if method in ("GET", "HEAD", "PUT", "OPTIONS"):
        return True
    if method != "POST":
        return False  # DELETE: a repeat after success answers 404 and hides the success
    names = {name.lower(): value for name, value in headers.items()}
    if "producer-id" in names:
        return True
    if "durastream-abort" in names:
        return True
    closed = names.get("stream-closed", "").strip().lower() == "true"
    return closed and body_length == 0


class _Phase(enum.Enum):
    NOT_SENT = "not sent"  # the connection never opened: safe to repeat anything
    MAYBE_SENT = "maybe sent"  # the request may have reached the server
    FATAL = "fatal"  # configuration or programming error: repeating will not help


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and everything it wraps (requests wraps urllib3, which wraps socket errors)."""
    seen: list[BaseException] = []
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or any(item is s for s in seen):
            continue
        seen.append(item)
        stack.extend(item.args)
        stack.append(getattr(item, "reason", None))
        stack.append(item.__cause__)
        stack.append(item.__context__)
    return seen


def classify_failure(exc: requests.RequestException) -> _Phase:
    """Where in the exchange a ``requests`` exception happened."""
    if isinstance(exc, requests.exceptions.SSLError):
        return _Phase.FATAL
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return _Phase.NOT_SENT
    if isinstance(exc, requests.exceptions.ConnectionError):
        for cause in _causes(exc):
            if isinstance(
                cause,
                (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError),
            ):
                return _Phase.NOT_SENT
        return _Phase.MAYBE_SENT
    if isinstance(
        exc,
        (
            requests.exceptions.Timeout,
            requests.exceptions.ChunkedEncodingError,
            requests.exceptions.ContentDecodingError,
        ),
    ):
        return _Phase.MAYBE_SENT
    return _Phase.FATAL


class HasStatus(Protocol):
    status: int
    headers: Mapping[str, str]


R = TypeVar("R", bound=HasStatus)


class Retrier:
    """Runs one logical request under a ``RetryPolicy``. Not pickled: clients create it lazily."""

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng

    def call(
        self, send: Callable[[], R], *, idempotent: bool, context: RequestContext
    ) -> tuple[R, int]:
        """``(reply, attempts)``. The reply may still carry a retryable status once the budget is spent;
        the caller turns it into the typed error. Transport failures raise ``TransportError``.

        Logging: one WARNING when a request first needs a retry (what failed, and how long the retries may
        take), DEBUG for every later attempt, so a server that is down for a minute costs one line per
        request, not one per attempt. The low-level exception chain goes to DEBUG when the request gives up.
        """
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                reply = send()
            except requests.RequestException as exc:
                phase = classify_failure(exc)
                retryable = phase is _Phase.NOT_SENT or (phase is _Phase.MAYBE_SENT and idempotent)
                delay = self.policy.delay(attempt, self._rng) if retryable else 0.0
                problem = explain_failure(exc, context.url)
                if not retryable or not self._within_budget(attempt, started, delay):
                    log.debug(
                        "%s gave up after %d attempt(s)", context.describe(), attempt, exc_info=exc
                    )
                    raise TransportError(
                        context,
                        exc,
                        attempts=attempt,
                        maybe_applied=phase is _Phase.MAYBE_SENT
                        and not idempotent
                        and context.method not in ("GET", "HEAD"),
                        summary=problem.summary,
                        elapsed_s=self._clock() - started,
                    ) from None
                self._log_retry(context, attempt, delay, problem.short)
                self._sleep(delay)
                continue
            if not idempotent or reply.status not in self.policy.retry_statuses:
                if attempt > 1:
                    log.debug("%s answered after %d attempts", context.describe(), attempt)
                return reply, attempt
            retry_after = parse_retry_after(_get(reply.headers, "Retry-After"), self._wall_clock())
            delay = self.policy.delay(attempt, self._rng, retry_after)
            if not self._within_budget(attempt, started, delay):
                return reply, attempt
            after = f", Retry-After {retry_after:g} s" if retry_after is not None else ""
            self._log_retry(context, attempt, delay, f"HTTP {reply.status}{after}")
            self._sleep(delay)

    def _log_retry(self, context: RequestContext, attempt: int, delay: float, problem: str) -> None:
        if attempt == 1:
            log.warning(
                "%s: %s; retrying for up to %g s (at most %d attempts; retry.* options)",
                context.describe(),
                problem,
                self.policy.max_elapsed_s,
                self.policy.max_attempts,
            )
        else:
            log.debug(
                "%s: %s; retry %d of %d in %.3f s",
                context.describe(),
                problem,
                attempt,
                self.policy.max_attempts - 1,
                delay,
            )

    def _within_budget(self, attempt: int, started: float, delay: float) -> bool:
        if attempt >= self.policy.max_attempts:
            return False
        return (self._clock() - started) + delay <= self.policy.max_elapsed_s


def _get(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if key.lower() == name.lower():
                return candidate
    return value


@dataclass(frozen=True)
class TransportProblem:
    """A transport failure in the user's terms: ``summary`` leads the error (the problem and the fix),
    ``short`` goes into the one retry line."""

    summary: str
    short: str


def explain_failure(exc: requests.RequestException, url: str) -> TransportProblem:
    """What went wrong talking to the server behind ``url``, and what to check. Never the raw exception
    text: urllib3's (``HTTPConnectionPool(...): Max retries exceeded ... Caused by ...``) names none of it."""
    parts = urlsplit(url)
    server = f"{parts.scheme}://{parts.netloc}"
    causes = _causes(exc)
    not_answering = f"The server at {server} is not answering"
    if isinstance(exc, requests.exceptions.SSLError):
        tls = next((c for c in causes if isinstance(c, ssl.SSLError)), None)
        reason = getattr(tls, "verify_message", None) or getattr(tls, "reason", None) or "TLS error"
        return TransportProblem(
            f"TLS with the server at {server} failed ({reason}): check its certificate, or set "
            "option 'tls.caBundle' to the CA that signed it ('tls.verify=false' only for a test "
            "server)",
            f"TLS with {server} failed ({reason})",
        )
    if any(isinstance(cause, socket.gaierror) for cause in causes):
        return TransportProblem(
            f"{not_answering} (is it running? is the host name right?): {parts.hostname!r} does not "
            "resolve",
            f"host name {parts.hostname!r} does not resolve",
        )
    if any(isinstance(cause, ConnectionRefusedError) for cause in causes):
        return TransportProblem(
            f"{not_answering} (is it running? is the port right?): connection refused",
            f"{server} refused the connection",
        )
    if isinstance(exc, requests.exceptions.ConnectTimeout) or any(
        isinstance(cause, urllib3.exceptions.ConnectTimeoutError) for cause in causes
    ):
        return TransportProblem(
            f"{not_answering} (is it running? is the port right?): connecting timed out, so a "
            "firewall may be dropping the connection",
            f"connecting to {server} timed out",
        )
    if any(isinstance(cause, urllib3.exceptions.NewConnectionError) for cause in causes):
        return TransportProblem(
            f"{not_answering} (is it running? is the port right?)", f"{server} is not answering"
        )
    if isinstance(exc, requests.exceptions.Timeout) or any(
        isinstance(cause, (TimeoutError, urllib3.exceptions.ReadTimeoutError)) for cause in causes
    ):
        return TransportProblem(
            f"The server at {server} did not answer within option 'requestTimeoutMs': raise it if "
            "the server is just slow",
            f"no answer from {server} within requestTimeoutMs",
        )
    innermost = type(causes[-1]).__name__ if causes else type(exc).__name__
    return TransportProblem(
        f"The connection to the server at {server} broke off ({innermost}): the server may have "
        "restarted, or a proxy closed the connection",
        f"the connection to {server} broke off ({innermost})",
    )
