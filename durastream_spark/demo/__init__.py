"""``python -m durastream_spark.demo``: one exactly-once pipeline, end to end, in a minute or two.

1. Starts the bundled ``durastream-server`` (distribution ``durastream-server``) on a free port with its
   data in a temporary directory, or uses the server given with ``--url``.
2. A streaming query turns Spark's ``rate`` source into events ``{"id", "key", "ts"}`` (ids 0..rows-1) and
   writes them with the exactly-once sink (``writeStream.format("durastream")``).
3. While it writes, a live query reads the stream back with the source and counts events per key (memory
   sink), and a ``Trigger.AvailableNow`` query ingests what is there into parquet; after the writer has
   finished, the AvailableNow query runs again on its checkpoint and picks up only the rest.
4. A summary proves exactly once: events produced = events read, no id twice, none missing. The exit code
   is 0 only if that holds.

A query that fails is restarted from its checkpoint (a few times at most) and the proof must still hold:
that is the point of exactly once. The summary says how many restarts there were.

Progress (rows written and read, batches, lag from ``progress.sources[].latestOffset``) is redrawn in
place on a terminal; ``--no-live`` or a non-terminal stdout prints a line every few seconds instead.
The pipeline itself is in ``pipeline.py``, the display in ``display.py``, the bundled server in
``server.py``.
"""

from durastream_spark.demo.cli import main

__all__ = ["main"]
