"""``durastream-server``: command-line entry point.

Every flag can also come from an environment variable, ``DURASTREAM_`` and the flag's name in capitals with
``_`` for ``-`` (``--data-dir`` is ``DURASTREAM_DATA_DIR``), as ``PGDATA`` configures Postgres: containers
and service managers set variables more easily than arguments. The variables are derived from the argparse
definitions (``environment.py``), so a new flag gets one without further code, and ``--help`` shows each.

Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 2 for a usage error (argparse's convention, also
used when the data directory is locked by another server: the operator asked for something that cannot
be), 1 for any other startup failure.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from durastream_server import __version__, tools
from durastream_server.allocator import keep_freed_memory
from durastream_server.auth import (
    MODES,
    AuthToken,
    TokenConfigError,
    check_unique,
    parse_token_file,
    parse_token_spec,
)
from durastream_server.config import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_DATA_DIR,
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    DEFAULT_HOST,
    DEFAULT_LONG_POLL_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_MESSAGES_PER_REQUEST,
    DEFAULT_MAX_OPEN_FILES,
    DEFAULT_MAX_STAGED_BYTES,
    DEFAULT_MIN_BODY_BYTES_PER_SECOND,
    DEFAULT_PACKED_THRESHOLD,
    DEFAULT_PORT,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    DEFAULT_SSE_RECONNECT_SECONDS,
    MAX_PACKED_THRESHOLD,
    WEBHOOK_LOCALHOST_CHOICES,
    ServerConfig,
    normalize_public_url,
)
from durastream_server.engine.producer_sweep import (
    DEFAULT_EXPIRY_SECONDS,
    DEFAULT_GROUP_EXPIRY_SECONDS,
    DEFAULT_QUIET_SECONDS,
    ProducerPolicy,
)
from durastream_server.environment import parse_with_environment, with_environment
from durastream_server.http.cors import normalize_origin
from durastream_server.http.hosts import normalize_allowed_host
from durastream_server.http.paths import STREAM_ROOT
from durastream_server.logformat import LOG_FORMATS, TEXT, formatter
from durastream_server.sizes import format_byte_size, parse_byte_size
from durastream_server.storage.datadir import AlreadyLocked, Durability
from durastream_server.storage.features import UnknownFormat

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


def _auth_token(text: str) -> AuthToken:
    try:
        return parse_token_spec(text, "TOKEN[:MODE[:PREFIX]]")
    except TokenConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None  # never echoes the token


def _origin(text: str) -> str:
    try:
        return normalize_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _public_url(text: str) -> str:
    try:
        return normalize_public_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _allowed_host(text: str) -> str:
    try:
        return normalize_allowed_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _byte_size(text: str) -> int:
    """A positive byte size: ``67108864``, ``64m``, ``1g`` (the grammar of ``sizes.py``, as the connector's)."""
    value = _non_negative_byte_size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive byte size, got {text!r}")
    return value


def _non_negative_byte_size(text: str) -> int:
    """A byte size that may be 0 (``--packed-threshold``; its upper bound is checked by ``ServerConfig``)."""
    try:
        return parse_byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _min_header_bytes(text: str) -> int:
    value = _byte_size(text)
    if value < 1024:
        raise argparse.ArgumentTypeError(f"expected at least 1k (1024 bytes), got {text!r}")
    return value


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
        "--public-url",
        type=_public_url,
        metavar="URL",
        help="the server's base URL as clients and webhook receivers reach it, e.g. "
        "https://streams.example.com (http or https, optional path prefix, no query); subscription "
        "callback and JWKS URLs are built from it, never from a request's Host header "
        "(default: the listening address, http(s)://HOST:PORT)",
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
        type=_byte_size,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="BYTES",
        help="largest accepted request body; larger ones get 413 "
        f"(default: {format_byte_size(DEFAULT_MAX_BODY_BYTES)})",
    )
    parser.add_argument(
        "--max-messages-per-request",
        type=_positive_int,
        default=DEFAULT_MAX_MESSAGES_PER_REQUEST,
        metavar="COUNT",
        help="most messages (JSON array elements) one append or stage may carry; more get 413 "
        f"(default: {DEFAULT_MAX_MESSAGES_PER_REQUEST})",
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
        type=_byte_size,
        default=DEFAULT_CHUNK_BYTES,
        metavar="BYTES",
        help=f"largest catch-up response body (default: {format_byte_size(DEFAULT_CHUNK_BYTES)})",
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
        type=_byte_size,
        default=DEFAULT_MAX_STAGED_BYTES,
        metavar="BYTES",
        help="largest payload one staged-append handle may hold, each message counting 24 bytes "
        f"more; more gets 413 (default: {format_byte_size(DEFAULT_MAX_STAGED_BYTES)})",
    )
    parser.add_argument(
        "--max-open-files",
        type=_positive_int,
        default=DEFAULT_MAX_OPEN_FILES,
        metavar="COUNT",
        help="segment files kept open at once (least recently used are closed), whatever the "
        f"number of streams (default: {DEFAULT_MAX_OPEN_FILES})",
    )
    parser.add_argument(
        "--packed-threshold",
        type=_non_negative_byte_size,
        default=DEFAULT_PACKED_THRESHOLD,
        metavar="BYTES",
        help="with packed appends, a packed stream whose records would pass this size is promoted "
        f"to a directory of its own; 0 to {format_byte_size(MAX_PACKED_THRESHOLD)} (the segment "
        f"size; 0: at its first append) (default: {format_byte_size(DEFAULT_PACKED_THRESHOLD)})",
    )
    parser.add_argument(
        "--packed-appends",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="(docs/decisions/0010-packed-small-streams.md) a stream created empty keeps its small "
        "appends in the write-ahead log and shared pack files, without a directory of its own, "
        "until it passes --packed-threshold (then, or on a fork or staged commit, it gets one). "
        "Marks the data directory (FEATURES): servers older than that marker must not open it "
        "again. Needs --durability fsync; --no-packed-appends: a directory per stream from its "
        "first append (default: on with --durability fsync, off with none)",
    )
    producers = parser.add_argument_group(
        "producer state",
        "how long idle idempotent producers are remembered in memory (docs/server.md, "
        "docs/decisions/0005-producer-state.md); 0 = forever",
    )
    producers.add_argument(
        "--producer-quiet-seconds",
        type=_non_negative_seconds,
        default=DEFAULT_QUIET_SECONDS,
        metavar="SECONDS",
        help="after this long without a request, a producer's request digests are shortened to 8 "
        f"bytes (default: {DEFAULT_QUIET_SECONDS}, a day)",
    )
    producers.add_argument(
        "--producer-expiry-seconds",
        type=_non_negative_seconds,
        default=DEFAULT_EXPIRY_SECONDS,
        metavar="SECONDS",
        help="after this long without a request, a producer is forgotten: a later request of it is a "
        "new producer, or 409 PRODUCER_FORGOTTEN for clients that ask (the Spark sink does) "
        f"(default: {DEFAULT_EXPIRY_SECONDS}, 7 days)",
    )
    producers.add_argument(
        "--producer-group-expiry-seconds",
        type=_non_negative_seconds,
        default=DEFAULT_GROUP_EXPIRY_SECONDS,
        metavar="SECONDS",
        help="how long a stream keeps the highest epoch of a group of forgotten producers, which is "
        f"what PRODUCER_FORGOTTEN is decided by (default: {DEFAULT_GROUP_EXPIRY_SECONDS}, 30 days)",
    )
    security = parser.add_argument_group(
        "security and exposure", "authentication, TLS, CORS and request limits (docs/security.md)"
    )
    security.add_argument(
        "--auth-token",
        type=_auth_token,
        action="append",
        default=[],
        metavar="TOKEN[:MODE[:PREFIX]]",
        help=f"require bearer tokens; MODE is one of {MODES} (default read-write), PREFIX limits the "
        "token to streams under that path. Repeatable. Visible to other local users in the process "
        "list: prefer --auth-token-file",
    )
    security.add_argument(
        "--auth-token-file",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="require bearer tokens listed in PATH, one 'TOKEN MODE [PREFIX]' per line, '#' comments "
        "(repeatable; read at start-up)",
    )
    security.add_argument(
        "--cors-origin",
        type=_origin,
        action="append",
        default=[],
        metavar="ORIGIN",
        help="browser origin allowed to read responses (e.g. https://app.example), 'loopback', or '*' "
        "for any; repeatable (default: loopback origins only)",
    )
    security.add_argument(
        "--allowed-host",
        type=_allowed_host,
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a Host header value the server answers (others get 421; defends against DNS rebinding): "
        "a name or address, with :PORT for that port only, 'loopback', or '*'; repeatable "
        "(default: loopback names when listening on loopback, else any)",
    )
    security.add_argument(
        "--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate (chain)"
    )
    security.add_argument("--tls-key", type=Path, metavar="PEM", help="private key for --tls-cert")
    security.add_argument(
        "--max-header-bytes",
        type=_min_header_bytes,
        default=DEFAULT_MAX_HEADER_BYTES,
        metavar="BYTES",
        help="largest request line plus headers; larger get 431 "
        f"(default: {format_byte_size(DEFAULT_MAX_HEADER_BYTES)})",
    )
    security.add_argument(
        "--header-timeout-seconds",
        type=_positive_seconds,
        default=DEFAULT_HEADER_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="a request's line and headers (and, with TLS, the handshake) must arrive within this, "
        f"or the connection is closed (default: {DEFAULT_HEADER_TIMEOUT_SECONDS:g})",
    )
    security.add_argument(
        "--body-timeout-seconds",
        type=_positive_seconds,
        default=DEFAULT_BODY_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="longest silence while a request body is arriving; past it the server answers 408 and "
        f"closes the connection (default: {DEFAULT_BODY_TIMEOUT_SECONDS:g})",
    )
    security.add_argument(
        "--min-body-bytes-per-second",
        type=_byte_size,
        default=DEFAULT_MIN_BODY_BYTES_PER_SECOND,
        metavar="BYTES",
        help="after its first --body-timeout-seconds, a request body must arrive at least this fast "
        "on average, or the connection is closed "
        f"(default: {format_byte_size(DEFAULT_MIN_BODY_BYTES_PER_SECOND)})",
    )
    security.add_argument(
        "--webhook-localhost",
        choices=WEBHOOK_LOCALHOST_CHOICES,
        default="auto",
        help="webhook subscriptions to http://localhost and 127.0.0.x (a development convenience that "
        "is an SSRF risk on a shared host): auto allows them only while listening on loopback "
        "(default: auto)",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="(docs/decisions/0009-more-than-one-core.md; first step) serve with N worker processes, "
        "each owning a shard of the streams in <data-dir>/shards/<k>/, all listening on the port. N > 1 "
        "makes a new data directory sharded for N, and a sharded directory only starts with its own "
        "N. With N > 1, subscriptions answer 501 (requests across streams are fanned out to every "
        "shard), and a fork must be in its source's shard (docs/server.md, "
        "'Worker processes') (default: 1, one process)",
    )
    parser.add_argument("--shard-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shard-sockets", type=Path, default=None, help=argparse.SUPPRESS)
    # Diagnostics and benchmarks: forward every request for another shard, never hand a connection
    # over (docs/server.md, "Worker processes").
    parser.add_argument("--no-connection-handoff", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default="INFO",
        help=f"one of {', '.join(LOG_LEVELS)} (default: INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=TEXT,
        help="text: one escaped line per record; json: one JSON object per line, with the request id "
        "of the request being served (default: text)",
    )
    parser.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log one INFO line per answered request: request id, method, path, status, duration, "
        "body sizes; never headers or bodies (default: off)",
    )
    return with_environment(parser)


