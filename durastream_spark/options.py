"""Option parsing: Spark's string options become frozen, picklable dataclasses, once, on the driver.

Spark hands a data source its options as a case-insensitive dict of strings (PySpark lower-cases the keys).
They are validated here, where ``load()``/``start()`` runs, so that a typo fails the query before any task
starts and the error names the option, the value and what is accepted. Nothing downstream re-parses strings.

Connection options (shared by the source and the sink): ``url``, ``header.<Name>``, ``tokenFile``,
``tls.verify``, ``tls.caBundle``, ``requestTimeoutMs``, ``maxConnections`` and ``retry.*``. Their defaults,
accepted values and errors are in ``docs/options.md``, generated from the parsers here and in
``source/options.py`` and ``sink/options.py`` (``python -m durastream_spark.docs``), so this docstring does
not repeat them.

Durations accept a whole number of milliseconds (``1500``) or a number with a unit: ``250ms``, ``30s``,
``5m``, ``1h``. Byte sizes take the grammar of ``durastream_spark.sizes`` (``512k``, ``64m``, ``1g``).

``tokenFile`` is read when a request is sent, in whichever process sends it (driver or executor), and re-read
whenever the file changes (size, mtime or inode), so rotated tokens (Kubernetes service-account tokens, secret
mounts refreshed by an agent) are picked up by long-running queries. The file must therefore exist at the same
path on the driver and on every executor. It is checked once at parse time on the driver, so a wrong path
fails ``load()``/``start()``, not a task. The token itself is never stored in the options object.

Secrets and Spark's UI: Spark redacts option *keys* matching ``spark.redaction.regex`` in plans and the UI;
``header.authorization`` does not match the default pattern. Prefer ``tokenFile`` (only a path is visible), or
extend ``spark.redaction.regex`` with ``|header\\.``.

Toolkit
=======
``OptionReader`` wraps the raw mapping and gives typed getters (string, integer with bounds, boolean, choice,
duration, byte size, JSON, prefixed keys) whose errors are ``OptionError``s naming option, value and accepted values.
``OptionReader.ensure_known`` rejects keys that no option class knows, with a "did you mean" hint. The source
and sink option classes build on it::

    reader = OptionReader(options)
    reader.ensure_known(CONNECTION_KEYS | {"stream", "contentType"})
    connection = ConnectionOptions.parse(reader)
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from durastream_spark.errors import OptionError
from durastream_spark.protocol.retry import RetryPolicy
from durastream_spark.sizes import SYNTAX as BYTE_SIZE_SYNTAX
from durastream_spark.sizes import parse_byte_size

# ---- option keys (canonical spelling; matching is case-insensitive) ----------------------------------------
URL = "url"
HEADER_PREFIX = "header."
TOKEN_FILE = "tokenFile"
TLS_VERIFY = "tls.verify"
TLS_CA_BUNDLE = "tls.caBundle"
REQUEST_TIMEOUT_MS = "requestTimeoutMs"
MAX_CONNECTIONS = "maxConnections"
RETRY_MAX_ATTEMPTS = "retry.maxAttempts"
RETRY_MAX_ELAPSED_MS = "retry.maxElapsedMs"
RETRY_INITIAL_BACKOFF_MS = "retry.initialBackoffMs"
RETRY_MAX_BACKOFF_MS = "retry.maxBackoffMs"

CONNECTION_KEYS: frozenset[str] = frozenset(
    {
        URL,
        TOKEN_FILE,
        TLS_VERIFY,
        TLS_CA_BUNDLE,
        REQUEST_TIMEOUT_MS,
        MAX_CONNECTIONS,
        RETRY_MAX_ATTEMPTS,
        RETRY_MAX_ELAPSED_MS,
        RETRY_INITIAL_BACKOFF_MS,
        RETRY_MAX_BACKOFF_MS,
    }
)
"""Every connection option key except the ``header.`` prefix family."""

# ---- defaults -----------------------------------------------------------------------------------------------
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_RETRY_MAX_ATTEMPTS = 10
DEFAULT_RETRY_MAX_ELAPSED_MS = 120_000
DEFAULT_RETRY_INITIAL_BACKOFF_MS = 100
DEFAULT_RETRY_MAX_BACKOFF_MS = 10_000

# Headers the connector sets itself: letting an option override them would break the protocol.
_RESERVED_HEADERS = frozenset(
    {"content-type", "content-length", "transfer-encoding", "host", "connection", "te", "upgrade"}
)
_RESERVED_HEADER_PREFIXES = ("stream-", "producer-", "durastream-")
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_INTEGER = re.compile(r"^[+-]?\d+$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$", re.IGNORECASE)
_DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
MAX_BYTE_SIZE = (
    2**53 - 1
)  # the largest count the server's limit lookups and JSON numbers carry exactly


@dataclass(frozen=True)
class Secret:
    """A string that must not be displayed: its repr and str are ``***``. Picklable like any dataclass."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"


