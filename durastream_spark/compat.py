"""What the running PySpark offers, detected once at import time.

Spark 4.0/4.1 lack admission control for Python sources (``latestOffset(start, limit)``,
``getDefaultReadLimit``, ``SupportsTriggerAvailableNow`` and ``ReadMinRows``, added in 4.2); ``DataSourceStreamArrowWriter``
arrived in 4.1. Code branches on these flags, never on version strings scattered around, and so do the
tests' skip markers: ``make test-compat`` runs the connector's tests on pyspark 4.0 with the oldest
supported pyarrow and requests (``constraints/minimum.txt``).
"""

from __future__ import annotations

import pyspark
import pyspark.sql.datasource as _datasource


def _version_tuple(text: str) -> tuple[int, int]:
    major, minor = (text.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


SPARK_VERSION: tuple[int, int] = _version_tuple(pyspark.__version__)

try:  # Spark >= 4.2
    from pyspark.sql.streaming.datasource import (  # noqa: F401 (re-exported)
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,  # carries minMessagesPerTrigger; the source applies maxTriggerDelay itself
        SupportsTriggerAvailableNow,
    )

    HAS_ADMISSION_CONTROL = True
except ImportError:  # Spark 4.0 / 4.1
    HAS_ADMISSION_CONTROL = False

HAS_STREAM_ARROW_WRITER: bool = hasattr(_datasource, "DataSourceStreamArrowWriter")
