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

# ``sink_handover.py``: also stamp each Python worker's fork from Spark's daemon and every pickle of
# 1 KB or more that PySpark's serializer makes or reads (the task's commit message out, the commit
# worker's writer and messages in), with its size and time: the hand-over from the tasks to commit().
if _path and os.environ.get("DURASTREAM_PHASE_PICKLES"):
    import time as _time

    os.register_at_fork(after_in_child=lambda: _logger.debug("worker forked"))
    _logger.debug("process started")

    from pyspark import serializers as _serializers

    _dumps, _loads = _serializers.CPickleSerializer.dumps, _serializers.CPickleSerializer.loads

    def _timed_dumps(self, obj):  # type: ignore[no-untyped-def]
        began = _time.perf_counter()
        data = _dumps(self, obj)
        if len(data) >= 1024:
            _logger.debug("pickle dumps %d %.6f", len(data), _time.perf_counter() - began)
        return data

    def _timed_loads(self, obj, encoding="bytes"):  # type: ignore[no-untyped-def]
        began = _time.perf_counter()
        value = _loads(self, obj, encoding)
        if len(obj) >= 1024:
            _logger.debug("pickle loads %d %.6f", len(obj), _time.perf_counter() - began)
        return value

    _serializers.CPickleSerializer.dumps = _timed_dumps
    _serializers.CPickleSerializer.loads = _timed_loads
