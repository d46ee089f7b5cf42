"""What a checkpoint's pack work costs when many packed streams each take one small append (issue 16).

In process, real files (``--durability fsync``, packed appends on): ``--streams`` packed streams are
created, then each ``--rounds`` round appends one record to every stream and forces a checkpoint. Each
checkpoint's ``PackBook.carry_out`` (thread) and ``PackBook.carried_out`` (loop) are timed (CPU of the
calling thread) and ``write_pack`` is counted: the packs it writes, their entries and bytes, against
the round's new records. So it says whether a checkpoint rewrites more than the round's new data, and
what the pack work costs per stream. Run from a tree's root: ``PYTHONPATH=server:. .venv/bin/python
bench/pack_checkpoint_bench.py --dir /tmp/x``; ``--json`` writes the figures for an A/B."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import shutil
import sys
import time
from pathlib import Path

from durastream_server.storage import DataDir, committer, packs
from durastream_server.storage.datadir import StorageConfig
from durastream_server.storage.log import AppendEntry
from durastream_server.storage.records import StreamHeader

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.server.storage._util import checkpoint  # noqa: E402  (the tests' forced checkpoint)


class Counter:
    """Wraps ``write_pack``, ``carry_out`` and ``carried_out`` to count and time them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.now: dict[str, float] = {}
        self.profile: cProfile.Profile | None = None

    def install(self) -> None:
        write_pack = packs.write_pack
        carry_out = packs.PackBook.carry_out
        carried_out = packs.PackBook.carried_out
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
            f"carried_out {row.get('carried_out_s', 0) * 1e3:.1f} ms ({args.streams * args.records} new records)"
        )
    await dd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=1, help="appends a stream a round")
    parser.add_argument("--profile", action="store_true", help="cProfile the rounds (loop only)")
    parser.add_argument("--json")
    args = parser.parse_args()
    committer.CHECKPOINT_IDLE_SECONDS = 3600.0  # the script decides when checkpoints run
    counter = Counter()
    counter.install()
    if args.profile:
        counter.profile = cProfile.Profile()
    asyncio.run(main_async(args, counter))
    if counter.profile is not None:
        pstats.Stats(counter.profile).sort_stats("tottime").print_stats(15)
    if args.json:
        Path(args.json).write_text(json.dumps(counter.rows[1:]))


if __name__ == "__main__":
    main()
