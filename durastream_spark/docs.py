"""Generates ``docs/options.md`` from the option parsers, so the reference cannot drift from the code.

    python -m durastream_spark.docs --output docs/options.md     # write it
    python -m durastream_spark.docs --check docs/options.md      # exit 1 if it is out of date

What comes from where:

- **Which options exist**: asked from the parsers themselves. ``SourceOptions.parse`` and
  ``SinkOptions.parse`` reject an unknown key with an ``OptionError`` whose ``accepted`` lists every key
  they accept; :func:`accepted_keys` reads that list. An option added to a parser (say ``tokenFile`` in
  ``durastream_spark/options.py``) therefore shows up here at once, and generation fails with
  :class:`UndocumentedOption` until it has an entry in :data:`OPTIONS`.
- **Defaults**: read from the frozen dataclasses that the parsers return for minimal options.
- **Accepted values and the error for a bad value**: the parser's own ``OptionError`` for the entry's
  ``bad`` value, verbatim. Every ``example`` is parsed too, and must be accepted.
- **Description, type and example**: written here, once per option, in :data:`OPTIONS`.

``tests/docs/test_options_doc.py`` checks that the checked-in file equals the output, and that every key
the parsers accept appears in it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durastream_spark.errors import OptionError
from durastream_spark.options import HEADER_PREFIX
from durastream_spark.sink.options import ORDERED, TRANSACTIONAL, SinkOptions
from durastream_spark.sizes import SYNTAX as SIZE_SYNTAX
from durastream_spark.sizes import format_byte_size
from durastream_spark.source.options import SourceOptions

CONNECTION = "connection"
SOURCE = "source"
SINK = "sink"
SCOPES = (CONNECTION, SOURCE, SINK)
SCOPE_TITLES = {
    CONNECTION: "Connection options (source and sink)",
    SOURCE: "Source options (`spark.readStream` / `spark.read`)",
    SINK: "Sink options (`df.writeStream` / `df.write`)",
}

URL_EXAMPLE = "http://127.0.0.1:4437/v1/stream"
BYTE_SIZE = "byte size"  # the type of every option read with OptionReader.byte_size
# The smallest options each parser accepts; the defaults are read from what they parse into.
BASE: dict[str, dict[str, str]] = {
    SOURCE: {"url": URL_EXAMPLE, "streams": "events"},
    SINK: {"url": URL_EXAMPLE},
}
# A path that must exist for the option to parse: a temporary file stands in for it while checking.
_EXISTING_FILE = "<existing file>"
_PROBE_KEY = "durastreamDocsProbe"


class UndocumentedOption(LookupError):
    """A parser accepts an option that has no entry in ``OPTIONS``."""


@dataclass(frozen=True)
class OptionDoc:
    """One option as users read it. ``default`` renders the parsed default; ``bad`` must be refused."""

    key: str
    scope: str
    type: str
    summary: str
    example: str
    bad: str | None
    default: Callable[[Any], str] | str
    details: str = ""
    example_key: str | None = None  # for a key family (``header.<Name>``): the key the example uses
    bad_key: str | None = None  # ... and the key the bad example uses
    file_example: bool = False  # the example is a path: check it with a temporary file
    # Options the example and the bad value are checked together with (an option that only makes
    # sense next to another one, like a strategy for a starting instant).
    together: tuple[tuple[str, str], ...] = ()


def _ms(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"`{ms}` ({_human_ms(ms)})"


def _human_ms(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _bytes(n: int) -> str:
    short = format_byte_size(n)
    return f"`{n}` ({short})" if short != str(n) else f"`{n}`"


def _code(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


# OptionDoc(key, scope, type, summary, example, bad value, default, details=..., ...), one per option.
OPTIONS: tuple[OptionDoc, ...] = (
    # ---- connection ---------------------------------------------------------------------------------------
    OptionDoc(
        "url",
        CONNECTION,
        "URL",
        "The stream root: stream paths (`streams`, `pattern`, `stream`) are relative to it.",
        URL_EXAMPLE,
        "http://user:secret@host/v1/stream",
        "(required)",
        details="http or https; no query, no fragment, no `user:password@` (credentials go in "
        "`tokenFile` or `header.Authorization`). A trailing slash is ignored.",
    ),
    OptionDoc(
        HEADER_PREFIX + "<Name>",
        CONNECTION,
        "string (secret)",
        "Sent as request header `<Name>` on every request, e.g. `header.Authorization`.",
        "Bearer eyJhbGciOi...",
        "application/json",
        "(none)",
        details="Values are secrets: never shown in a repr, a log line or an error. Headers the "
        "connector manages (`Content-Type`, `Content-Length`, `Host`, `Stream-*`, `Producer-*`, "
        "`Durastream-*`) are refused. Spark shows option values in plans and the UI unless their key "
        "matches `spark.redaction.regex`; prefer `tokenFile`, or extend the regex with `|header\\.`.",
        example_key="header.Authorization",
        bad_key="header.Content-Type",
    ),
    OptionDoc(
        "tokenFile",
        CONNECTION,
        "path",
        "A file holding a bearer token: every request carries `Authorization: Bearer <token>`.",
        "/var/run/secrets/durastream/token",
        "/no/such/token",
        lambda o: _code(o.connection.token_file),
        details="Read by whichever process sends a request (driver or executor) and re-read when the "
        "file changes, so rotated tokens are picked up by long-running queries: the file must exist at "
        "the same path on the driver and on every executor. Checked once on the driver when the "
        "options are parsed. Cannot be combined with `header.Authorization`.",
        file_example=True,
    ),
    OptionDoc(
        "tls.verify",
        CONNECTION,
        "boolean",
        "Verify the server's TLS certificate (https URLs).",
        "false",
        "no",
        lambda o: _code(o.connection.tls_verify),
    ),
    OptionDoc(
        "tls.caBundle",
        CONNECTION,
        "path",
        "A PEM file, or a directory of CA certificates, to verify the server against instead of the "
        "system's CAs.",
        "/etc/ssl/private-ca.pem",
        "/no/such/ca.pem",
        lambda o: (
            "(the system's CAs)"
            if o.connection.tls_ca_bundle is None
            else _code(o.connection.tls_ca_bundle)
        ),
        details="Only with `tls.verify=true`. Like `tokenFile`, it must exist on the driver and on "
        "every executor.",
        file_example=True,
    ),
    OptionDoc(
        "requestTimeoutMs",
        CONNECTION,
        "duration",
        "Socket timeout for connecting and for each read of a response.",
        "10s",
        "soon",
        lambda o: _ms(o.connection.request_timeout_s),
    ),
    OptionDoc(
        "maxConnections",
        CONNECTION,
        "integer",
        "Keep-alive connections kept per worker process and server.",
        "64",
        "0",
        lambda o: _code(o.connection.max_connections),
    ),
    OptionDoc(
        "retry.maxAttempts",
        CONNECTION,
        "integer",
        "Attempts per request, the first included (`1`: no retries).",
        "5",
        "-1",
        lambda o: _code(o.connection.retry.max_attempts),
        details="Only requests that are safe to repeat are retried (reads, and appends that carry a "
        "producer tuple or stage under a handle), on connection errors and 429/502/503/504.",
    ),
    OptionDoc(
        "retry.maxElapsedMs",
        CONNECTION,
        "duration",
        "Stop retrying once this much time has passed since the first attempt.",
        "5m",
        "2d",
        lambda o: _ms(o.connection.retry.max_elapsed_s),
    ),
    OptionDoc(
        "retry.initialBackoffMs",
        CONNECTION,
        "duration",
        "Backoff cap of the first retry; it doubles with every retry up to `retry.maxBackoffMs`.",
        "250ms",
        "0",
        lambda o: _ms(o.connection.retry.initial_backoff_s),
        details="Each wait is uniform in [0, cap] (full jitter) and never shorter than the server's "
        "`Retry-After`.",
    ),
    OptionDoc(
        "retry.maxBackoffMs",
        CONNECTION,
        "duration",
        "The largest backoff cap.",
        "30s",
        "1.5ms",
        lambda o: _ms(o.connection.retry.max_backoff_s),
        details="At least `retry.initialBackoffMs`.",
    ),
    OptionDoc(
        "batchFiguresPath",
        CONNECTION,
        "path",
        "Streaming only: a directory on the driver where the source and the sink record each "
        "micro-batch's figures (the INFO lines) for `durastream_spark.figures.for_batch`.",
        "/tmp/durastream-figures/readings",
        "dbfs:/figures",
        "(none: nothing recorded)",
        details="An absolute path on the driver's local file system (`file:` URLs too), one per query "
        "like a checkpoint; created when the first batch is recorded. The source appends one JSON line per "
        "batch to `source.jsonl`, the sink to `sink.jsonl`, each rotated past 1 MiB. A "
        "`StreamingQueryListener` gets a batch's figures as dicts with `for_batch(path, event.progress)` "
        "(docs/source.md, 'Batch figures in your code'). Refused by `spark.read` and `df.write`.",
    ),
    # ---- source -------------------------------------------------------------------------------------------
    OptionDoc(
        "streams",
        SOURCE,
        "list of stream paths",
        "Comma-separated stream paths, relative to `url`, to read.",
        "events/a,events/b",
        "events/a,,events/b",
        "(one of `streams` and `pattern` is required)",
        details="Exactly one of `streams` and `pattern`.",
    ),
    OptionDoc(
        "pattern",
        SOURCE,
        "glob",
        "Read every stream whose path matches: `*` is one segment, `**` any number, `ev*` a prefix "
        "inside a segment.",
        "events/**",
        "/",
        "(none)",
        details="Streams created while the query runs are picked up from their first message. Needs "
        "the server's listing extension (durastream-server has it), checked when the query plans its "
        "first batch.",
    ),
    OptionDoc(
        "startingOffsets",
        SOURCE,
        "`earliest`, `latest` or JSON",
        'Where a new query starts: `earliest`, `latest`, or JSON `{"<path>": "<offset>"}` '
        '(values may also be `"earliest"`, `"latest"` or `"-1"`; unlisted streams start at earliest).',
        '{"events/a": "0000000000000000_0000000000001234"}',
        '{"events/a": 1234}',
        lambda o: _code(o.starting_text or "earliest"),
        details="Used only when the checkpoint is new; a restarted query continues from its "
        "checkpoint. An offset past a stream's tail fails when the first batch is planned. "
        "The checkpoint's own offsets have this JSON form, so they can be copied here.",
    ),
    OptionDoc(
        "endingOffsets",
        SOURCE,
        "`latest` or JSON",
        "Batch reads (`spark.read`) only: where the read ends; `latest` or JSON as for "
        "`startingOffsets` (unlisted streams: latest).",
        "latest",
        "earliest",
        lambda o: _code(o.ending_text or "latest"),
    ),
    OptionDoc(
        "startingTimestamp",
        SOURCE,
        "instant",
        "Start every stream at its first message whose server append time is at or after this "
        "instant: milliseconds since the Unix epoch, or ISO-8601 with a zone.",
        "2024-01-31T12:00:00Z",
        "2024-01-31 12:00",
        "(none)",
        details="Like Kafka's option of that name. Used only when the checkpoint is new, and not "
        "together with `startingOffsets` or `startingOffsetsByTimestamp`. A stream with no message "
        "that late fails the query unless `startingOffsetsByTimestampStrategy` is `latest`. Needs the "
        "server's time lookups (durastream-server); on other servers the query fails when it plans "
        "its first batch, naming the server and the missing extension.",
    ),
    OptionDoc(
        "startingOffsetsByTimestamp",
        SOURCE,
        "JSON",
        'Per stream: `{"<path>": <instant>}`, instants as for `startingTimestamp` (numbers or '
        "strings); streams not named start as `startingOffsets` says.",
        '{"events": 1706702400000}',
        '{"events": "noon"}',
        "(none)",
        details="A stream may not be named here and in `startingOffsets` both. Needs the server's time "
        "lookups, like `startingTimestamp`.",
    ),
    OptionDoc(
        "startingOffsetsByTimestampStrategy",
        SOURCE,
        "`error` or `latest`",
        "What a stream with no message at or after its starting instant does: `error` fails the query "
        "naming the stream; `latest` starts it at its tail.",
        "latest",
        "earliest",
        lambda o: _code(o.timestamp_strategy),
        details="As Kafka's option of that name. Only together with `startingTimestamp` or "
        "`startingOffsetsByTimestamp`.",
        together=(("startingTimestamp", "0"),),
    ),
    OptionDoc(
        "endingTimestamp",
        SOURCE,
        "instant",
        "Batch reads only: every stream ends before its first message at or after this instant (at "
        "its tail when there is none).",
        "1706702400000",
        "tomorrow",
        "(none)",
        details="Not together with `endingOffsets` or `endingOffsetsByTimestamp`, nor earlier than "
        "`startingTimestamp`. Refused for streaming queries.",
    ),
    OptionDoc(
        "endingOffsetsByTimestamp",
        SOURCE,
        "JSON",
        'Batch reads only: per stream `{"<path>": <instant>}`, as `endingTimestamp` for the streams '
        "named; the others end as `endingOffsets` says.",
        '{"events": "2024-01-31T13:00:00+01:00"}',
        '{"events": null}',
        "(none)",
    ),
    OptionDoc(
        "maxMessagesPerTrigger",
        SOURCE,
        "integer",
        "At most this many messages per micro-batch, shared across streams in proportion to their lag.",
        "100000",
        "1e5",
        lambda o: _code(o.max_messages_per_trigger),
        details="Needs Spark >= 4.2 (admission control for Python sources); refused at start on Spark "
        "4.0/4.1.",
    ),
    OptionDoc(
        "maxBytesPerTrigger",
        SOURCE,
        BYTE_SIZE,
        "About this many payload bytes per micro-batch; soft: a larger single message is read whole.",
        "64m",
        "64 megabytes",
        lambda o: _code(o.max_bytes_per_trigger),
        details="Needs Spark >= 4.2, like `maxMessagesPerTrigger`.",
    ),
    OptionDoc(
        "minMessagesPerTrigger",
        SOURCE,
        "integer",
        "A trigger plans a batch only once at least this many messages wait (across all streams), or "
        "`maxTriggerDelay` has passed since the last batch; otherwise it skips the batch.",
        "10000",
        "ten thousand",
        lambda o: _code(o.min_messages_per_trigger),
        details="As Kafka's `minOffsetsPerTrigger`. `maxMessagesPerTrigger`/`maxBytesPerTrigger` still "
        "cap a batch the minimum let through (a minimum above the maximum is refused). "
        "`Trigger.AvailableNow` ignores the minimum: its run must end, so it reads what is there. The "
        "first batch of a new query is not held back. Needs Spark >= 4.2 (refused at start on Spark "
        "4.0/4.1) and the server's limit lookups (durastream-server).",
    ),
    OptionDoc(
        "minBytesPerTrigger",
        SOURCE,
        "byte size",
        "... or at least this many payload bytes wait; with both minimums, either one lets the batch "
        "through.",
        "16m",
        "-16m",
        lambda o: _code(o.min_bytes_per_trigger),
        details="Same rules as `minMessagesPerTrigger` (Spark >= 4.2, ignored by "
        "`Trigger.AvailableNow`).",
    ),
    OptionDoc(
        "maxTriggerDelay",
        SOURCE,
        "duration",
        "With a minimum: the longest a trigger waits after the last batch before it plans a batch "
        "with whatever is there.",
        "5m",
        "5 minutes",
        lambda o: _ms(o.max_trigger_delay_ms / 1000),
        details="As Kafka's option of that name (default 15 minutes). Measured from when the last batch "
        "was planned, which is recorded in the checkpoint's offsets (key `/batchTimeMs`), so a restarted "
        "query waits only what is left of the delay. A checkpoint written without that time (before "
        "this option was set) measures from the restart. Only together with `minMessagesPerTrigger` or "
        "`minBytesPerTrigger`.",
        together=(("minMessagesPerTrigger", "100"),),
    ),
    OptionDoc(
        "failOnDataLoss",
        SOURCE,
        "boolean",
        "Whether data that is gone (a deleted or re-created stream, 410 Gone, a stream shorter than the "
        "checkpoint) fails the query.",
        "false",
        "maybe",
        lambda o: _code(o.fail_on_data_loss),
        details="`true`: the query fails with a `DataLossError` naming the stream and offsets. "
        "`false`: the same text is logged as a warning, the lost range is skipped and the query goes "
        "on. See docs/guarantees.md.",
    ),
    OptionDoc(
        "minPartitions",
        SOURCE,
        "integer",
        "At least this many tasks per batch: large ranges are split further, at message boundaries.",
        "8",
        "0",
        lambda o: _code(o.min_partitions),
        details="Set it to the executor core count to let one stream use every core. Needs the "
        "server's limit lookups (durastream-server).",
    ),
    OptionDoc(
        "maxBytesPerPartition",
        SOURCE,
        BYTE_SIZE,
        "A stream's range in one batch is split into tasks of at most about this many bytes.",
        "256m",
        "100",
        lambda o: _bytes(o.max_bytes_per_partition),
        details="Every Python task costs Spark a fixed 50-100 ms, so tasks should be large: the default "
        "is twice Spark's file-source default (`spark.sql.files.maxPartitionBytes`, 128 MiB). "
        "`minPartitions` still spreads a smaller backlog over every core.",
    ),
    OptionDoc(
        "maxMessagesPerPartition",
        SOURCE,
        "integer",
        "... and into tasks of at most this many messages.",
        "500000",
        "0",
        lambda o: _code(o.max_messages_per_partition),
        details="Counting messages takes the server's limit lookups: with this option every range of "
        "a batch is measured while planning (one request per 10,000 ranges on durastream-server); "
        "without it, durastream-server's ranges are sized by their offsets (`byte-positions`) and only "
        "a range larger than `maxBytesPerPartition` is looked up.",
    ),
    OptionDoc(
        "fallback.pinPrefix",
        SOURCE,
        "stream path",
        "Servers without bounded reads only: where batch ranges are pinned as closed forks.",
        "_pins",
        "a/../b",
        lambda o: _code(o.pin_prefix),
        details='See docs/source.md, "Replay-determinism". The query needs permission to create and '
        "delete streams under it.",
    ),
    OptionDoc(
        "fallback.pinTtl",
        SOURCE,
        "duration",
        "... and how long an unused pin lives on the server (whole seconds, 1 m to 365 days).",
        "6h",
        "30s",
        lambda o: _ms(o.pin_ttl_seconds),
    ),
    # ---- sink ---------------------------------------------------------------------------------------------
    OptionDoc(
        "stream",
        SINK,
        "stream path",
        "The target stream of every row, relative to `url`.",
        "events/clicks",
        "events/../secrets",
        lambda o: "(none: required unless the DataFrame has a `stream` column)",
        details="It overrides a `stream` column, as Kafka's `topic` option overrides a `topic` column: "
        "a DataFrame read with the durastream source (whose `stream` column says where each row was "
        "read from) is written to this stream, never back to its sources. Without the option, a "
        "STRING `stream` column names each row's target (a null is an error), except the source's own "
        "`stream` column, which is refused (it would write every row back where it came from; derive "
        "a new column from it to route by it). Leading and trailing `/` and whitespace are not part of "
        "a path, in the option and the column alike: `s`, `/s`, `s/` and ` s ` are one stream, and "
        "its rows keep their order. A column named `stream` is never written as payload. "
        "`save(path)`/`start(path)` is refused: use this option.",
    ),
    OptionDoc(
        "contentType",
        SINK,
        "media type",
        "Content type of the streams the sink creates.",
        "application/octet-stream",
        "json",
        lambda o: _code(o.content_type),
        details="Writing to an existing stream of another type fails before any data is sent, naming "
        "both types.",
    ),
    OptionDoc(
        "createStreams",
        SINK,
        "boolean",
        "Create missing target streams; `false` fails instead.",
        "false",
        "yes",
        lambda o: _code(o.create_streams),
    ),
    OptionDoc(
        "exactlyOnce",
        SINK,
        "`auto`, `transactional` or `ordered`",
        "How the sink writes exactly once: `transactional` (staged appends committed by the driver), "
        "`ordered` (idempotent producers; any server) or `auto` (transactional where the server "
        "supports it).",
        "ordered",
        "always",
        lambda o: _code(o.exactly_once),
        details="`transactional` against a server without staged appends (version 2: handle lists in "
        "the body, commit keys) fails before any data is sent. A batch is finished in the mode that "
        "started it: a transactional run refuses a batch an ordered run started, and says to restart "
        "with `ordered`. The conditions of each mode are in docs/guarantees.md.",
    ),
    OptionDoc(
        "producerId",
        SINK,
        "string",
        "Prefix of the producer ids: `<prefix>-<query id>-<partition>` (`df.write`: a job id instead "
        "of the query id).",
        "clicks-writer",
        "clicks writer",
        lambda o: _code(o.producer_prefix),
        details="Keep it unchanged across restarts of a query: the producer ids are what deduplicates a "
        "replayed batch.",
    ),
    OptionDoc(
        "maxMessagesPerRequest",
        SINK,
        "integer",
        "Rows per append request at most.",
        "1000",
        "0",
        lambda o: _code(o.max_messages_per_request),
        details="In ordered mode keep it unchanged across restarts (it decides request boundaries).",
    ),
    OptionDoc(
        "maxBytesPerRequest",
        SINK,
        BYTE_SIZE,
        "Request body bytes at most; a larger row goes alone.",
        "2m",
        "100",
        lambda o: (
            f"{_bytes(o.request_bytes(TRANSACTIONAL))} transactional, "
            f"{_bytes(o.request_bytes(ORDERED))} ordered"
        ),
        details="Staged requests default to 4 MiB: each is a staging file on the server and an HTTP "
        "request from the task, and larger ones cost both sides less CPU per row. In ordered mode each "
        "partition's last partial request travels to the driver, so the driver holds up to this much "
        "per partition and target stream; keep it unchanged across restarts.",
    ),
    OptionDoc(
        "maxInFlight",
        SINK,
        "integer",
        "Requests per task in flight or queued while the task keeps encoding.",
        "8",
        "100",
        lambda o: _code(o.max_in_flight),
        details="Transactional mode sends that many at once; ordered mode keeps one in flight per "
        "target stream (a producer's seqs must arrive in order) and queues the rest.",
    ),
    OptionDoc(
        "transactionTtl",
        SINK,
        "duration",
        "Transactional mode: how long the server keeps staged data that is neither committed nor "
        "aborted; a batch must commit within it (whole seconds, 1 s to 7 days).",
        "6h",
        "200h",
        lambda o: _ms(o.transaction_ttl_s),
    ),
    OptionDoc(
        "checkpointLocation",
        SINK,
        "Spark's",
        "Spark's own streaming option, accepted and left to Spark.",
        "/checkpoints/clicks",
        None,
        "(Spark's)",
        details="Exactly-once needs it: the query id, part of every producer id, lives in the "
        "checkpoint.",
    ),
    OptionDoc(
        "queryName",
        SINK,
        "Spark's",
        "Spark's own streaming option, accepted and left to Spark.",
        "clicks",
        None,
        "(Spark's)",
    ),
)

_PARSERS: dict[str, Callable[[Mapping[str, str]], Any]] = {
    SOURCE: SourceOptions.parse,
    SINK: SinkOptions.parse,
}


# ---- what the parsers accept ------------------------------------------------------------------------------


def accepted_keys(scope: str) -> list[str]:
    """Every option key the ``scope`` parser accepts, as its unknown-key error lists them."""
    try:
        _PARSERS[scope]({**BASE[scope], _PROBE_KEY: "1"})
    except OptionError as exc:
        return [key.strip() for key in exc.accepted.split(",")]
    raise AssertionError(f"the {scope} parser accepted the unknown option {_PROBE_KEY!r}")


def key_scopes() -> dict[str, str]:
    """key -> ``connection`` (accepted by both parsers), ``source`` or ``sink``, in the parsers' order."""
    source, sink = accepted_keys(SOURCE), accepted_keys(SINK)
    scopes = {}
    for key in source + sink:
        scopes[key] = (
            CONNECTION if key in source and key in sink else SOURCE if key in source else SINK
        )
    return scopes