class OptionReader:
    """Typed, case-insensitive access to Spark's option strings. Every error names option, value, accepted."""

    def __init__(self, options: Mapping[str, str] | None) -> None:
        self._values: dict[str, str] = {}
        self._spelling: dict[str, str] = {}
        for key, value in (options or {}).items():
            lowered = str(key).lower()
            if lowered in self._values:
                raise OptionError(
                    str(key),
                    None if value is None else str(value),
                    "each option at most once",
                    secret=True,
                    message=(
                        f"Option '{key}' is given twice (also as '{self._spelling[lowered]}'); option "
                        "names are case-insensitive, so keep one of them."
                    ),
                )
            self._values[lowered] = "" if value is None else str(value)
            self._spelling[lowered] = str(key)

    # ---- presence ----------------------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return key.lower() in self._values

    def raw(self, key: str) -> str | None:
        return self._values.get(key.lower())

    def keys(self) -> list[str]:
        return [self._spelling[k] for k in self._values]

    def ensure_known(
        self, valid_keys: Iterable[str], prefixes: Sequence[str] = (HEADER_PREFIX,)
    ) -> None:
        """Reject any key that is neither in ``valid_keys`` nor starts with one of ``prefixes``.

        The error lists every valid key and suggests the closest one, because a misspelt option silently
        ignored (``maxMessagePerTrigger``) is a bug that only shows in production.
        """
        canonical = {key.lower(): key for key in valid_keys}
        lowered_prefixes = tuple(p.lower() for p in prefixes)
        for lowered, spelled in self._spelling.items():
            if lowered in canonical or lowered.startswith(lowered_prefixes):
                continue
            kafka = kafka_habit(spelled, self._values[lowered], canonical)
            if kafka is not None:
                raise kafka
            close = difflib.get_close_matches(lowered, list(canonical), n=1, cutoff=0.75)
            hint = f"did you mean '{canonical[close[0]]}'? " if close else ""
            listing = ", ".join(sorted(canonical.values(), key=str.lower))
            listing += "".join(f", {p}<Name>" for p in prefixes)
            # The value is not echoed: an unknown key may well hold a secret (``authorization=...``).
            raise OptionError(
                spelled,
                self._values[lowered],
                listing,
                secret=True,
                message=(
                    f"Unknown option '{spelled}'; {hint}valid options (case-insensitive) are: {listing}."
                ),
            )

    # ---- typed getters -----------------------------------------------------------------------------------

    def string(
        self,
        key: str,
        default: str | None = None,
        *,
        required: bool = False,
        accepted: str = "a non-empty string",
        allow_empty: bool = False,
    ) -> str | None:
        value = self.raw(key)
        if value is None:
            if required:
                raise OptionError(key, None, accepted)
            return default
        if not allow_empty and not value.strip():
            raise OptionError(key, value, accepted, reason="empty value")
        return value

    def integer(
        self,
        key: str,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int:
        accepted = _bounds_text("an integer", minimum, maximum)
        value = self.raw(key)
        if value is None:
            return default
        text = value.strip()
        if not _INTEGER.match(text):
            raise OptionError(key, value, accepted)
        number = int(text)
        _check_bounds(key, value, number, minimum, maximum, accepted)
        return number

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        text = value.strip().lower()
        if text == "true":
            return True
        if text == "false":
            return False
        raise OptionError(key, value, "true or false")

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        """One of ``choices``, matched case-insensitively and returned in its canonical spelling."""
        value = self.raw(key)
        if value is None:
            return default
        by_lower = {c.lower(): c for c in choices}
        found = by_lower.get(value.strip().lower())
        if found is None:
            raise OptionError(key, value, "one of " + ", ".join(repr(c) for c in choices))
        return found

    def duration_ms(
        self,
        key: str,
        default: int,
        *,
        minimum: int | None = 0,
        maximum: int | None = None,
    ) -> int:
        """Milliseconds: ``1500`` (plain numbers are milliseconds), ``250ms``, ``1.5s``, ``5m``, ``1h``."""
        accepted = _bounds_text(
            "a duration in milliseconds (e.g. 1500) or with a unit (250ms, 30s, 5m, 1h)",
            minimum,
            maximum,
            unit=" ms",
        )
        value = self.raw(key)
        if value is None:
            return default
        match = _DURATION.match(value.strip())
        if not match:
            raise OptionError(key, value, accepted)
        amount, unit = match.group(1), (match.group(2) or "ms").lower()
        scaled = float(amount) * _DURATION_UNITS_MS[unit]
        if scaled != int(scaled):
            raise OptionError(key, value, accepted, reason="not a whole number of milliseconds")
        number = int(scaled)
        _check_bounds(key, value, number, minimum, maximum, accepted)
        return number

    def byte_size(
        self,
        key: str,
        default: int | None,
        *,
        minimum: int = 1,
        maximum: int = MAX_BYTE_SIZE,
    ) -> int | None:
        """Bytes, in the grammar of ``durastream_spark.sizes``: ``1048576``, ``512k``, ``64m``, ``1g``."""
        bounds = _bounds_text("a byte size", minimum, None if maximum == MAX_BYTE_SIZE else maximum)
        accepted = f"{bounds}: {BYTE_SIZE_SYNTAX}"
        value = self.raw(key)
        if value is None:
            return default
        try:
            number = parse_byte_size(value)
        except ValueError:
            raise OptionError(key, value, accepted) from None
        _check_bounds(key, value, number, minimum, maximum, accepted)
        return number

    def json_value(
        self, key: str, default: Any = None, *, accepted: str = "a JSON document"
    ) -> Any:
        value = self.raw(key)
        if value is None:
            return default
        try:
            return json.loads(value)
        except ValueError as exc:
            raise OptionError(key, value, accepted, reason=f"not valid JSON: {exc}") from None

    def prefixed(self, prefix: str) -> dict[str, str]:
        """``{suffix: value}`` for every key that starts with ``prefix`` (suffix as spelt by the user)."""
        lowered = prefix.lower()
        return {
            self._spelling[key][len(prefix) :]: value
            for key, value in self._values.items()
            if key.startswith(lowered)
        }


@dataclass(frozen=True)
class KafkaEquivalent:
    """What a Spark Kafka connector option is called here. ``targets``: ours, most fitting first (the first
    one the parser knows is named). ``example``: the value shown in the fix; ``None`` shows the user's own
    value, for options whose values are stream names or counts (never secrets)."""

    targets: tuple[str, ...]
    what: str
    example: str | None = None


# Spark's Kafka connector options (lower-cased) that users bring along. Matching is by the parser's own
# keys, so an entry pointing at an option this side does not have falls back to the "did you mean" listing.
KAFKA_EQUIVALENTS: dict[str, KafkaEquivalent] = {
    "subscribe": KafkaEquivalent(("streams",), "comma-separated stream paths relative to 'url'"),
    "subscribepattern": KafkaEquivalent(
        ("pattern",),
        "a glob over stream paths, not a regex: '*' matches one path segment, '**' any number",
        example="events/*",
    ),
    "assign": KafkaEquivalent(
        ("streams",),
        "streams have no partitions and are read whole: list them, and give per-stream offsets in "
        "'startingOffsets' if needed",
        example="events/a,events/b",
    ),
    "topic": KafkaEquivalent(("stream", "streams"), "stream path(s) relative to 'url'"),
    "maxoffsetspertrigger": KafkaEquivalent(
        ("maxMessagesPerTrigger",), "the most messages per micro-batch"
    ),
    "minoffsetspertrigger": KafkaEquivalent(
        ("minMessagesPerTrigger",), "the fewest messages a micro-batch waits for"
    ),
    "kafka.bootstrap.servers": KafkaEquivalent(
        (URL,), "the server's stream root", example="http://<host>:4437/v1/stream"
    ),
}
KAFKA_CLIENT_PREFIX = "kafka."


def kafka_habit(key: str, value: str, canonical: Mapping[str, str]) -> OptionError | None:
    """The error for a Kafka connector option, pointing at ours; ``None`` for any other unknown key.

    ``canonical``: the parser's keys, lower-cased to their spelling.
    """
    lowered = key.lower()
    equivalent = KAFKA_EQUIVALENTS.get(lowered)
    target = None
    if equivalent is not None:
        target = next(
            (canonical[t.lower()] for t in equivalent.targets if t.lower() in canonical), None
        )
    if target is not None and equivalent is not None:
        shown = value if equivalent.example is None else equivalent.example
        message = (
            f"Option '{key}' is Spark's Kafka connector's; here it is '{target}' "
            f'({equivalent.what}): .option("{target}", "{shown}").'
        )
        secret = equivalent.example is not None
        return OptionError(key, value, f"'{target}'", secret=secret, message=message)
    if lowered.startswith(KAFKA_CLIENT_PREFIX):
        message = (
            f"Option '{key}' is a Kafka client setting; this connector speaks HTTP to a Durable Streams "
            f"server instead: the server is '{URL}' (its stream root, e.g. "
            f"http://127.0.0.1:4437/v1/stream), credentials go in '{TOKEN_FILE}' or "
            f"'{HEADER_PREFIX}Authorization', TLS in '{TLS_VERIFY}'/'{TLS_CA_BUNDLE}'."
        )
        return OptionError(key, value, f"'{URL}'", secret=True, message=message)
    return None


def _bounds_text(what: str, minimum: int | None, maximum: int | None, unit: str = "") -> str:
    if minimum is not None and maximum is not None:
        return f"{what} from {minimum} to {maximum}{unit}"
    if minimum is not None:
        return f"{what} >= {minimum}{unit}"
    if maximum is not None:
        return f"{what} <= {maximum}{unit}"
    return what


def _check_bounds(
    key: str,
    value: str,
    number: int,
    minimum: int | None,
    maximum: int | None,
    accepted: str,
) -> None:
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise OptionError(key, value, accepted, reason="out of range")


def _redacted_url(parts: Any) -> str:
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, "", ""))


