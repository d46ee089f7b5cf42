"""The single choke point for data loss: every path that finds data gone calls ``DataLossReporter.report``.

Data loss means the source cannot deliver a range it is responsible for: the stream was deleted (404, or
410 while forks still hold it), it was re-created or truncated so that its tail is now before the offset the
checkpoint says was reached, or an offset precedes the data the server still retains (410).

With ``failOnDataLoss=true`` (the default) the query fails with a ``DataLossError`` naming the stream and
the offsets and saying how to recover. With ``false`` the same text is logged as a warning and the caller
skips what is gone, then continues. Keeping the decision in one place (as Spark's Kafka source does with
``reportDataLoss``) means no code path can quietly skip data on its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from durastream_spark.errors import DataLossError

log = logging.getLogger(__name__)

FAIL_HINT = (
    "If this loss is expected (the stream was deleted or re-created on purpose), restart the query with "
    "option failOnDataLoss=false to skip what is gone and continue, or with a new checkpoint location "
    "and explicit startingOffsets."
)
CONTINUE_NOTE = "failOnDataLoss=false: skipping the lost range and continuing."


@dataclass(frozen=True)
class DataLossReporter:
    """Fails or warns according to ``failOnDataLoss``. Frozen and picklable: tasks report through it too."""

    fail_on_data_loss: bool = True

    def report(self, stream: str, start: str | None, end: str | None, reason: str) -> None:
        """Raise ``DataLossError`` (fail mode) or log a warning (continue mode). Returns only in the latter."""
        span = f"from offset {start}" if start is not None else "from an unknown offset"
        span += f" to {end}" if end is not None else " to its former tail"
        message = f"Data loss in stream '{stream}' {span}: {reason}."
        if self.fail_on_data_loss:
            raise DataLossError(f"{message} {FAIL_HINT}", stream=stream, start=start, end=end)
        log.warning("%s %s", message, CONTINUE_NOTE)