def parse_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """The command line, completed from ``environ`` (``DURASTREAM_*``), then from the defaults."""
    return parse_with_environment(parser, argv, os.environ if environ is None else environ)


def auth_tokens_from_args(args: argparse.Namespace) -> tuple[tuple[AuthToken, ...], list[str]]:
    """Every configured token, and warnings (e.g. a token file readable by others).

    Raises ``TokenConfigError`` naming the flag, file and line of a bad token, never its value.
    """
    tokens = [
        AuthToken(t.digest, t.mode, t.prefix, f"--auth-token #{number}")
        for number, t in enumerate(args.auth_token, start=1)
    ]
    warnings: list[str] = []
    for path in args.auth_token_file:
        found, notes = parse_token_file(path)
        tokens.extend(found)
        warnings.extend(notes)
    check_unique(tuple(tokens))
    return tuple(tokens), warnings


def config_from_args(
    args: argparse.Namespace, auth_tokens: tuple[AuthToken, ...] | None = None
) -> ServerConfig:
    if auth_tokens is None:
        auth_tokens, _ = auth_tokens_from_args(args)
    return ServerConfig(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        public_url=args.public_url,
        long_poll_timeout=args.long_poll_timeout,
        max_body_bytes=args.max_body_bytes,
        max_messages_per_request=args.max_messages_per_request,
        durability=Durability(args.durability),
        chunk_bytes=args.chunk_bytes,
        sse_reconnect_seconds=args.sse_reconnect_seconds,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        log_level=args.log_level,
        log_format=args.log_format,
        access_log=args.access_log,
        max_staged_bytes=args.max_staged_bytes,
        max_open_files=args.max_open_files,
        packed_appends=args.packed_appends,
        packed_threshold=args.packed_threshold,
        auth_tokens=auth_tokens,
        cors_origins=tuple(args.cors_origin),
        tls_certfile=args.tls_cert,
        tls_keyfile=args.tls_key,
        max_header_bytes=args.max_header_bytes,
        header_timeout_seconds=args.header_timeout_seconds,
        body_timeout_seconds=args.body_timeout_seconds,
        min_body_bytes_per_second=args.min_body_bytes_per_second,
        allowed_hosts=tuple(args.allowed_host),
        webhook_localhost=args.webhook_localhost,
        producer_policy=ProducerPolicy(
            quiet_seconds=args.producer_quiet_seconds,
            expiry_seconds=args.producer_expiry_seconds,
            group_expiry_seconds=args.producer_group_expiry_seconds,
        ),
        workers=args.workers,
        shard_index=args.shard_index,
        shard_sockets=args.shard_sockets,
        connection_handoff=not args.no_connection_handoff,
    )


