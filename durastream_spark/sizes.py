"""Byte sizes as people write them: one grammar for every size the project accepts.

The connector's options (``maxBytesPerTrigger``, ``maxBytesPerPartition``, ``maxBytesPerRequest``, ...) and
durastream-server's flags (``--max-body-bytes``, ``--chunk-bytes``, ...) all parse sizes here, so a value
that works in one place works in every other: ``1048576``, ``512k``, ``64m``, ``1g``.

Units are binary, as in Spark's own size settings (``spark.sql.files.maxPartitionBytes=128m``): ``k`` is
1024 bytes, ``m`` 1024 k, ``g`` 1024 m, ``t`` 1024 g. ``kb``/``kib``, ``mb``/``mib``, ... mean the same (as
``128mb`` does in Spark); case does not matter; a space may separate the number from its unit; ``b`` or no
unit means bytes. Only whole numbers: Spark refuses ``1.5g`` as well, and a size that is not a whole number
of bytes would have to be rounded somewhere.

The two distributions do not depend on each other (the server needs no Spark, executors need no server), so
this module exists twice, byte for byte: ``durastream_spark/sizes.py`` and
``server/durastream_server/sizes.py``. ``tests/docs/test_sizes.py`` fails when the copies differ. It imports
nothing but the standard library.
"""

from __future__ import annotations

import re

UNITS: dict[str, int] = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
SYNTAX = "a number of bytes, or a whole number with a binary unit: 512k, 64m, 1g (1k = 1024 bytes)"

_SIZE = re.compile(r"^(\d+)\s*(?:(b)|([kmgt])(?:i?b)?)?$", re.IGNORECASE)


def parse_byte_size(text: str) -> int:
    """The number of bytes ``text`` names. Raises ``ValueError`` saying what is accepted."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"expected {SYNTAX}, got {text!r}")
    unit = (match.group(3) or "b").lower()
    return int(match.group(1)) * UNITS[unit]


def format_byte_size(size: int) -> str:
    """The shortest spelling that parses back to exactly ``size``: ``67108864`` is ``64m``."""
    for unit in ("t", "g", "m", "k"):
        scale = UNITS[unit]
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)