def documented() -> list[OptionDoc]:
    """``OPTIONS`` checked against the parsers: every accepted key has an entry, in its right scope."""
    entries = {doc.key: doc for doc in OPTIONS}
    scopes = key_scopes()
    missing = [key for key in scopes if key not in entries]
    if missing:
        raise UndocumentedOption(
            f"the option parsers accept {', '.join(missing)} but durastream_spark/docs.py has no "
            "OptionDoc for them: add one to OPTIONS, then run `python -m durastream_spark.docs "
            "--output docs/options.md`"
        )
    stale = [key for key in entries if key not in scopes]
    if stale:
        raise UndocumentedOption(f"OPTIONS documents {stale}, which no parser accepts any more")
    wrong = [(d.key, d.scope, scopes[d.key]) for d in OPTIONS if d.scope != scopes[d.key]]
    if wrong:
        raise UndocumentedOption(f"OptionDoc scope differs from what the parsers accept: {wrong}")
    return list(OPTIONS)


@contextmanager
def _existing_file() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="durastream-docs-") as tmp:
        path = os.path.join(tmp, "file")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("token\n")
        yield path


def _parse(scope: str, extra: Mapping[str, str]) -> Any:
    parser_scope = SOURCE if scope == CONNECTION else scope
    return _PARSERS[parser_scope]({**BASE[parser_scope], **extra})


