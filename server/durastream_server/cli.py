"""``durastream-server``: command-line entry point.

Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 2 for a usage error (argparse's convention, also
used when the data directory is locked by another server: the operator asked for something that cannot
be), 1 for any other startup failure.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from durastream_server import __version__
from durastream_server.config import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_DATA_DIR,
    DEFAULT_HOST,
    DEFAULT_LONG_POLL_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_STAGED_BYTES,
    DEFAULT_PORT,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    DEFAULT_SSE_RECONNECT_SECONDS,
    ServerConfig,
)
from durastream_server.storage.datadir import AlreadyLocked, Durability

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _non_negative_seconds(text: str) -> float:
    if text.strip() in ("0", "0.0"):
        return 0.0
    return _positive_seconds(text)


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durastream-server",
        description="A crash-safe, file-backed Durable Streams server.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help=f"directory holding the streams (created if missing; default: ./{DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"port to listen on, 0 = any free port (default: {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--long-poll-timeout",
        type=_positive_seconds,
        default=DEFAULT_LONG_POLL_TIMEOUT,
        metavar="SECONDS",
        help=f"how long a long-poll waits for data before answering 204 (default: {DEFAULT_LONG_POLL_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="BYTES",
        help=f"largest accepted request body; larger ones get 413 (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    parser.add_argument(
        "--durability",
        choices=[d.value for d in Durability],
        default=Durability.FSYNC.value,
        help="fsync: acknowledge an append only after fdatasync (default); "
        "none: after write(2), which survives a process crash but not a power loss",
    )
    parser.add_argument(
        "--chunk-bytes",
        type=_positive_int,
        default=DEFAULT_CHUNK_BYTES,
        metavar="BYTES",
        help=f"largest catch-up response body (default: {DEFAULT_CHUNK_BYTES})",
    )
    parser.add_argument(
        "--sse-reconnect-seconds",
        type=_positive_seconds,
        default=DEFAULT_SSE_RECONNECT_SECONDS,
        metavar="SECONDS",
        help=f"close SSE connections after about this long so CDNs can collapse them (default: {DEFAULT_SSE_RECONNECT_SECONDS:g})",
    )
    parser.add_argument(
        "--shutdown-grace-seconds",
        type=_non_negative_seconds,
        default=DEFAULT_SHUTDOWN_GRACE_SECONDS,
        metavar="SECONDS",
        help=f"on shutdown, how long to let in-flight requests finish (default: {DEFAULT_SHUTDOWN_GRACE_SECONDS:g})",
    )
    parser.add_argument(
        "--max-staged-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_STAGED_BYTES,
        metavar="BYTES",
        help="largest payload one staged-append handle may hold; more gets 413 "
        f"(default: {DEFAULT_MAX_STAGED_BYTES})",
    )
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default="INFO",
        help=f"one of {', '.join(LOG_LEVELS)} (default: INFO)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        long_poll_timeout=args.long_poll_timeout,
        max_body_bytes=args.max_body_bytes,
        durability=Durability(args.durability),
        chunk_bytes=args.chunk_bytes,
        sse_reconnect_seconds=args.sse_reconnect_seconds,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        log_level=args.log_level,
        max_staged_bytes=args.max_staged_bytes,
    )


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _quiet_signals() -> Callable[[], None]:
    """uvicorn re-raises the shutdown signal after its graceful shutdown; catch it so we exit 0."""
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args)
    _configure_logging(config.log_level)

    # Imported here so `--help` and argument errors stay fast and independent of the server stack.
    from durastream_server.server import bind_socket, run

    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"durastream-server: error: --data-dir {config.data_dir}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as exc:
        print(
            f"durastream-server: error: cannot listen on --host {config.host} --port {config.port}: {exc}",
            file=sys.stderr,
        )
        return EXIT_FAILURE

    def announce(url: str) -> None:
        print(
            f"durastream-server {__version__} listening on {url} (data dir: {config.data_dir})",
            flush=True,
        )

    restore = _quiet_signals()
    try:
        app = run(config, sock, announce)
    finally:
        restore()
        sock.close()
    error = app.startup_error
    if isinstance(error, AlreadyLocked):
        print(
            f"durastream-server: error: --data-dir {config.data_dir} is locked by another running server "
            f"({error}); stop it or choose another directory",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if error is not None:
        print(
            f"durastream-server: error: startup failed: {type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return EXIT_OK
