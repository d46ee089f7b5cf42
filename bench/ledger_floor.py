"""The floor a batch ledger could reach (decision 0012): server CPU per stream of one routed batch's commit.

A routed batch writes ~10 rows from each of ``--partitions`` partitions to each of ``--streams``
existing streams. Its driver commit is sent three ways against one real server, alternating, and the
server's CPU (``/proc``) is taken per stream:

- ``inline``: today's ``sink.commit.commit_batch`` (bulk-write 2: one ``commits`` entry per stream
  with one inline part per partition, each its own keyed commit under its own producer tuple).
- ``plain``: what a ledger's appends would cost at least: one entry per stream holding every
  partition's rows as ONE JSON array, with no producer headers and no commit key (a plain append: no
  producer check, no dedup state, no commit digest). The ledger record itself is not included: it is
  one record per batch, not per stream.
- ``bytes``: ``plain`` to ``application/octet-stream`` streams (the partitions' bodies concatenated):
  the same with no JSON validation or split into messages, to see what that costs.
- ``split``: ``plain`` but one plain append per (stream, partition), side by side, as ``inline``'s
  parts are: ``inline`` minus ``split`` is what the producer tuples and commit keys cost, ``split``
  minus ``plain`` what a second append (request entry, record, answer) of a stream costs.
- ``one``: the reference: the batch's rows (every stream's) to ONE stream, as plain appends of
  ~1 MiB JSON arrays through the same bulk path. Issue 16's target is <= 3x of this (for the save).

The server has no bulk plain append (a ``commits`` entry must be a keyed commit): the server is run by
this script (``--serve``) with one bench-only patch of ``http/bulk.py``: an entry with the header
``X-Bench-Plain: 1`` (and no key) is taken as an inline entry and appended as a plain append by the
same ``Engine.append_batch`` path. Nothing of it is in the server package.

``--spy DIR`` records the server's stacks (py-spy, raw) during each timed commit.

Run: ``python bench/ledger_floor.py [--streams 10000] [--partitions 2] [--repeat 4] [--rows 10]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from listing_bench import server_cpu_seconds  # noqa: E402
from sink_commit_cpu import inline_messages  # noqa: E402
from sink_fanout_bench import spying  # noqa: E402

PLAIN = "x-bench-plain"
VARIANTS = ("inline", "plain", "bytes", "split", "one")
ROW = b'{"id":1,"name":"n1","pad":"' + b"x" * 70 + b'"}'


def settle(pid: int, deadline_s: float = 20.0) -> float:
    """The server's CPU once it has been idle for 2 s (under 10 ms of CPU): the work a commit leaves
    behind (the checkpoint after 1 s idle: storage/committer.py ``CHECKPOINT_IDLE_SECONDS``, its
    carry of packed records) counted with the commit that caused it."""
    seen = [server_cpu_seconds(pid)]
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        time.sleep(0.25)
        seen.append(server_cpu_seconds(pid))
        if len(seen) > 8 and seen[-1] - seen[-9] < 0.01:
            return seen[-1]
    return seen[-1]


def check(url: str, stream: str, variant: str, rows: int, octets: int) -> None:
    """The last stream holds the batch's rows once (a variant that wrote nothing, or twice, would
    time something else)."""
    import requests

    reply = requests.get(f"{url}/{stream}", params={"offset": "-1"}, timeout=30)
    reply.raise_for_status()
    # ``bytes``: the partitions' bodies, concatenated; else a JSON array of every row
    ok = len(reply.content) == octets if variant == "bytes" else len(reply.json()) == rows
    if not ok:
        raise RuntimeError(f"{variant}: {stream} does not hold the batch's {rows} rows once")


def serve(argv: list[str]) -> int:
    """The server with the bench-only plain bulk append (see the module docstring)."""
    from durastream_server import cli
    from durastream_server.http import bulk, parse

    is_inline, inline_commit = bulk._is_inline_commit, bulk._inline_commit

    def bench_is_inline(headers: dict[str, str]) -> bool:
        return PLAIN in headers or is_inline(headers)

    def bench_inline_commit(path: str, headers: dict[str, str], body: bytes, index: int) -> Any:
        if PLAIN in headers:
            return parse.append_request(path, headers, body)
        return inline_commit(path, headers, body, index)

    bulk._is_inline_commit = bench_is_inline
    bulk._inline_commit = bench_inline_commit
    return cli.main(argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--rows", type=int, default=10, help="rows of ~100 B per partition")
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    parser.add_argument("--spy", type=Path, help="py-spy the server during each commit")
    args = parser.parse_args()

    from durastream_spark.protocol import extensions as ext
    from durastream_spark.protocol.bulk import BulkWrites
    from durastream_spark.protocol.client import StreamClient
    from durastream_spark.sink.commit import commit_batch
    from durastream_spark.sink.options import SinkOptions
    from tests.support.server_process import ServerProcess

    class BenchServer(ServerProcess):
        def command(self, *, port: int | None = None) -> list[str]:
            cmd = super().command(port=port)
            return [cmd[0], __file__, "--serve", *cmd[3:]]

    variants = args.only.split(",")
    body = b"[" + b",".join([ROW] * args.rows) + b"]"
    whole = b"[" + b",".join([ROW] * (args.rows * args.partitions)) + b"]"
    results: dict[str, list[float]] = {v: [] for v in variants}
    after: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="ledger-floor-") as tmp:
        server = BenchServer(Path(tmp) / "data")
        server.start()
        try:
            url = server.base_url + "/v1/stream"
            options = SinkOptions.parse({"url": url, "contentType": "application/json"})
            client = StreamClient(options.connection)
            for run in range(args.repeat):
                # Rotate the order: no variant always runs on the emptiest or fullest server.
                order = variants[run % len(variants) :] + variants[: run % len(variants)]
                for variant in order:
                    prefix = f"{variant[0]}{uuid.uuid4().hex[:6]}"
                    streams = [f"{prefix}/s{i}" for i in range(args.streams)]
                    ctype = "application/octet-stream" if variant == "bytes" else "application/json"
                    bulk = BulkWrites(client, ctype)
                    bulk.ensure(streams[:1] if variant == "one" else streams, create=True)
                    if variant == "inline":
                        messages = inline_messages(streams, body, args.rows, args.partitions)

                        def send(messages: list = messages) -> None:
                            commit_batch(client, options, messages, batch_id=None)
                    else:
                        headers = {"Content-Type": ctype, "X-Bench-Plain": "1"}
                        if variant == "one":
                            per = max(1, (1 << 20) // len(ROW))
                            total = args.streams * args.rows * args.partitions
                            chunk = b"[" + b",".join([ROW] * per) + b"]"
                            last = b"[" + b",".join([ROW] * (total % per)) + b"]"
                            entries = [(streams[0], headers, chunk)] * (total // per)
                            if total % per:
                                entries.append((streams[0], headers, last))
                        elif variant == "split":
                            entries = [
                                (s, headers, body) for s in streams for _ in range(args.partitions)
                            ]
                        else:
                            data = whole if variant == "plain" else body * args.partitions
                            entries = [(s, headers, data) for s in streams]

                        def send(entries: list = entries, bulk: BulkWrites = bulk) -> None:
                            out = bulk._send(ext.COMMITS_PATH, entries, lambda i, r: r)
                            failed = [o for o in out if isinstance(o, Exception)]
                            if failed:
                                raise RuntimeError(f"{len(failed)} entries failed: {failed[0]}")

                    srv0, wall0 = server_cpu_seconds(server.pid), time.perf_counter()
                    with spying(args.spy if variant == "plain" else None, {"server": server.pid}):
                        send()
                    wall = time.perf_counter() - wall0
                    srv = server_cpu_seconds(server.pid) - srv0
                    settled = settle(server.pid) - srv0
                    # after the timing: the GET is not the commit
                    if variant != "one":
                        check(
                            url,
                            streams[-1],
                            variant,
                            args.rows * args.partitions,
                            len(body) * args.partitions,
                        )
                    per_stream = 1e6 * srv / args.streams
                    results[variant].append(per_stream)
                    after[variant].append(1e6 * settled / args.streams)
                    print(
                        json.dumps(
                            {
                                "run": run,
                                "variant": variant,
                                "wall_s": round(wall, 3),
                                "server_cpu_s": round(srv, 3),
                                "server_us_stream": round(per_stream, 1),
                                "settled_us_stream": round(1e6 * settled / args.streams, 1),
                            }
                        ),
                        flush=True,
                    )
        finally:
            server.stop()
    base = results.get("inline")
    for variant, values in results.items():
        summary: dict[str, Any] = {
            "variant": variant,
            "median_us_stream": round(statistics.median(values), 1),
            "range": [round(min(values), 1), round(max(values), 1)],
        }
        summary["settled_median_us_stream"] = round(statistics.median(after[variant]), 1)
        if base and variant != "inline":
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            summary["vs_inline_median"] = round(statistics.median(ratios), 2)
            summary["vs_inline_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        sys.path.insert(0, str(REPO / "server"))
        raise SystemExit(serve(sys.argv[2:]))
    main()