def default_text(doc: OptionDoc) -> str:
    if isinstance(doc.default, str):
        return doc.default
    return doc.default(_parse(doc.scope, {}))


def check_example(doc: OptionDoc) -> None:
    """The example must parse; raises ``OptionError`` otherwise."""
    key = doc.example_key or doc.key
    if doc.file_example:
        with _existing_file() as path:
            _parse(doc.scope, {key: path})
        return
    extra = {**dict(doc.together), key: doc.example}
    if doc.key == "startingOffsets":
        extra["streams"] = "events/a"
    if doc.key == "pattern":
        extra = {"pattern": doc.example}
        return _PARSERS[SOURCE]({"url": URL_EXAMPLE, **extra})
    _parse(doc.scope, extra)


def bad_value_error(doc: OptionDoc) -> OptionError | None:
    """The parser's error for the entry's bad value (``None`` when the entry has no bad value)."""
    if doc.bad is None:
        return None
    key = doc.bad_key or doc.key
    extra = {**dict(doc.together), key: doc.bad}
    if doc.key == "pattern":
        return _error(lambda: _PARSERS[SOURCE]({"url": URL_EXAMPLE, "pattern": doc.bad}), doc)
    return _error(lambda: _parse(doc.scope, extra), doc)


def _error(call: Callable[[], Any], doc: OptionDoc) -> OptionError:
    try:
        call()
    except OptionError as exc:
        return exc
    raise AssertionError(f"{doc.key}={doc.bad!r} was accepted; OptionDoc.bad must be refused")


