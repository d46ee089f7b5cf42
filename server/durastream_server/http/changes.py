"""``{root}/__ds/x-durastream/changes`` and ``.../selections``: the change feed over HTTP (extension
``changes``, docs/extensions.md section 9).

``GET changes?since=C&pattern=G|prefix=P|selection=ID&limit=L&wait=MS`` answers the selected paths that
changed after cursor ``C`` with their current state (``engine/changes.py``); with ``wait`` it parks,
like a long-poll, until one changes. ``POST selections`` registers an explicit list of paths once, so
that later questions name it by id instead of sending the list (``engine/selections.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from durastream_server.errors import BadRequest, MethodNotAllowed
from durastream_server.http.body import parse_json, read_body
from durastream_server.http.live import Disconnect, LiveReaders
from durastream_server.http.query import bounded_int, glob_parameter

if TYPE_CHECKING:
    from durastream_server.engine.changes import Match
    from durastream_server.engine.engine import Engine
    from durastream_server.http.handlers import Request

DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 10_000
# Entries a page may examine beyond its limit (changes of paths outside the selection, tombstones in a
# snapshot) before it answers with what it found and ``more``.
EXAMINE_ALLOWANCE: Final = 10_000
MAX_WAIT_MS: Final = 60_000
MAX_SELECTION_PATHS: Final = 1_000_000
MAX_PATH_BYTES: Final = 4096
# Marks a change query of another worker following this shard for its subscriptions
# (``shards/subscriptions.py``), honoured only with a shard part's mark from a worker's socket: its wait
# is not a client's parked reader.
FOLLOWER_HEADER: Final = "x-durastream-follower"
PARAMETERS: Final = ("since", "prefix", "pattern", "selection", "limit", "wait")
_SHAPE: Final = 'a JSON object {"streams": ["path", ...]} with 1 to 1,000,000 stream paths'


async def serve_changes(
    engine: Engine,
    live: LiveReaders,
    request: Request,
    values: dict[str, str],
    *,
    counted: bool = True,
) -> dict[str, Any]:
    """One page of changes, after waiting for one if asked to and there is none yet (a parked
    reader of ``/healthz`` unless not ``counted``: another worker's follower)."""
    if request.method not in ("GET", "HEAD"):
        raise MethodNotAllowed("use GET", headers={"Allow": "GET, HEAD"})
    since = values.get("since") or None
    match = matcher(engine, values)
    limit = bounded_int(values, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    wait_ms = bounded_int(values, "wait", 0, 0, MAX_WAIT_MS)
    examine = limit + EXAMINE_ALLOWANCE
    page = engine.changed(since, match, limit=limit, examine=examine)
    if wait_ms and since is not None and not (page.changes or page.more or page.reset):
        # Wait from the page's cursor: the entries before it were examined and are not selected.
        cursor = page.cursor
        disconnect = Disconnect(request.receive)
        try:
            woke = await live.park(
                lambda release: engine.wait_changed(
                    cursor, match, wait_ms / 1000, release, examine=examine
                ),
                disconnect,
                counted=counted,
            )
        finally:
            await disconnect.close()
        if woke:
            page = engine.changed(cursor, match, limit=limit, examine=examine)
    return {
        "changes": [
            {"path": path, "deleted": True}
            if state is None
            else {
                "path": path,
                "content_type": state.content_type,
                "next_offset": state.next_offset,
                "closed": state.closed,
            }
            for path, state in page.changes
        ],
        "cursor": page.cursor,
        "more": page.more,
        "reset": page.reset,
    }


async def serve_selections(
    engine: Engine,
    request: Request,
    max_body_bytes: int,
    *,
    keep: Callable[[str], bool] | None = None,
    elsewhere: Callable[[bytes], Awaitable[int]] | None = None,
) -> dict[str, Any]:
    """Register ``{"streams": [path, ...]}``; answers its id and how many distinct paths it holds.

    With ``--workers N`` (``shards/changefeed.py``) this worker holds only the paths ``keep`` holds
    (its shard's), under the id of them all, and ``elsewhere`` registers the same body with the other
    workers, answering how many paths they hold."""
    if request.method != "POST":
        raise MethodNotAllowed("register a selection with POST", headers={"Allow": "POST"})
    body = await read_body(request.receive, request.headers, max_body_bytes)
    selection = await engine.register_selection(_paths(await parse_json(body, _SHAPE)), keep)
    held = len(selection.paths)
    if elsewhere is not None:
        held += await elsewhere(body)
    return {"selection": selection.id, "streams": held}


def _paths(document: Any) -> list[str]:
    if not isinstance(document, dict) or set(document) != {"streams"}:
        raise BadRequest(f"the body must be {_SHAPE}")
    paths = document["streams"]
    if not isinstance(paths, list) or not 1 <= len(paths) <= MAX_SELECTION_PATHS:
        raise BadRequest(f"'streams' must be a list of 1 to {MAX_SELECTION_PATHS} paths")
    for path in paths:
        if (
            not isinstance(path, str)
            or not path
            or "\x00" in path
            or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES
        ):
            raise BadRequest(
                f"every entry of 'streams' must be a stream path (non-empty text of at most "
                f"{MAX_PATH_BYTES} bytes, no NUL), got {str(path)[:100]!r}"
            )
    return paths


def matcher(engine: Engine, values: dict[str, str]) -> Match | None:
    """What the selection parameters hold, all of them at once (``None``: every path); 400 or 404
    naming a bad one."""
    tests: list[Match] = []
    prefix = values.get("prefix")
    if prefix:
        tests.append(lambda path: path.startswith(prefix))
    pattern = glob_parameter(values)
    if pattern is not None:
        head = pattern.literal_prefix()
        tests.append(lambda path: path.startswith(head) and pattern.matches(path))
    if "selection" in values:
        selection = engine.selection(values["selection"])
        tests.append(selection.matches)
    if not tests:
        return None
    if len(tests) == 1:
        return tests[0]
    return lambda path: all(test(path) for test in tests)
