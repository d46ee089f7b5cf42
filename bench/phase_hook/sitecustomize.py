"""Bench-only (``sink_fanout_bench.py --phases``): every Python process started with this directory on
``PYTHONPATH`` (the bench's child, Spark's Python workers) appends the connector's DEBUG phase stamps
(logger ``durastream_spark.phases``: a task's start, its input fed, its end; the commit's start, each
bulk request built, answered and parsed, the commit's end) to the file named by
``DURASTREAM_PHASE_LOG``, one line each: ``<time.time()> <pid> <message>``."""

import logging
import os

_path = os.environ.get("DURASTREAM_PHASE_LOG")
if _path:
    _handler = logging.FileHandler(_path, mode="a")
    _handler.setFormatter(logging.Formatter("%(created).6f %(process)d %(message)s"))
    _logger = logging.getLogger("durastream_spark.phases")
    _logger.setLevel(logging.DEBUG)
    _logger.addHandler(_handler)
    _logger.propagate = False
