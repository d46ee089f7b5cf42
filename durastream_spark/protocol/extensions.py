"""The durastream protocol extensions a server advertises (docs/extensions.md, "Advertisement").

durastream-server sends ``Durastream-Extensions: bounded-read=1, message-frames=1, ...`` on every response and
answers ``GET {root}/__ds/x-durastream/extensions``. Any other server (the Node reference server) sends
neither: an absent header, or a 404 on the discovery URL, means "no extensions", and the connector falls back
to the base protocol or refuses with an explanation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

HEADER = "Durastream-Extensions"
DISCOVERY_PATH = "/__ds/x-durastream/extensions"
LISTING_PATH = "/__ds/x-durastream/streams"
CHANGES_PATH = "/__ds/x-durastream/changes"
SELECTIONS_PATH = "/__ds/x-durastream/selections"
LOOKUPS_PATH = "/__ds/x-durastream/lookups"
READS_PATH = "/__ds/x-durastream/reads"
ENSURE_PATH = "/__ds/x-durastream/ensure"
STAGES_PATH = "/__ds/x-durastream/stages"
COMMITS_PATH = "/__ds/x-durastream/commits"

BOUNDED_READ = "bounded-read"
MESSAGE_FRAMES = "message-frames"
LIMIT_LOOKUP = "limit-lookup"
LISTING = "listing"
STAGED_APPEND = "staged-append"
PAYLOAD_DIGEST = "payload-digest"
TIME_LOOKUP = "time-lookup"
CHANGES = "changes"
MULTI_RANGE = "multi-range"
BULK_WRITE = "bulk-write"
BYTE_POSITIONS = "byte-positions"

# Versions that add to an extension (a server advertising a version has every earlier one too).
# staged-append 2: handle lists in the request body (``Durastream-Commit: @body``) and commit keys.
STAGED_APPEND_LISTS_AND_KEYS = 2
# bulk-write 2: an inline commit entry may hold several parts of its stream (Durastream-Commit-Parts).
BULK_WRITE_PARTS = 2


@dataclass(frozen=True)
class Extensions:
    """Advertised extensions as ``(name, version)`` pairs, sorted. Frozen, hashable and picklable."""

    versions: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, header: str | None) -> Extensions:
        """Parse a ``Durastream-Extensions`` value. Malformed entries are skipped, never guessed at."""
        if not header:
            return NO_EXTENSIONS
        found: dict[str, int] = {}
        for entry in header.split(","):
            entry = entry.strip()
            if not entry:
                continue
            name, sep, version = entry.partition("=")
            name = name.strip().lower()
            if not name:
                continue
            if not sep:
                found[name] = 1
                continue
            try:
                found[name] = int(version.strip())
            except ValueError:
                log.warning("ignoring malformed %s entry %r", HEADER, entry)
        return cls(tuple(sorted(found.items())))

    @classmethod
    def from_document(cls, document: object) -> Extensions:
        """From the discovery endpoint's JSON: ``{"extensions": {"bounded-read": 1, ...}}``."""
        if not isinstance(document, Mapping):
            return NO_EXTENSIONS
        listed = document.get("extensions")
        if not isinstance(listed, Mapping):
            return NO_EXTENSIONS
        found = {
            str(name).lower(): int(version)
            for name, version in listed.items()
            if isinstance(version, int) and not isinstance(version, bool)
        }
        return cls(tuple(sorted(found.items())))

    def version(self, name: str) -> int | None:
        for candidate, version in self.versions:
            if candidate == name:
                return version
        return None

    def supports(self, name: str, min_version: int = 1) -> bool:
        version = self.version(name)
        return version is not None and version >= min_version

    @property
    def bounded_read(self) -> bool:
        return self.supports(BOUNDED_READ)

    @property
    def message_frames(self) -> bool:
        return self.supports(MESSAGE_FRAMES)

    @property
    def limit_lookup(self) -> bool:
        return self.supports(LIMIT_LOOKUP)

    @property
    def listing(self) -> bool:
        return self.supports(LISTING)

    @property
    def staged_append(self) -> bool:
        return self.supports(STAGED_APPEND)

    @property
    def payload_digest(self) -> bool:
        return self.supports(PAYLOAD_DIGEST)

    @property
    def time_lookup(self) -> bool:
        return self.supports(TIME_LOOKUP)

    @property
    def changes(self) -> bool:
        return self.supports(CHANGES)

    @property
    def multi_range(self) -> bool:
        return self.supports(MULTI_RANGE)

    @property
    def byte_positions(self) -> bool:
        return self.supports(BYTE_POSITIONS)

    def __bool__(self) -> bool:
        return bool(self.versions)


NO_EXTENSIONS = Extensions()
