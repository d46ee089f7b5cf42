"""The sink's options, parsed once on the driver into a frozen, picklable ``SinkOptions``.

``df.writeStream.format("durastream")`` and ``df.write.format("durastream")`` hand the sink Spark's string
options; ``SinkOptions.parse`` validates every one of them where ``start()``/``save()`` runs, so a typo or a
bad value fails before any task starts, with an error naming the option, the value and what is accepted.
Users read the options in ``docs/options.md``, generated from this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from durastream_spark.errors import OptionError
from durastream_spark.figures import FIGURES_KEYS, FiguresOptions
from durastream_spark.options import CONNECTION_KEYS, ConnectionOptions, OptionReader

# ---- option keys (canonical spelling; matching is case-insensitive) ----------------------------------------
STREAM = "stream"
CONTENT_TYPE = "contentType"
CREATE_STREAMS = "createStreams"
PRODUCER_ID = "producerId"
MAX_MESSAGES_PER_REQUEST = "maxMessagesPerRequest"
MAX_BYTES_PER_REQUEST = "maxBytesPerRequest"
MAX_IN_FLIGHT = "maxInFlight"
EXACTLY_ONCE = "exactlyOnce"
TRANSACTION_TTL = "transactionTtl"
# Spark itself may pass these to a streaming sink; they are not ours but must not be rejected.
SPARK_PASSTHROUGH_KEYS = frozenset({"checkpointLocation", "queryName"})
SPARK_PATH = "path"  # save(path)/start(path): refused with a pointer to 'stream'

SINK_KEYS: frozenset[str] = frozenset(
    {
        STREAM,
        CONTENT_TYPE,
        CREATE_STREAMS,
        PRODUCER_ID,
        MAX_MESSAGES_PER_REQUEST,
        MAX_BYTES_PER_REQUEST,
        MAX_IN_FLIGHT,
        EXACTLY_ONCE,
        TRANSACTION_TTL,
    }
)

# ---- values and defaults ------------------------------------------------------------------------------------
AUTO = "auto"
TRANSACTIONAL = "transactional"
ORDERED = "ordered"
MODES = (AUTO, TRANSACTIONAL, ORDERED)

DEFAULT_CONTENT_TYPE = "application/json"
DEFAULT_PRODUCER_ID = "spark"
DEFAULT_MAX_MESSAGES_PER_REQUEST = 10_000
# maxBytesPerRequest by mode. Staged requests are larger: each one is a staging file (created and
# fsynced) on the server and an HTTP request from the task, so 4 MiB instead of 1 MiB cut the server's and
# the Python workers' CPU per row by about a third (docs/benchmarks.md). Ordered mode keeps 1 MiB, because
# each partition's last partial request travels to the driver in its commit message.
DEFAULT_STAGED_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_ORDERED_REQUEST_BYTES = 1024 * 1024
DEFAULT_MAX_IN_FLIGHT = 4
DEFAULT_TRANSACTION_TTL_MS = 3_600_000
MAX_TRANSACTION_TTL_MS = 604_800_000  # the server's limit for Durastream-Txn-TTL (7 days)

# Producer ids and transaction handles are built from the prefix; keep it to characters that are valid in
# both (handles allow [A-Za-z0-9._:-]) and short enough that ids stay readable in logs.
_PRODUCER_PREFIX = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(\s*;.*)?$")


@dataclass(frozen=True)
class SinkOptions:
    """Everything the sink's tasks and its driver-side commit need to know. Frozen and picklable."""

    connection: ConnectionOptions
    stream: str | None = None
    content_type: str = DEFAULT_CONTENT_TYPE
    create_streams: bool = True
    producer_prefix: str = DEFAULT_PRODUCER_ID
    max_messages_per_request: int = DEFAULT_MAX_MESSAGES_PER_REQUEST
    max_bytes_per_request: int | None = None  # None: the mode's default (request_bytes)
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    exactly_once: str = AUTO
    transaction_ttl_s: int = DEFAULT_TRANSACTION_TTL_MS // 1000
    figures: FiguresOptions = FiguresOptions()  # batchFiguresPath (figures.py)

    def request_bytes(self, mode: str) -> int:
        """``maxBytesPerRequest`` if the user set it, else ``mode``'s default (see above)."""
        if self.max_bytes_per_request is not None:
            return self.max_bytes_per_request
        return (
            DEFAULT_STAGED_REQUEST_BYTES if mode == TRANSACTIONAL else DEFAULT_ORDERED_REQUEST_BYTES
        )

    @classmethod
    def parse(cls, options: Mapping[str, str] | None) -> SinkOptions:
        reader = OptionReader(options)
        if reader.has(SPARK_PATH):
            raise OptionError(
                SPARK_PATH,
                reader.raw(SPARK_PATH),
                "no path: name the target with .option('stream', ...) and the server with "
                ".option('url', ...), then call save()/start() without arguments",
            )
        reader.ensure_known(CONNECTION_KEYS | SINK_KEYS | FIGURES_KEYS | SPARK_PASSTHROUGH_KEYS)
        connection = ConnectionOptions.parse(reader)

        stream = reader.string(
            STREAM, accepted="a stream path relative to 'url', e.g. events/clicks"
        )
        if stream is not None:
            stream = _check_stream_path(stream)

        content_type = reader.string(
            CONTENT_TYPE,
            DEFAULT_CONTENT_TYPE,
            accepted="a media type such as application/json or application/octet-stream",
        )
        assert content_type is not None
        content_type = content_type.strip()
        if not _CONTENT_TYPE.match(content_type) or any(ch in content_type for ch in "\r\n"):
            raise OptionError(
                CONTENT_TYPE,
                content_type,
                "a media type such as application/json or application/octet-stream",
            )

        prefix = reader.string(
            PRODUCER_ID, DEFAULT_PRODUCER_ID, accepted="1-64 characters of [A-Za-z0-9._:-]"
        )
        assert prefix is not None
        if not _PRODUCER_PREFIX.match(prefix):
            raise OptionError(PRODUCER_ID, prefix, "1-64 characters of [A-Za-z0-9._:-]")

        ttl_ms = reader.duration_ms(
            TRANSACTION_TTL,
            DEFAULT_TRANSACTION_TTL_MS,
            minimum=1_000,
            maximum=MAX_TRANSACTION_TTL_MS,
        )
        if ttl_ms % 1000:
            raise OptionError(
                TRANSACTION_TTL,
                reader.raw(TRANSACTION_TTL),
                "a whole number of seconds from 1s to 7d (e.g. 3600s, 1h)",
            )

        return cls(
            connection=connection,
            stream=stream,
            content_type=content_type,
            create_streams=reader.boolean(CREATE_STREAMS, True),
            producer_prefix=prefix,
            max_messages_per_request=reader.integer(
                MAX_MESSAGES_PER_REQUEST,
                DEFAULT_MAX_MESSAGES_PER_REQUEST,
                minimum=1,
                maximum=1_000_000,
            ),
            max_bytes_per_request=reader.byte_size(
                MAX_BYTES_PER_REQUEST,
                None,  # None: the mode's default (request_bytes)
                minimum=1024,
                maximum=1024 * 1024 * 1024,
            ),
            max_in_flight=reader.integer(
                MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT, minimum=1, maximum=64
            ),
            exactly_once=reader.choice(EXACTLY_ONCE, AUTO, MODES),
            transaction_ttl_s=ttl_ms // 1000,
            figures=FiguresOptions.parse(reader),
        )


# Not part of a target path at either end, in the option and in a routing column alike (sink/routing.py):
# "s", "/s", "s/" and " s " name one stream. Inner characters are kept.
PATH_TRIM = " \t\n\r\f\v/"
PATH_SYNTAX = "a stream path relative to 'url' with non-empty segments other than '.' and '..'"


def normalize_path(path: str) -> str:
    """A target path without what is not part of it (``PATH_TRIM``)."""
    return path.strip(PATH_TRIM)


def check_stream_path(path: str) -> str:
    """``path`` (normalised) if it is a valid target path, else ``ValueError`` saying what is accepted."""
    if not path or any(segment in ("", ".", "..") for segment in path.split("/")):
        raise ValueError(f"expected {PATH_SYNTAX}")
    return path


def _check_stream_path(path: str) -> str:
    try:
        return check_stream_path(normalize_path(path))
    except ValueError:
        raise OptionError(STREAM, path, PATH_SYNTAX) from None
