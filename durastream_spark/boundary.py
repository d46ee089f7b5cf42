"""Where the connector's errors meet Spark: the user reads our sentence first, not a Python traceback.

Spark reports an exception from a Python data source as ``[PYTHON_DATA_SOURCE_ERROR] Failed to ...: <text>``
(or, from a task, ``PythonException: <text>``), where ``<text>`` is the Python traceback: every frame first,
any ``__cause__``/``__context__`` chain with its own frames, and the exception's message last. The message is
what says what is wrong and what to do, so for the connector's own errors (``DurastreamError``: a bad option,
an unreachable server, a message that does not fit the schema, ...) the entry points Spark calls
(``spark_entry_points``):

- log the full traceback and chain at DEBUG (logger ``durastream_spark.boundary``), for whoever debugs;
- drop the chain (``raise error from None``): a ``ConnectionRefusedError -> urllib3 -> requests`` chain
  adds thousands of characters and nothing the message does not say;
- in a Spark Python worker, set ``SPARK_HIDE_TRACEBACK`` before the error leaves: Spark then reports only
  ``<ExceptionType>: <message>``, as it does for every Python error when
  ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` is true. The worker exits after reporting an
  error, so the setting dies with it.

Anything else (a bug) keeps its traceback: that is what a bug report needs.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from durastream_spark.errors import DurastreamError

log = logging.getLogger(__name__)

# The methods of Spark's Python data source API (DataSource, readers, stream readers, writers).
SPARK_METHODS = frozenset(
    {
        "schema",
        "reader",
        "streamReader",
        "writer",
        "streamWriter",
        "partitions",
        "read",
        "initialOffset",
        "latestOffset",
        "reportLatestOffset",
        "getDefaultReadLimit",
        "prepareForTriggerAvailableNow",
        "write",
        "commit",
        "abort",
    }
)
HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"

C = TypeVar("C", bound=type)


def spark_entry_points(cls: C) -> C:
    """Wrap the Spark API methods ``cls`` defines itself (inherited ones were wrapped where defined)."""
    for name in SPARK_METHODS:
        method = cls.__dict__.get(name)
        if inspect.isfunction(method) and not getattr(method, "_durastream_boundary", False):
            setattr(cls, name, _guarded(method))
    return cls


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            result = method(*args, **kwargs)
        except DurastreamError as error:
            raise surfaced(error, method.__qualname__) from None
        if inspect.isgenerator(result) or (
            method.__name__ == "read" and isinstance(result, Iterator)
        ):
            return _guarded_iteration(result, method.__qualname__)
        return result

    guarded._durastream_boundary = True  # type: ignore[attr-defined]
    return guarded


def _guarded_iteration(items: Iterator[Any], where: str) -> Iterator[Any]:
    """``read`` returns an iterator: its errors happen while Spark iterates, after the call returned."""
    try:
        yield from items
    except DurastreamError as error:
        raise surfaced(error, where) from None


def surfaced(error: DurastreamError, where: str) -> DurastreamError:
    """``error``, ready to leave for Spark: chain logged at DEBUG, traceback hidden in a Spark worker."""
    log.debug("%s raised %s", where, type(error).__name__, exc_info=error)
    if in_spark_worker():
        os.environ[HIDE_TRACEBACK] = "1"
    return error.with_traceback(None)


def in_spark_worker() -> bool:
    """Whether this process is one of Spark's Python workers (``python -m pyspark.daemon``/``worker``/...),
    not a driver, a notebook or a test calling the classes directly."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and str(spec.name).startswith("pyspark.")