def parse_url(value: str | None) -> str:
    """The stream root without a trailing slash. Refuses what would be ambiguous or leak credentials."""
    accepted = "an http:// or https:// stream root such as http://127.0.0.1:4437/v1/stream"
    if value is None:
        raise OptionError(URL, None, accepted)
    text = value.strip()
    try:
        parts = urlsplit(text)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError as exc:
        raise OptionError(URL, value, accepted, reason=str(exc)) from None
    if parts.username is not None or parts.password is not None:
        raise OptionError(
            URL,
            _redacted_url(parts),
            accepted,
            reason="credentials in the URL would show up in logs; use header.Authorization or tokenFile",
        )
    if parts.scheme.lower() not in ("http", "https"):
        raise OptionError(URL, value, accepted, reason="the scheme must be http or https")
    if not parts.hostname:
        raise OptionError(URL, value, accepted, reason="no host")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise OptionError(
            URL,
            value,
            accepted,
            reason="no query or fragment: the connector adds its own query parameters",
        )
    return urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/"), "", ""))


def parse_headers(reader: OptionReader) -> tuple[tuple[str, Secret], ...]:
    """``header.<Name>`` options as sorted ``(name, Secret(value))`` pairs. Values are never echoed."""
    headers: list[tuple[str, Secret]] = []
    for name, value in sorted(reader.prefixed(HEADER_PREFIX).items(), key=lambda kv: kv[0].lower()):
        option = HEADER_PREFIX + name
        if not _HEADER_NAME.match(name):
            raise OptionError(
                option,
                value,
                "header.<Name> where <Name> is an HTTP header name (letters, digits, - and similar)",
                secret=True,
            )
        lowered = name.lower()
        if lowered in _RESERVED_HEADERS or lowered.startswith(_RESERVED_HEADER_PREFIXES):
            raise OptionError(
                option,
                value,
                "any header except the ones the connector manages (Content-Type, Content-Length, Host, "
                "Stream-*, Producer-*, Durastream-*)",
                reason="reserved header",
                secret=True,
            )
        if any(ch in value for ch in "\r\n\0"):
            raise OptionError(
                option,
                value,
                "a header value without CR, LF or NUL",
                reason="would inject headers",
                secret=True,
            )
        headers.append((name, Secret(value.strip())))
    return tuple(headers)


