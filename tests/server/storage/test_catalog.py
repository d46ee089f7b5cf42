"""The stream catalog (storage/catalog.py) and the recovery plan built from it (storage/pending.py)."""

from __future__ import annotations

from pathlib import Path

from durastream_server.storage import catalog
from durastream_server.storage.catalog import Entry
from durastream_server.storage.pending import plan

PATHS = ["a", "with space", "back\\slash\\n", "new\nline", "ünï/cødé", "a\\\\b\n\n"]


def test_any_path_reads_back_and_a_damaged_line_is_skipped(tmp_path: Path) -> None:
    book = catalog.Catalog(tmp_path)
    for n, path in enumerate(PATHS):
        book.add(f"id{n}", Entry(path, "id0" if n else None))
    book.close()
    loaded = catalog.load(tmp_path)
    assert loaded.lines == len(PATHS)
    assert loaded.entries == {
        f"id{n}": Entry(path, "id0" if n else None) for n, path in enumerate(PATHS)
    }
    raw = (tmp_path / catalog.CATALOG_NAME).read_bytes()
    (tmp_path / catalog.CATALOG_NAME).write_bytes(raw.replace(b"id1 id0 with", b"id1 id0 wiTh"))
    assert "id1" not in catalog.load(tmp_path).entries
    assert len(catalog.load(tmp_path).entries) == len(PATHS) - 1


def test_a_rewrite_keeps_the_lines_added_since_the_catalog_was_opened(tmp_path: Path) -> None:
    old = catalog.Catalog(tmp_path)
    old.add("gone", Entry("deleted", None))
    old.add("kept", Entry("k", None))
    old.close()
    book = catalog.Catalog(tmp_path)
    book.add("new", Entry("n", None))  # a create while the server starts
    book.rewrite({"kept": Entry("k", None)})
    book.add("newer", Entry("m", None))
    book.close()
    loaded = catalog.load(tmp_path)
    assert set(loaded.entries) == {"kept", "new", "newer"} and loaded.lines == 3


def test_forks_and_incarnations_of_a_path_recover_together() -> None:
    hints = {
        "1": Entry("src", None),
        "2": Entry("fork", "1"),
        "3": Entry("fork2", "2"),
        "4": Entry("alone", None),
        "5": Entry("again", None),
        "6": Entry("again", None),  # a second incarnation of the path
        "7": Entry("orphan", "0"),  # its source is gone
    }
    pending = plan(["1", "2", "3", "4", "5", "6", "7", "8"], hints)  # "8": no hint
    assert list(pending.unit_keys()) == ["1", "4", "5", "7", "8"]
    assert pending.ids("1") == ["1", "2", "3"] and pending.ids("5") == ["5", "6"]
    assert pending.unit_of("fork2") == "1" and pending.unit_of("again") == "5"
    assert pending.unit_of("alone") == "4" and len(pending) == 8
    pending.recovered("1")
    assert pending.unit_of("fork") is None and len(pending) == 5
