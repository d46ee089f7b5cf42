"""What a checkpoint's pack work costs when many packed streams each take one small append (issue 16).

In process, real files (``--durability fsync``, packed appends on): ``--streams`` packed streams are
created, then each ``--rounds`` round appends one record to every stream and forces a checkpoint. Each
checkpoint's ``PackBook.carry_out`` (thread), ``PackBook.plan`` and ``PackBook.carried_out`` (loop) are timed (CPU of the
calling thread) and ``write_pack`` is counted: the packs it writes, their entries and bytes, against
the round's new records. So it says whether a checkpoint rewrites more than the round's new data, and
what the pack work costs per stream. Run from a tree's root: ``PYTHONPATH=server:. .venv/bin/python
bench/pack_checkpoint_bench.py --dir /tmp/x``; ``--json`` writes the figures for an A/B.

Growth with age (decision 0010, step 2c): at each round of ``--report-at`` it also reports what a
stream costs after that many checkpoints: its extents and the distinct files they name (what a read
of it opens), the pack indexes' bytes, the process RSS, and the CPU of reading every stream whole
(``StreamLog.read``, all threads). ``--no-merge`` turns merging off (``MERGE_BASE_EXTENTS`` out of
reach) for an A/B in the same tree; the figures are the same as main's before merging."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import gc
import json
import os
import pstats
import shutil
import statistics
import sys
import time
from pathlib import Path

from durastream_server.storage import DataDir, committer, extents, packs
from durastream_server.storage.datadir import StorageConfig
from durastream_server.storage.log import AppendEntry
from durastream_server.storage.records import StreamHeader

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.server.storage._util import checkpoint, read_all  # noqa: E402  (the tests' helpers)


class Counter:
    """Wraps ``write_pack``, ``plan``, ``carry_out`` and ``carried_out`` to count and time them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.now: dict[str, float] = {}
        self.profile: cProfile.Profile | None = None
        self.ages: list[dict[str, float]] = []

    def install(self) -> None:
        write_pack = packs.write_pack
        carry_out = packs.PackBook.carry_out
        carried_out = packs.PackBook.carried_out
        plan = packs.PackBook.plan
        counter = self

        def counting_write(directory, generation, entries, *, sync, **kwargs):  # noqa: ANN001, ANN202
            counter.now["packs"] = counter.now.get("packs", 0) + 1
            counter.now["entries"] = counter.now.get("entries", 0) + len(entries)
            size = write_pack(directory, generation, entries, sync=sync, **kwargs)
            counter.now["bytes"] = counter.now.get("bytes", 0) + size
            return size

        def timed(name: str, method):  # noqa: ANN001, ANN202
            """``method`` timed (CPU of the calling thread) into ``counter.now[name]``."""

            def call(self, *args, **kwargs):  # noqa: ANN001, ANN202
                t = time.thread_time()
                if counter.profile is not None:
                    out = counter.profile.runcall(method, self, *args, **kwargs)
                else:
                    out = method(self, *args, **kwargs)
                counter.now[name] = counter.now.get(name, 0) + time.thread_time() - t
                return out

            return call

        packs.write_pack = counting_write
        packs.PackBook.carry_out = timed("carry_out_s", carry_out)
        packs.PackBook.carried_out = timed("carried_out_s", carried_out)
        packs.PackBook.plan = timed("plan_s", plan)

    def take(self) -> dict[str, float]:
        row, self.now = self.now, {}
        self.rows.append(row)
        return row