def startup_line(config: ServerConfig, bound_url: str) -> str:
    """The first line on stdout: the stream root first, because it is the connector's ``url`` option.

    ``--public-url`` names the root when set (clients reach the server there); the bound address follows,
    for whoever reads the line on the host.
    """
    root = (config.public_url or bound_url) + STREAM_ROOT
    return (
        f"durastream-server {__version__} serving {root} "
        f"(data dir: {config.data_dir}; listening on {bound_url})"
    )


def _check_tls(config: ServerConfig) -> str | None:
    """Load the certificate and key once now, so a bad pair is a clear error rather than a traceback."""
    if config.tls_certfile is None or config.tls_keyfile is None:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            config.tls_certfile, config.tls_keyfile
        )
    except (OSError, ssl.SSLError) as exc:
        return (
            f"--tls-cert {config.tls_certfile} / --tls-key {config.tls_keyfile}: cannot load: {exc}"
        )
    return None


def _warn(message: str, log_format: str = TEXT) -> None:
    """Loudly: a log record for log collectors, and a banner on stderr for whoever started the server
    (not with ``--log-format json``: there every line on stderr is a JSON object)."""
    logging.getLogger("durastream_server").warning(message)
    if log_format == TEXT:
        print(f"durastream-server: WARNING: {message}", file=sys.stderr, flush=True)


