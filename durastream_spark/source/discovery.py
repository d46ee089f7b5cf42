"""Which streams a query reads right now, with their tails: ``streams`` (a fixed list) or ``pattern``.

A snapshot is taken once per ``latestOffset()`` (and once per batch read): for ``streams``, one ``HEAD`` per
stream (in parallel when there are several); for ``pattern``, the server's listing extension (one request per
10,000 streams, the largest page the extension allows: a 10,000-stream batch read is one or two round
trips, not ten), which also makes streams created while the query runs appear in the next snapshot. A server
without the listing extension but with the protocol's subscriptions (section 6, the Node reference server)
lists through them: a pull-wake subscription for the pattern links every matching stream when it is
created, so each snapshot creates one, reads its streams and deletes it (three requests), then ``HEAD``s
the streams. Its globs have ``*`` only as a whole segment, so a pattern with ``ev*`` inside a segment is
sent as ``*`` there and filtered here. A stream
that does not exist is simply absent from the snapshot; whether that is data loss (it existed and was
deleted) or nothing yet (never created) is decided by the caller, which knows the offsets.

Glob rules (as the server's listing and subscriptions): ``*`` as a whole segment matches one segment, ``**``
any number of segments (also none), a ``*`` inside a segment any run of characters in that segment.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from operator import methodcaller
from typing import TYPE_CHECKING, NamedTuple

from durastream_spark.errors import ExtensionNotSupported, StreamGone, StreamNotFound
from durastream_spark.protocol.models import StreamColumns

if TYPE_CHECKING:  # the client imports the package root: importing it here would be circular
    from durastream_spark.protocol.client import StreamClient

log = logging.getLogger(__name__)

_HEAD_PARALLELISM = 16
# Streams asked for per listing page (the extension allows up to 10,000, docs/extensions.md section 4).
# The listing's time is mostly round trips, so pages are large and the next one is fetched while this
# one is read (``StreamClient.list_streams``); but the server builds a page on its event loop, ~8 us a
# stream, so a 10,000-stream page would stall every other request for 60-100 ms. 2,500 keeps that
# stall near 20 ms and still lists 10,000 streams in four overlapped requests.
LISTING_PAGE = 2_500


class StreamState(NamedTuple):
    """One stream as the server described it: its tail (next offset), closure and content type. A
    tuple: a snapshot of 10,000 streams makes 10,000."""

    path: str
    tail: str
    closed: bool
    content_type: str


def normalize_pattern(text: str) -> str:
    """A root-relative glob, checked. Raises ``ValueError`` saying what is wrong."""
    clean = text.strip().strip("/")
    if not clean:
        raise ValueError("the pattern is empty")
    for segment in clean.split("/"):
        if segment == "":
            raise ValueError("the pattern has an empty segment ('//')")
        if "**" in segment and segment != "**":
            raise ValueError("'**' must be a whole path segment")
        if segment in (".", ".."):
            raise ValueError("the pattern has a '.' or '..' segment")
    return clean


def check_pattern_supported(client: StreamClient, pattern: str) -> None:
    """Refuse a ``pattern`` on a server that can list streams neither way (e.g. rakaia)."""
    if client.extensions().listing or client.subscriptions_supported():
        return
    raise ExtensionNotSupported(
        "listing",
        client.connection.url,
        f"discover the streams matching pattern {pattern!r} (the server has neither this extension "
        "nor the protocol's subscription globs, section 6); list the streams with option 'streams' "
        "instead",
    )


def whole_segment_glob(pattern: str) -> str:
    """``pattern`` with every segment that has a ``*`` inside it widened to ``*`` (the protocol's
    subscription globs know ``*`` and ``**`` only as whole segments); the caller filters the result."""
    return "/".join(
        "*" if "*" in segment and segment != "**" else segment for segment in pattern.split("/")
    )


@lru_cache(maxsize=256)
def _segment_regex(segment: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in segment.split("*")), re.DOTALL)


def glob_matches(pattern: str, path: str) -> bool:
    """Whether the root-relative ``path`` matches ``pattern`` (rules in the module docstring)."""
    whole = _whole_regex(pattern)
    if whole is not None:
        return whole.fullmatch(path) is not None
    return _match(tuple(pattern.split("/")), tuple(path.split("/")))


@lru_cache(maxsize=256)
def _whole_regex(pattern: str) -> re.Pattern[str] | None:
    """A pattern without ``**`` as one regex (a ``*`` matches within a segment): a snapshot of 10,000
    streams tests each path once in C rather than segment by segment in Python. None with ``**``."""
    segments = pattern.split("/")
    if "**" in segments:
        return None
    return re.compile(
        "/".join("[^/]*".join(map(re.escape, segment.split("*"))) for segment in segments),
        re.DOTALL,
    )


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and bool(_segment_regex(head).fullmatch(path[0])) and _match(rest, path[1:])


class StreamCatalog:
    """Snapshots of the selected streams. Holds no state between snapshots; picklable."""

    def __init__(
        self,
        client: StreamClient,
        *,
        streams: Iterable[str] = (),
        pattern: str | None = None,
        exclude_prefix: str | None = None,
    ) -> None:
        self.client = client
        self.streams = tuple(streams)
        self.pattern = pattern
        # The source's own fallback pins (forks) must never be read as data by a broad pattern.
        self.exclude_prefix = None if exclude_prefix is None else exclude_prefix.rstrip("/") + "/"

    def snapshot(self) -> dict[str, StreamState]:
        """``{path: StreamState}`` of every selected stream that exists now (sorted by path)."""
        if self.pattern is not None and self.client.extensions().listing:
            columns = self.snapshot_columns()
            return dict(
                zip(
                    columns.paths,
                    map(
                        StreamState,
                        columns.paths,
                        columns.next_offsets,
                        columns.closed,
                        columns.content_types,
                    ),
                    strict=True,
                )
            )
        if self.pattern is not None:
            wake = (self.exclude_prefix or "__durastream/") + "__wake"
            paths = self.client.subscription_streams(whole_segment_glob(self.pattern), wake)
            selected = self._selector()
            found = self._heads(tuple(sorted({p for p in paths if selected(p)})))
        else:
            found = self._heads(self.streams)
        return {path: found[path] for path in sorted(found)}

    def snapshot_columns(self) -> StreamColumns:
        """``snapshot()`` as columns (sorted by path, each path once): a batch read of 10,000
        streams plans from columns, without a ``StreamState`` a stream. From the listing extension
        when the selection is a pattern and the server has it; else built from ``snapshot()``."""
        if self.pattern is None or not self.client.extensions().listing:
            states = self.snapshot()
            return StreamColumns(
                list(states),
                [state.content_type for state in states.values()],
                [state.tail for state in states.values()],
                [state.closed for state in states.values()],
            )
        listed = self.client.list_stream_columns(pattern=self.pattern, page_size=LISTING_PAGE)
        paths = listed.paths
        # Defensive: the server filtered already (and lists by path, each once); the columns are
        # only rebuilt when it did not.
        keep = self._matches(paths)
        ordered = all(map(str.__lt__, paths, paths[1:]))  # sorted and without repeats
        if keep is None and ordered:
            return listed
        chosen: dict[str, int] = {}  # a repeated path: the last entry wins, as in a dict
        for index, path in enumerate(paths):
            if keep is None or keep[index]:
                chosen[path] = index
        rows = [chosen[path] for path in sorted(chosen)]
        return StreamColumns(*([column[i] for i in rows] for column in listed))

    def _matches(self, paths: list[str]) -> list[bool] | None:
        """Which ``paths`` the selection takes, or None for all of them (the common answer: one
        C-level regex pass over the listing, no Python call a path)."""
        whole = _whole_regex(self.pattern) if self.pattern is not None else None
        excluded = self.exclude_prefix
        if (
            whole is not None
            and all(map(whole.fullmatch, paths))
            and (excluded is None or not any(map(methodcaller("startswith", excluded), paths)))
        ):
            return None
        keep = list(map(self._selector(), paths))
        return None if all(keep) else keep

    def _selector(self) -> Callable[[str], bool]:
        """The test of one path, built once per snapshot: a listing of 10,000 streams checks each
        path with one compiled regex call, not a cache lookup and two method calls per path."""
        assert self.pattern is not None
        pattern, excluded = self.pattern, self.exclude_prefix
        whole = _whole_regex(pattern)
        if whole is not None and excluded is None:
            return lambda path: whole.fullmatch(path) is not None
        if whole is not None:
            return lambda path: whole.fullmatch(path) is not None and not path.startswith(excluded)
        return lambda path: (
            glob_matches(pattern, path) and not (excluded is not None and path.startswith(excluded))
        )

    def _heads(self, paths: tuple[str, ...]) -> dict[str, StreamState]:
        if len(paths) <= 1:
            states = [self._head(path) for path in paths]
        else:
            with ThreadPoolExecutor(min(_HEAD_PARALLELISM, len(paths))) as pool:
                states = list(pool.map(self._head, paths))
        return {state.path: state for state in states if state is not None}

    def _head(self, path: str) -> StreamState | None:
        try:
            meta = self.client.head(path)
        except (StreamNotFound, StreamGone) as error:
            log.debug("stream %r is not readable now: %s", path, error)
            return None
        return StreamState(path, meta.next_offset, meta.closed, meta.content_type)
