"""Column conventions the source and the sink share.

``SOURCE_STREAM_MARK`` is the field metadata of the ``stream`` column of the source's default schema (the
stream each row was read from). Spark keeps a field's metadata through selects, filters and aliases of the
column itself, and drops it from any expression computed from it. The sink reads it to tell the source's
own column from a routing column the user built: writing a DataFrame read from durastream back by its
``stream`` column would put every row into the stream it came from (issue 15), so the sink refuses to route
by a marked column (``sink/routing.py``).
"""

from __future__ import annotations

from typing import Final

SOURCE_STREAM_KEY: Final = "durastream.column"
SOURCE_STREAM_MARK: Final = {SOURCE_STREAM_KEY: "source.stream"}


def is_source_stream(metadata: dict | None) -> bool:
    """Whether a field's metadata marks it as the durastream source's ``stream`` column."""
    return (
        bool(metadata) and metadata.get(SOURCE_STREAM_KEY) == SOURCE_STREAM_MARK[SOURCE_STREAM_KEY]
    )