async def main_async(args: argparse.Namespace, counter: Counter) -> None:
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    dd = await DataDir.open(StorageConfig(root=root, packed_appends=True))
    headers = [
        StreamHeader(path=f"/s{i}", content_type="application/json", created_at_ms=1)
        for i in range(args.streams)
    ]
    logs = await dd.create_streams(headers)
    await checkpoint(dd)
    counter.take()
    for r in range(args.rounds):
        for k in range(args.records):
            await asyncio.gather(
                *(
                    log.stage(
                        AppendEntry(
                            position=log.state.tail,
                            messages=(b'"r%d.%d"' % (r, k),),
                            timestamp_ms=2,
                            closes=False,
                            producer=None,
                            stream_seq=None,
                            digest=b"d" * 24,
                        )
                    )
                    for log in logs
                )
            )
        assert all(log.packed for log in logs), "a stream was promoted"
        await checkpoint(dd)
        row = counter.take()
        print(
            f"round {r}: {row.get('packs', 0)} packs, {row.get('entries', 0)} entries, "
            f"{row.get('bytes', 0)} bytes written; carry_out {row.get('carry_out_s', 0) * 1e3:.1f} ms, "
            f"plan {row.get('plan_s', 0) * 1e3:.1f} ms, "
            f"carried_out {row.get('carried_out_s', 0) * 1e3:.1f} ms ({args.streams * args.records} new records)"
        )
        if r + 1 in args.report_at:
            counter.ages.append(await age_report(root, logs, r + 1, args.streams, args.records))
    await dd.close()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def age_report(
    root: Path, logs: list, rounds: int, streams: int, records: int
) -> dict[str, float]:
    """What each stream costs after ``rounds`` checkpoints (module docstring)."""
    counts = [len(log.extents) for log in logs]
    files = [len(log.extents.files()) for log in logs]
    nbytes = [log.extents.nbytes for log in logs]
    index = sum(p.stat().st_size for p in (root / packs.PACKS_DIR).glob("*.idx"))
    pack_bytes = sum(p.stat().st_size for p in (root / packs.PACKS_DIR).glob("*.pack"))
    gc.collect()
    rss = _rss_bytes()
    # What the allocator keeps of freed memory (a checkpoint's read buffers, in the I/O threads'
    # arenas) against what is live: RSS again once glibc gave its free pages back.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = _rss_bytes()
    t = time.process_time()
    for log in logs:
        assert len(await read_all(log)) == rounds * records  # every record back
    read_s = time.process_time() - t
    out = {
        "rounds": rounds,
        "extents_mean": statistics.mean(counts),
        "extents_max": max(counts),
        "files_mean": statistics.mean(files),
        "extents_bytes_mean": statistics.mean(nbytes),
        "index_bytes": index,
        "pack_bytes": pack_bytes,
        "rss_mib": rss / 2**20,
        "rss_trimmed_mib": trimmed / 2**20,
        "read_us_per_stream": read_s / streams * 1e6,
    }
    print(
        f"after {rounds} rounds: extents/stream {out['extents_mean']:.1f} (max {out['extents_max']}), "
        f"files/stream {out['files_mean']:.1f}, extents bytes/stream {out['extents_bytes_mean']:.0f}, "
        f"index {index / 1024:.0f} KiB, packs {pack_bytes / 1024:.0f} KiB, RSS {out['rss_mib']:.1f} MiB "
        f"({out['rss_trimmed_mib']:.1f} trimmed), "
        f"read {out['read_us_per_stream']:.0f} us CPU/stream"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=1, help="appends a stream a round")
    parser.add_argument("--profile", action="store_true", help="cProfile the rounds (loop only)")
    parser.add_argument("--json")
    parser.add_argument("--report-at", default="", help="rounds to report growth at: 8,32,128")
    parser.add_argument("--no-merge", action="store_true", help="merging off (step 2c A/B)")
    args = parser.parse_args()
    args.report_at = {int(r) for r in args.report_at.split(",") if r}
    if args.no_merge:
        extents.MERGE_BASE_EXTENTS = 1 << 30
    committer.CHECKPOINT_IDLE_SECONDS = 3600.0  # the script decides when checkpoints run
    counter = Counter()
    counter.install()
    if args.profile:
        counter.profile = cProfile.Profile()
    asyncio.run(main_async(args, counter))
    if counter.profile is not None:
        pstats.Stats(counter.profile).sort_stats("tottime").print_stats(15)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": counter.rows[1:], "ages": counter.ages}))


if __name__ == "__main__":
    main()
