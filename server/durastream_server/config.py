"""The server's runtime configuration: one frozen value built by the CLI (or a test) and read everywhere.

Keeping every tunable in one immutable place means the HTTP layer, the storage layer and the tests all agree
on the limits in force, and nothing can change them behind a running server's back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from durastream_server.auth import AuthToken, check_unique
from durastream_server.engine.jsonmode import DEFAULT_MAX_MESSAGES
from durastream_server.engine.producer_sweep import ProducerPolicy
from durastream_server.sizes import format_byte_size
from durastream_server.storage.committer import PACKED_APPEND_BYTES
from durastream_server.storage.datadir import DEFAULT_SEGMENT_BYTES, Durability

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4437  # section 13.1: the protocol's registered default port
DEFAULT_DATA_DIR = Path("durastream-data")
DEFAULT_LONG_POLL_TIMEOUT = 30.0
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# Messages (JSON array elements) one append or stage may carry: each costs the server work and memory of
# its own whatever its size, so the body limit alone does not bound a request (docs/security.md).
DEFAULT_MAX_MESSAGES_PER_REQUEST = DEFAULT_MAX_MESSAGES
# 4 MiB: a catch-up reader's per-request costs (HTTP exchange, headers, one pass of the client's
# parser) are paid once per chunk, and at 1 MiB they were about a third of a Spark task's CPU
# (docs/benchmarks.md, Source); larger chunks gained nothing more. It bounds the memory one read holds.
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_SSE_RECONNECT_SECONDS = (
    60.0  # section 10.2: close SSE roughly every 60 s for CDN collapsing
)
DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
DEFAULT_MAX_STAGED_BYTES = 1024 * 1024 * 1024  # staged appends: payload one handle may hold
DEFAULT_MAX_OPEN_FILES = 512  # segment files kept open (an LRU), however many streams there are
DEFAULT_MAX_HEADER_BYTES = 32 * 1024  # request line + headers of one request; more gets 431
DEFAULT_HEADER_TIMEOUT_SECONDS = (
    10.0  # a request's line and headers must arrive within this (slowloris)
)
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0  # longest silence while a request body is still arriving
# After its first body timeout, a body must keep up this average rate (see http/guard.py): slower than a
# 128 kbit/s link, so only a client trickling a body on purpose is cut off. A 64 MiB body may take 68 min.
DEFAULT_MIN_BODY_BYTES_PER_SECOND = 16 * 1024
WEBHOOK_LOCALHOST_CHOICES = ("auto", "allow", "deny")
# --packed-threshold: a packed stream is promoted to its own directory once its records would pass
# this many bytes (decision 0010). At most a segment: a packed stream's virtual segment 0 never rolls,
# and its promotion copies it whole into one write-ahead-log entry.
DEFAULT_PACKED_THRESHOLD = PACKED_APPEND_BYTES
MAX_PACKED_THRESHOLD = DEFAULT_SEGMENT_BYTES


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything a running server needs to know; validated once, at construction."""

    data_dir: Path = DEFAULT_DATA_DIR
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # The server's base URL as clients and webhook receivers reach it (--public-url); subscription
    # callback and JWKS URLs are built from it, never from a request's Host. None: the bound address.
    public_url: str | None = None
    long_poll_timeout: float = DEFAULT_LONG_POLL_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_messages_per_request: int = DEFAULT_MAX_MESSAGES_PER_REQUEST
    durability: Durability = Durability.FSYNC
    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # upper bound on one catch-up response body
    sse_reconnect_seconds: float = DEFAULT_SSE_RECONNECT_SECONDS
    shutdown_grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS
    log_level: str = "INFO"
    log_format: str = "text"  # "text" (escaped lines) or "json" (one object per line): logformat.py
    access_log: bool = False  # one INFO line per answered request (http/access.py)
    max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    # Decision 0010 step 2: small appends of packed streams as packed records. None (not given): on
    # with fsync durability, off with none (there is no write-ahead log to pack into); __post_init__
    # resolves it to a bool. True with --durability none is refused.
    packed_appends: bool | None = None
    packed_threshold: int = DEFAULT_PACKED_THRESHOLD
    # Exposure (docs/security.md). No tokens: no authentication. No CORS origins: loopback origins only.
    auth_tokens: tuple[AuthToken, ...] = ()
    cors_origins: tuple[str, ...] = ()
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    min_body_bytes_per_second: int = DEFAULT_MIN_BODY_BYTES_PER_SECOND
    # Host header values answered (http/hosts.py). Empty: loopback names on a loopback address, else any.
    allowed_hosts: tuple[str, ...] = ()
    # Webhooks to http://localhost / 127.0.0.x (section 12.8's development exception): "auto" allows them
    # only while the server listens on loopback, where nobody else can create subscriptions anyway.
    webhook_localhost: str = "auto"
    # How long idle producer state is kept (docs/decisions/0005-producer-state.md).
    producer_policy: ProducerPolicy = ProducerPolicy()
    # Worker processes (--workers, decision 0009, shards/). 1: one process, as always. In a worker of
    # N > 1: its shard index, and the directory of the workers' Unix sockets (set by the parent).
    workers: int = 1
    shard_index: int | None = None
    shard_sockets: Path | None = None
    # A worker hands a connection to the owner of its next request's stream instead of forwarding
    # every request (shards/handoff.py); off: always forward (diagnostics, benchmarks).
    connection_handoff: bool = True

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.public_url is not None:
            object.__setattr__(self, "public_url", normalize_public_url(self.public_url))
        if not self.long_poll_timeout > 0:
            raise ValueError(f"long-poll timeout must be > 0 seconds, got {self.long_poll_timeout}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max body bytes must be >= 1, got {self.max_body_bytes}")
        if self.max_messages_per_request < 1:
            raise ValueError(
                f"max messages per request must be >= 1, got {self.max_messages_per_request}"
            )
        if self.chunk_bytes < 1:
            raise ValueError(f"chunk bytes must be >= 1, got {self.chunk_bytes}")
        if not self.sse_reconnect_seconds > 0:
            raise ValueError(
                f"SSE reconnect interval must be > 0, got {self.sse_reconnect_seconds}"
            )
        if self.shutdown_grace_seconds < 0:
            raise ValueError(f"shutdown grace must be >= 0, got {self.shutdown_grace_seconds}")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log format must be text or json, got {self.log_format!r}")
        if self.max_staged_bytes < 1:
            raise ValueError(f"max staged bytes must be >= 1, got {self.max_staged_bytes}")
        if self.max_open_files < 1:
            raise ValueError(f"max open files must be >= 1, got {self.max_open_files}")
        if self.packed_appends is None:
            object.__setattr__(self, "packed_appends", self.durability is Durability.FSYNC)
        elif self.packed_appends and self.durability is not Durability.FSYNC:
            # Packed records live only in the synced write-ahead log and packs: with no WAL there is
            # nothing to pack them into, and ignoring the flag would be a silent default.
            raise ValueError(
                f"--packed-appends needs --durability fsync (packed records live in the synced "
                f"write-ahead log), got --durability {self.durability.value}: drop one of the two"
            )
        if not 0 <= self.packed_threshold <= MAX_PACKED_THRESHOLD:
            raise ValueError(
                f"--packed-threshold must be within 0..{MAX_PACKED_THRESHOLD} bytes "
                f"(0 .. the segment size, {format_byte_size(MAX_PACKED_THRESHOLD)}), "
                f"got {self.packed_threshold}"
            )
        check_unique(self.auth_tokens)
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
        if self.max_header_bytes < 1024:
            raise ValueError(f"max header bytes must be >= 1024, got {self.max_header_bytes}")
        if not self.header_timeout_seconds > 0:
            raise ValueError(f"header timeout must be > 0, got {self.header_timeout_seconds}")
        if not self.body_timeout_seconds > 0:
            raise ValueError(f"body timeout must be > 0, got {self.body_timeout_seconds}")
        if self.min_body_bytes_per_second < 1:
            raise ValueError(
                f"minimum body rate must be >= 1 byte/s, got {self.min_body_bytes_per_second}"
            )
        if self.webhook_localhost not in WEBHOOK_LOCALHOST_CHOICES:
            raise ValueError(
                f"webhook localhost must be one of {', '.join(WEBHOOK_LOCALHOST_CHOICES)}, "
                f"got {self.webhook_localhost!r}"
            )

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def public_base_url(self) -> str:
        """``--public-url``, else the listening address (``server.run`` fills in a port 0 it bound)."""
        return self.public_url if self.public_url is not None else self.base_url


def normalize_public_url(url: str) -> str:
    """``scheme://host[:port][/prefix]`` with http or https, no query, fragment or user-info; returned
    without a trailing ``/``. Raises ``ValueError`` saying what is wrong."""
    if not url or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ValueError(f"public URL {url!r} must be a non-empty URL without spaces")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a malformed port
    except ValueError as exc:
        raise ValueError(f"public URL {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"public URL {url!r} must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"public URL {url!r} must name a host, e.g. https://streams.example.com")
    if "?" in url or "#" in url:
        raise ValueError(f"public URL {url!r} must not have a query or fragment")
    if parts.username is not None or parts.password is not None:
        raise ValueError("public URL must not contain user-info (credentials)")  # never echoed
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