@dataclass(frozen=True, repr=False)
class ConnectionOptions:
    """How to reach and authenticate to a Durable Streams server. Frozen and picklable; repr hides secrets."""

    url: str
    headers: tuple[tuple[str, Secret], ...] = ()
    token_file: str | None = None
    tls_verify: bool = True
    tls_ca_bundle: str | None = None
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_MS / 1000
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def parse(cls, options: Mapping[str, str] | OptionReader | None) -> ConnectionOptions:
        """Parse the connection options. Does not reject unknown keys: the caller knows the full key set."""
        reader = options if isinstance(options, OptionReader) else OptionReader(options)
        url = parse_url(reader.string(URL, required=True, accepted="an http(s) stream root URL"))
        headers = parse_headers(reader)

        token_file = reader.string(
            TOKEN_FILE, accepted="the path of a readable file holding a token"
        )
        if token_file is not None:
            if any(name.lower() == "authorization" for name, _ in headers):
                raise OptionError(
                    TOKEN_FILE,
                    token_file,
                    f"either {TOKEN_FILE} or {HEADER_PREFIX}Authorization, not both",
                    reason="both set the Authorization header",
                )
            _check_readable_file(TOKEN_FILE, token_file, must_be_file=True)

        tls_verify = reader.boolean(TLS_VERIFY, True)
        ca_bundle = reader.string(TLS_CA_BUNDLE, accepted="the path of a PEM file or a directory")
        if ca_bundle is not None:
            if not tls_verify:
                raise OptionError(
                    TLS_CA_BUNDLE,
                    ca_bundle,
                    f"a CA bundle only together with {TLS_VERIFY}=true",
                    reason=f"{TLS_VERIFY} is false, so the bundle would be ignored",
                )
            _check_readable_file(TLS_CA_BUNDLE, ca_bundle, must_be_file=False)

        timeout_ms = reader.duration_ms(
            REQUEST_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS, minimum=1, maximum=3_600_000
        )
        max_connections = reader.integer(
            MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS, minimum=1, maximum=1024
        )
        attempts = reader.integer(
            RETRY_MAX_ATTEMPTS, DEFAULT_RETRY_MAX_ATTEMPTS, minimum=1, maximum=1000
        )
        elapsed_ms = reader.duration_ms(
            RETRY_MAX_ELAPSED_MS, DEFAULT_RETRY_MAX_ELAPSED_MS, minimum=0, maximum=86_400_000
        )
        initial_ms = reader.duration_ms(
            RETRY_INITIAL_BACKOFF_MS, DEFAULT_RETRY_INITIAL_BACKOFF_MS, minimum=1, maximum=3_600_000
        )
        max_backoff_ms = reader.duration_ms(
            RETRY_MAX_BACKOFF_MS,
            max(DEFAULT_RETRY_MAX_BACKOFF_MS, initial_ms),
            minimum=1,
            maximum=3_600_000,
        )
        if max_backoff_ms < initial_ms:
            raise OptionError(
                RETRY_MAX_BACKOFF_MS,
                reader.raw(RETRY_MAX_BACKOFF_MS),
                f"a duration >= {RETRY_INITIAL_BACKOFF_MS} ({initial_ms} ms)",
                reason="the backoff cap cannot be below the first backoff",
            )
        return cls(
            url=url,
            headers=headers,
            token_file=token_file,
            tls_verify=tls_verify,
            tls_ca_bundle=ca_bundle,
            request_timeout_s=timeout_ms / 1000,
            max_connections=max_connections,
            retry=RetryPolicy(
                max_attempts=attempts,
                max_elapsed_s=elapsed_ms / 1000,
                initial_backoff_s=initial_ms / 1000,
                max_backoff_s=max_backoff_ms / 1000,
            ),
        )

    @property
    def header_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.headers)

    def reveal_headers(self) -> dict[str, str]:
        """The ``header.*`` values in clear text, for the transport only. Never log the result."""
        return {name: secret.value for name, secret in self.headers}

    @property
    def verify(self) -> bool | str:
        """The ``verify`` argument for ``requests``: the CA bundle path, or whether to verify at all."""
        if not self.tls_verify:
            return False
        return self.tls_ca_bundle or True

    def __repr__(self) -> str:
        headers = ", ".join(f"{name}: ***" for name in self.header_names)
        return (
            f"ConnectionOptions(url={self.url!r}, headers={{{headers}}}, token_file={self.token_file!r}, "
            f"tls_verify={self.tls_verify}, tls_ca_bundle={self.tls_ca_bundle!r}, "
            f"request_timeout_s={self.request_timeout_s}, max_connections={self.max_connections}, "
            f"retry={self.retry!r})"
        )


def _check_readable_file(option: str, path: str, *, must_be_file: bool) -> None:
    what = "a readable file" if must_be_file else "a readable file or directory"
    if must_be_file and not os.path.isfile(path):
        raise OptionError(option, path, what, reason="no such file (on the driver)")
    if not must_be_file and not os.path.exists(path):
        raise OptionError(option, path, what, reason="no such file or directory (on the driver)")
    if not os.access(path, os.R_OK):
        raise OptionError(option, path, what, reason="not readable by this process")
