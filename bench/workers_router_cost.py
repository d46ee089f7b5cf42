"""The router's per-request checks under ``--workers N``, in-process: this tree against another.

h68 (decision 0009, forks across shards) added checks to every request a worker serves: a placement
question from another worker (``placement_query``), the placed mark (``owner_for``) and a fork create
at its home (``fork_source``). This measures their CPU with ``timeit`` (best of 5 x 20,000 calls),
in the same process, for one tree's ``server/`` given on the command line, so two trees can be run
alternately (the machine is shared: compare medians of alternating runs, never one figure)::

    for i in 1 2 3 4; do python bench/workers_router_cost.py /work/main; python bench/workers_router_cost.py .; done
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import timeit
from typing import Any


def main(source: str) -> None:
    sys.path.insert(0, source + "/server")
    from durastream_server.shards.layout import shard_of
    from durastream_server.shards.router import ShardRouter

    router: Any = ShardRouter(0, 2, pathlib.Path(tempfile.mkdtemp()))
    forks = hasattr(router, "owner_for")
    if forks:
        from durastream_server.shards.forks import ForkPlacements

        router.placements = ForkPlacements(pathlib.Path(tempfile.mkdtemp()) / "placements")
        router.hosts = {"x"}.__contains__
    own = next(f"s/{i}" for i in range(100) if shard_of(f"s/{i}", 2) == 0)
    other = next(f"s/{i}" for i in range(100) if shard_of(f"s/{i}", 2) == 1)

    def scope(path: str) -> dict[str, Any]:
        headers = [(b"host", b"x"), (b"content-type", b"application/json")]
        return {
            "method": "POST",
            "raw_path": f"/v1/stream/{path}".encode(),
            "server": ("127.0.0.1", 8080),
            "headers": [*headers, (b"content-length", b"200")],
        }

    mine, theirs = scope(own), scope(other)

    def ordinary() -> None:
        if forks:
            router.placement_query(mine)
            router.owner_for(mine)
            router.fork_source(mine)
        else:
            router.owner_elsewhere(mine["raw_path"])

    cases = {
        "direct_allowed, own stream": lambda: router.direct_allowed("POST", mine),
        "direct_allowed, other shard's": lambda: router.direct_allowed("POST", theirs),
        "ordinary path's checks, own stream": ordinary,
    }
    for name, call in cases.items():
        best = min(timeit.repeat(call, number=20_000, repeat=5)) / 20_000
        print(f"{source}\t{name}\t{best * 1e6:.2f} us")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
