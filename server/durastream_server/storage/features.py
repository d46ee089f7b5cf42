"""The data directory's format marker: ``<data-dir>/FEATURES``, one on-disk feature name per line.

Why: a feature that changes what the files mean must stop a server that does not know it from reading
them. Packed records (WAL entry kind 5, decision 0010 step 2) are the first: a server without them
reads such an entry as a torn WAL end, truncates there and drops acknowledged rounds. So a data
directory that may ever hold kind 5 entries names ``packed-records`` here, written and synced before the
first such entry, and a server refuses to start on a directory naming a feature it does not know.

The file is never removed or shortened: once a directory has held a feature, only servers that know it
may open it. A missing file means no feature beyond the base format (every directory written before it).
Servers older than this module do not read it (they predate packed records; see decision 0010,
"Step 2: status").
"""

from __future__ import annotations

from pathlib import Path

from durastream_server.storage.files import replace_file

FILE = "FEATURES"
PACKED_RECORDS = "packed-records"
# A packed create (WAL/pack entry kind PACKED) whose one record is the header frame followed by its
# initial data's frame (a ``PUT`` with a body, issue 17): a server without it would take the entry
# for a header alone and serve the stream empty. Named with ``packed-records`` (the same servers
# write both).
PACKED_CREATE_DATA = "packed-create-data"
# Every feature this server reads.
KNOWN = frozenset({PACKED_RECORDS, PACKED_CREATE_DATA})


class UnknownFormat(RuntimeError):
    """The data directory was written with a feature this server does not read."""


def read(root: Path) -> frozenset[str]:
    """The features ``root`` names (empty when it has no marker)."""
    try:
        text = (root / FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return frozenset()
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def require_known(root: Path, known: frozenset[str] = KNOWN) -> frozenset[str]:
    """Raise ``UnknownFormat`` if ``root`` names a feature outside ``known``; else its features."""
    named = read(root)
    unknown = sorted(named - known)
    if unknown:
        raise UnknownFormat(
            f"data directory {root} uses on-disk feature(s) {', '.join(unknown)} (listed in "
            f"{root / FILE}) that this server does not read; this server reads "
            f"{', '.join(sorted(known)) or 'none'}. Start a server version that supports them; "
            "do not edit the file (the data would be read wrongly)"
        )
    return named


def mark(root: Path, feature: str, *more: str, sync: bool) -> None:
    """Add ``feature`` (and ``more``) to ``root``'s marker if missing: written to a temporary file,
    synced, renamed over the marker and the directory synced, so a crash leaves the old marker or the
    new one. Several at once: one replace at start-up, not one each."""
    named = read(root)
    wanted = {feature, *more}
    if wanted <= named:
        return
    data = "".join(f"{name}\n" for name in sorted(named | wanted)).encode()
    replace_file(root / FILE, [data], sync=sync)
