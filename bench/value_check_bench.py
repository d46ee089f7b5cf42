"""What the sink's one-JSON-text check of a ``value`` column costs, in CPU, next to the task's other work.

Issue 15: each JSON ``value`` must be exactly one JSON text, checked per input batch before any of its rows
go into a request (``durastream_spark/sink/json_values.py``). This measures it in-process on the rows of
``bench/sink_bench.py`` (``{"id": <long>, "payload": "<1000 chars>"}``, about 1 KiB) as a ready-made
``value`` column, in Arrow batches of ``--batch`` rows (Spark hands the writer 10,000 by default):

- ``check``: ``json_values.check_arrow`` of the encoded payloads;
- ``encode + batch``: what a task does with the same batch besides sending it (``ArrowPayloadEncoder``,
  ``EncodedRows``, ``RequestBatcher`` into 4 MiB requests).

CPU time of this process (``time.process_time``), best of ``--rounds`` (a loaded machine only adds to it),
reported per MiB and per row. The end-to-end cost is the check's CPU against the whole batch's CPU: the
server, Spark's JVM and the Python workers (about 1.8-2.1 CPU seconds per 300 MB batch in
docs/benchmarks.md, Sink).

Run: ``python bench/value_check_bench.py [--rows 300000] [--batch 10000] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import json
import time

import pyarrow as pa
from pyspark.sql.types import StringType, StructField, StructType

from durastream_spark.sink import json_values
from durastream_spark.sink.batcher import RequestBatcher
from durastream_spark.sink.encoding import ArrowPayloadEncoder, EncodedRows, PayloadLayout

MIB = 1024 * 1024
PAYLOAD = "p" * 1000


def _batches(rows: int, size: int) -> list[pa.RecordBatch]:
    values = [json.dumps({"id": i, "payload": PAYLOAD}, separators=(",", ":")) for i in range(rows)]
    schema = pa.schema([("value", pa.string())])
    return [
        pa.RecordBatch.from_arrays([pa.array(values[i : i + size])], schema=schema)
        for i in range(0, rows, size)
    ]


def _cpu(work) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    batches = _batches(args.rows, args.batch)
    layout = PayloadLayout.from_schema(
        StructType([StructField("value", StringType())]), json_stream=True
    )
    encoder = ArrowPayloadEncoder(layout)
    encoded = [encoder.encode(batch) for batch in batches]
    size_mib = sum(p.buffers()[2].size for p in encoded) / MIB

    def encode_and_batch() -> None:
        batcher = RequestBatcher(10_000, 4 * MIB, json_framing=True)
        for batch in batches:
            batcher.add(EncodedRows.from_arrow(encoder.encode(batch), 1))
        batcher.remainder()

    def check() -> None:
        for payloads in encoded:
            assert json_values.check_arrow(payloads) is None

    costs = {"encode + batch": [], "check": []}
    for _ in range(args.rounds):
        costs["encode + batch"].append(_cpu(encode_and_batch))
        costs["check"].append(_cpu(check))
    print(
        f"{args.rows} rows, {size_mib:.0f} MiB, batches of {args.batch}; CPU, best of {args.rounds}:"
    )
    for name, seconds in costs.items():
        best = min(seconds)
        print(
            f"  {name:<15} {best * 1000:7.1f} ms  {best / size_mib * 1000:6.3f} ms/MiB  "
            f"{best / args.rows * 1e9:6.0f} ns/row"
        )


if __name__ == "__main__":
    main()
