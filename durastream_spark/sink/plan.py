"""The write plan: everything decided once on the driver, before any task runs, and pickled into tasks.

``plan_write`` parses the options, checks the DataFrame's schema and the save mode, decides where rows go
(``routing.py``: the ``stream`` option, else the ``stream`` column), asks the server which extensions it
has (to resolve ``exactlyOnce=auto``), and, for the ``stream`` option, checks the target (content type,
closed) or creates it. Any problem fails ``start()``/``save()`` with an error naming the
option or column, before a single row is sent.

Spark calls ``streamWriter()`` again for every micro-batch and for every commit, so planning is cheap: two
small requests (extension discovery and a ``HEAD``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import StructType

from durastream_spark.errors import ExtensionNotSupported
from durastream_spark.protocol import extensions as ext
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.models import is_json_content_type
from durastream_spark.sink.encoding import PayloadLayout
from durastream_spark.sink.errors import UnsupportedWrite
from durastream_spark.sink.identity import new_job_id
from durastream_spark.sink.options import (
    AUTO,
    EXACTLY_ONCE,
    ORDERED,
    TRANSACTIONAL,
    SinkOptions,
)
from durastream_spark.sink.routing import Routing
from durastream_spark.sink.targets import TargetStreams

log = logging.getLogger(__name__)

STREAMING = "streaming"
BATCH = "batch"

_warned_no_digest: set[str] = set()


@dataclass(frozen=True)
class SinkPlan:
    """Options, resolved mode, payload layout, routing and, for ``df.write``, the job's writer key."""

    options: SinkOptions
    client: StreamClient  # pickles with the server's extensions, so tasks do not rediscover them
    mode: str  # TRANSACTIONAL or ORDERED
    layout: PayloadLayout
    routing: Routing
    kind: str  # STREAMING or BATCH
    job_id: str | None = None


def plan_write(
    options: Mapping[str, str], schema: StructType, overwrite: bool, *, kind: str
) -> SinkPlan:
    sink_options = SinkOptions.parse(options)
    if kind == BATCH:
        sink_options.figures.refuse_outside_streaming("df.write")
    if overwrite:
        raise UnsupportedWrite(
            "The durastream sink only appends (streams are append-only): use mode('append') for df.write "
            "and the append or update output mode for writeStream."
        )
    layout = PayloadLayout.from_schema(
        schema, json_stream=is_json_content_type(sink_options.content_type)
    )
    routing = Routing.decide(sink_options, layout, schema)
    client = StreamClient(sink_options.connection)
    mode = resolve_mode(client, sink_options)
    if routing.fixed is not None:
        TargetStreams(client, sink_options).ensure(routing.fixed)
    return SinkPlan(
        options=sink_options,
        client=client,
        mode=mode,
        layout=layout,
        routing=routing,
        kind=kind,
        job_id=new_job_id() if kind == BATCH else None,
    )


def resolve_mode(client: StreamClient, options: SinkOptions) -> str:
    """``auto``: transactional where the server stages appends with commit keys, else ordered.

    Transactional mode needs staged-append version 2: handle lists in the body (no size cliff) and
    commit keys, by which a replayed batch tells its own earlier commit from an ordered run's requests
    (``batch_mode.py``). The mode may differ between runs of one batch; ``batch_mode.py`` keeps that safe.
    """
    extensions = client.extensions()
    staged = extensions.supports(ext.STAGED_APPEND, ext.STAGED_APPEND_LISTS_AND_KEYS)
    if options.exactly_once == TRANSACTIONAL and not staged:
        raise ExtensionNotSupported(
            ext.STAGED_APPEND,
            options.connection.url,
            f"write with {EXACTLY_ONCE}=transactional (use {EXACTLY_ONCE}=ordered or auto with this "
            "server)",
            version=ext.STAGED_APPEND_LISTS_AND_KEYS,
        )
    mode = options.exactly_once
    if mode == AUTO:
        mode = TRANSACTIONAL if staged else ORDERED
    if (
        mode == ORDERED
        and not extensions.supports(ext.PAYLOAD_DIGEST, 2)
        and options.connection.url not in _warned_no_digest
    ):
        _warned_no_digest.add(options.connection.url)
        log.warning(
            "%s: the durastream sink writes in ordered mode, which is exactly-once only if a retried task "
            "sees its rows in the same order (see docs/guarantees.md); %s",
            options.connection.url,
            "this server checks only the last 64 requests of each producer (payload-digest=1): a "
            "reordered retry that differs only in older requests is not detected. Upgrade "
            "durastream-server."
            if extensions.supports(ext.PAYLOAD_DIGEST)
            else "this server has no payload digests: a reordered retry cannot be detected.",
        )
    return mode
