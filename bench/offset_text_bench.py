"""The per-batch cost of a source offset's text over many streams (issue 16).

Spark handles a Python source's offsets as JSON text: every micro-batch the source writes its end offset
(and, on Spark >= 4.2, the latest offset it reports) as text, and over 100,000 streams that text is the
compact form of ``source/offset_codec.py``. This times what one batch costs the driver: the end made from
the start with ``--moved`` streams replaced, given a batch time, written as Spark's dict, and read back as
Spark hands it back for the next batch, repeated for ``--batches`` batches (median). ``--src DIR`` puts
another checkout first on the path (e.g. ``git worktree add /tmp/base <commit>``) for the figure before a
change; run it once per checkout, one after the other.

Run: ``python bench/offset_text_bench.py [--streams 100000] [--moved 1000] [--src DIR]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--moved", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=11)
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    sys.path.insert(0, args.src)
    from durastream_spark.source.offsets import SourceOffset

    def token(position: int) -> str:
        return f"{0:016d}_{position:016d}"

    start = SourceOffset.of({f"sessions/s{i:07d}": token(i * 37) for i in range(args.streams)})
    start.to_dict()  # the first batch of a run encodes every stream, whatever the code
    seconds = []
    for batch in range(args.batches):
        moved = {
            f"sessions/s{(batch * args.moved + j * 97) % args.streams:07d}": token(10**9 + j)
            for j in range(args.moved)
        }
        began = time.perf_counter()
        end = start.updated(moved).with_batch_ms(1_700_000_000_000 + batch)
        start = SourceOffset.from_dict(end.to_dict())
        seconds.append(time.perf_counter() - began)
    print(
        f"{args.src}: {args.streams} streams, {args.moved} moved per batch: "
        f"{statistics.median(seconds) * 1000:.1f} ms per batch (median of {args.batches}), "
        f"load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