def general_errors() -> list[tuple[str, str, str]]:
    """(what, the call, error) for the errors that are not about one option's value."""
    url = {"url": URL_EXAMPLE}
    cases = [
        ("A misspelt option", SOURCE, {**BASE[SOURCE], "maxMessagePerTrigger": "1000"}),
        (
            "An option of Spark's Kafka connector",
            SOURCE,
            {"url": URL_EXAMPLE, "subscribe": "events"},
        ),
        ("A Kafka client setting", SINK, {**url, "kafka.bootstrap.servers": "broker:9092"}),
        ("A required option missing", SINK, {"stream": "events"}),
        ("A path given to `save(path)`/`start(path)`", SINK, {**url, "path": "events"}),
    ]
    calls = {
        SOURCE: 'spark.readStream.format("durastream")',
        SINK: 'df.writeStream.format("durastream")',
    }
    found = []
    for what, scope, options in cases:
        shown = "".join(f'.option("{k}", "{v}")' for k, v in options.items())
        try:
            _PARSERS[scope](options)
        except OptionError as exc:
            found.append((what, f"{calls[scope]}{shown}", f"{type(exc).__name__}: {exc}"))
        else:  # pragma: no cover - a parser change that stops refusing these breaks the doc
            raise AssertionError(f"{options} was accepted")
    return found