def _configure_logging(level: str, log_format: str = TEXT) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))  # log lines never carry a client's control chars
    logging.basicConfig(level=level, handlers=[handler])


def _quiet_signals() -> Callable[[], None]:
    """uvicorn re-raises the shutdown signal after its graceful shutdown; catch it so we exit 0."""
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _prepare_data_dir(path: Path) -> str | None:
    """Create the data directory if missing; ``None`` when it is usable, else what is wrong in words an
    operator acts on (``[Errno 17] File exists`` does not say that the path is a file)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        return (
            f"{blocker} is a file, not a directory; give a directory (it is created if missing) or "
            "move the file away"
        )
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    return None


def _check_layout(config: ServerConfig) -> str | None:
    """Refuse a data directory made for another ``--workers``; make a new one sharded for N > 1."""
    from durastream_server.shards.layout import LayoutMismatch, ShardLayout

    try:
        ShardLayout.read(config.data_dir).create(config.workers)
    except LayoutMismatch as exc:
        return str(exc)
    return None


def _supervise(
    config: ServerConfig, sock: socket.socket, arguments: list[str], announce: Callable[[str], None]
) -> int:
    """``--workers N``: the parent process (``shards/supervisor.py``). It keeps ``sock`` bound, not
    listening, so the port (also a port 0 made real) stays this server's; the workers bind it too."""
    from durastream_server.server import bound_url
    from durastream_server.shards.supervisor import Supervisor, worker_base_command

    port = sock.getsockname()[1]
    url = bound_url(sock, tls=config.tls)
    supervisor = Supervisor(config.data_dir, config.workers, worker_base_command(arguments), port)
    try:
        return supervisor.run(lambda: announce(url))
    finally:
        sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments and arguments[0] in tools.COMMANDS:  # offline tools: check, inspect (tools.py)
        return tools.main(arguments)
    parser = build_parser()
    args = parse_args(parser, argv, os.environ)
    try:
        tokens, token_warnings = auth_tokens_from_args(args)
        config = config_from_args(args, tokens)
    except ValueError as exc:  # TokenConfigError included; messages never contain a token
        print(f"durastream-server: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging(config.log_level, config.log_format)
    keep_freed_memory()
    tls_error = _check_tls(config)
    if tls_error is not None:
        print(f"durastream-server: error: {tls_error}", file=sys.stderr)
        return EXIT_USAGE

    # Imported here so `--help` and argument errors stay fast and independent of the server stack.
    from durastream_server.server import bind_shard_socket, bind_socket, exposure_warnings, run

    data_dir_error = _prepare_data_dir(config.data_dir)
    if data_dir_error is not None:
        print(
            f"durastream-server: error: --data-dir {config.data_dir}: {data_dir_error}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    if config.shard_index is None:
        layout_error = _check_layout(config)
        if layout_error is not None:
            print(f"durastream-server: error: {layout_error}", file=sys.stderr)
            return EXIT_USAGE
    sharded = config.workers > 1
    try:
        sock = bind_socket(config.host, config.port, reuse_port=sharded)
    except OSError as exc:
        print(
            f"durastream-server: error: cannot listen on --host {config.host} --port {config.port}: {exc}",
            file=sys.stderr,
        )
        return EXIT_FAILURE

    for warning in [*token_warnings, *exposure_warnings(config, sock.getsockname()[0])]:
        _warn(warning, config.log_format)

    def announce(url: str) -> None:
        print(startup_line(config, url), flush=True)

    if sharded and config.shard_index is None:
        return _supervise(config, sock, arguments, announce)
    shard_socket = bind_shard_socket(config)
    restore = _quiet_signals()
    try:
        app = run(config, sock, announce, () if shard_socket is None else (shard_socket,))
    finally:
        restore()
        sock.close()
        if shard_socket is not None:
            shard_socket.close()
    error = app.startup_error
    if isinstance(error, AlreadyLocked):
        print(
            f"durastream-server: error: --data-dir {config.data_dir} is locked by another running server "
            f"({error}); stop it or choose another directory",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if isinstance(error, UnknownFormat):
        print(f"durastream-server: error: --data-dir {config.data_dir}: {error}", file=sys.stderr)
        return EXIT_USAGE
    if error is not None:
        print(
            f"durastream-server: error: startup failed: {type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return EXIT_OK
