"""The server's runtime configuration: one frozen value built by the CLI (or a test) and read everywhere.

Keeping every tunable in one immutable place means the HTTP layer, the storage layer and the tests all agree
on the limits in force, and nothing can change them behind a running server's back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from durastream_server.storage.datadir import Durability

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4437  # section 13.1: the protocol's registered default port
DEFAULT_DATA_DIR = Path("durastream-data")
DEFAULT_LONG_POLL_TIMEOUT = 30.0
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 1024 * 1024
DEFAULT_SSE_RECONNECT_SECONDS = (
    60.0  # section 10.2: close SSE roughly every 60 s for CDN collapsing
)
DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
DEFAULT_MAX_STAGED_BYTES = 1024 * 1024 * 1024  # staged appends: payload one handle may hold


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything a running server needs to know; validated once, at construction."""

    data_dir: Path = DEFAULT_DATA_DIR
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    long_poll_timeout: float = DEFAULT_LONG_POLL_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    durability: Durability = Durability.FSYNC
    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # upper bound on one catch-up response body
    sse_reconnect_seconds: float = DEFAULT_SSE_RECONNECT_SECONDS
    shutdown_grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS
    log_level: str = "INFO"
    max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not self.long_poll_timeout > 0:
            raise ValueError(f"long-poll timeout must be > 0 seconds, got {self.long_poll_timeout}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max body bytes must be >= 1, got {self.max_body_bytes}")
        if self.chunk_bytes < 1:
            raise ValueError(f"chunk bytes must be >= 1, got {self.chunk_bytes}")
        if not self.sse_reconnect_seconds > 0:
            raise ValueError(
                f"SSE reconnect interval must be > 0, got {self.sse_reconnect_seconds}"
            )
        if self.shutdown_grace_seconds < 0:
            raise ValueError(f"shutdown grace must be >= 0, got {self.shutdown_grace_seconds}")
        if self.max_staged_bytes < 1:
            raise ValueError(f"max staged bytes must be >= 1, got {self.max_staged_bytes}")

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