# ---- rendering ----------------------------------------------------------------------------------------------


def _anchor(key: str) -> str:
    return "".join(ch for ch in key.lower() if ch.isalnum() or ch in "-_")


def render() -> str:
    docs = documented()
    out: list[str] = [
        "# Options",
        "",
        "<!-- Generated by `python -m durastream_spark.docs --output docs/options.md` from the option",
        "     parsers (durastream_spark/options.py, source/options.py, sink/options.py) and the",
        "     descriptions in durastream_spark/docs.py. Do not edit by hand:",
        "     tests/docs/test_options_doc.py fails when this file and the code disagree. -->",
        "",
        "Every option of the `durastream` source and sink. Option names are case-insensitive, values are",
        'strings (`.option("maxInFlight", 8)` is passed as `"8"`).',
        "",
        "**When a bad value is caught.** Options are parsed once, on the driver, into frozen dataclasses",
        "(`SourceOptions`, `SinkOptions`, `ConnectionOptions`), before any task starts. A source without",
        "`.schema(...)` parses them in `load()`; with a user schema, when the read is planned (the first",
        "action of a batch read; `start()` of a streaming query, whose error then fails the query). The",
        "sink parses them in `start()`/`save()`. A bad or unknown option raises",
        "`durastream_spark.errors.OptionError` (a `ValueError`), which names the option, the value (or",
        "`<redacted>` for secrets) and what is accepted; attributes `option`, `value`, `accepted`,",
        "`reason`. Checks that need the server (extensions for `pattern` and the per-trigger limits, an",
        "offset the stream does not have) run when the first batch is planned. The error texts below are",
        "produced by the parsers for the value shown.",
        "",
        "**Durations** take a whole number of milliseconds (`1500`) or a number with a unit: `250ms`,",
        "`1.5s`, `30s`, `5m`, `1h`.",
        "",
        f"**Byte sizes** ({', '.join(f'`{d.key}`' for d in docs if d.type == BYTE_SIZE)}) take {SIZE_SYNTAX}.",
        "`kb`/`kib`, `mb`/`mib`, ... mean the same binary units, as `128mb` does in Spark's own size settings.",
        "durastream-server's size flags (`--max-body-bytes`, `--chunk-bytes`, ...) take the same values.",
        "",
    ]
    for scope in SCOPES:
        rows = [d for d in docs if d.scope == scope]
        out += [f"## {SCOPE_TITLES[scope]}", ""]
        out += [
            "| option | type | default | example | meaning |",
            "| --- | --- | --- | --- | --- |",
        ]
        for doc in rows:
            example = doc.example.replace("|", "\\|")
            out.append(
                f"| [`{doc.key}`](#{_anchor(doc.key)}) | {doc.type} | {default_text(doc)} | "
                f"`{example}` | {doc.summary} |"
            )
        out.append("")
        for doc in rows:
            check_example(doc)
            out += [f"### `{doc.key}`", ""]
            out.append(doc.summary + (" " + doc.details if doc.details else ""))
            out.append("")
            error = bad_value_error(doc)
            out.append(f"- type: {doc.type}; default: {default_text(doc)}")
            if error is not None:
                out.append(f"- accepted: {error.accepted}")
            out.append(f'- example: `.option("{doc.example_key or doc.key}", {_py(doc.example)})`')
            if error is not None:
                out.append(
                    f'- bad value: `.option("{doc.bad_key or doc.key}", {_py(doc.bad or "")})` fails with'
                )
                out += ["", "  ```text", f"  {type(error).__name__}: {error}", "  ```"]
            out.append("")
    out += ["## Errors that are not about one value", ""]
    for what, call, error in general_errors():
        out += [f"- {what}: `{call}` fails with", "", "  ```text", f"  {error}", "  ```", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _py(value: str) -> str:
    """A Python string literal of ``value`` for the examples (single quotes when it holds double ones)."""
    return f"'{value}'" if '"' in value else f'"{value}"'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durastream_spark.docs", description="Generate docs/options.md."
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--output", type=Path, help="write the document to this file")
    group.add_argument("--check", type=Path, help="exit 1 if this file differs from the output")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.check.read_text(encoding="utf-8") if args.check.exists() else ""
        if current != text:
            sys.stderr.write(
                f"{args.check} is out of date: run `python -m durastream_spark.docs --output "
                f"{args.check}`\n"
            )
            return 1
        return 0
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
