"""The protocol extensions this server implements, defined once (see ``docs/extensions.md``).

Clients (the durastream connector) discover them from the ``Durastream-Extensions`` header that every
response carries, or from ``GET {root}/__ds/x-durastream/extensions``; a server without the header (e.g. the
Node reference server) has none of them. Both answers are derived from ``EXTENSIONS`` so they can never
disagree, and a component that adds an extension only has to bump or add its entry here.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final

from durastream_server import __version__

# name -> version. Versions only ever grow; a client checks ``version >= what it needs``.
EXTENSIONS: Final = MappingProxyType(
    {
        "bounded-read": 1,
        "message-frames": 1,
        "limit-lookup": 1,
        "listing": 1,
        "staged-append": 2,
        "payload-digest": 2,  # 2: every seq of the current epoch, and Durastream-Digest on 204s
        "forgotten-producers": 1,
        "time-lookup": 1,
        "changes": 1,
        "multi-range": 1,
        "bulk-write": 2,  # 2: inline commits of several parts (Durastream-Commit-Parts)
        "byte-positions": 1,  # an offset's position counts payload bytes: a range's size is E - S
    }
)

HEADER: Final = "Durastream-Extensions"
HEADER_VALUE: Final = ", ".join(f"{name}={version}" for name, version in EXTENSIONS.items())
SERVER: Final = f"durastream-server/{__version__}"


# Extensions whose requests span streams and that a server with ``--workers`` > 1 does not serve yet:
# its workers answer them 501 (each sees only its shard, shards/router.py), so it does not advertise
# them and clients fall back. None left: the listing, the change feed, multi-range reads and
# bulk-write are fanned out to every shard (shards/fanout.py, changefeed.py, multirange.py,
# bulkwrite.py), and staged appends are requests of one stream each (a handle belongs to the stream
# it was staged into), served in that stream's shard like any other (decision 0009).
NOT_WITH_WORKERS: Final[frozenset[str]] = frozenset()


def advertisement(withheld: frozenset[str] = frozenset()) -> tuple[str, str]:
    """The header every response carries (less ``withheld``)."""
    if not withheld:
        return HEADER, HEADER_VALUE
    kept = (f"{name}={version}" for name, version in EXTENSIONS.items() if name not in withheld)
    return HEADER, ", ".join(kept)


def discovery_document(withheld: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The body of ``GET {root}/__ds/x-durastream/extensions`` (less ``withheld``, as the header)."""
    kept = {name: version for name, version in EXTENSIONS.items() if name not in withheld}
    return {"server": SERVER, "extensions": kept}
