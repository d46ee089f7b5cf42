"""The data directory's format marker (``storage/features.py``, decision 0010 step 2): a directory that
may hold packed records (WAL kind 5) names them in ``FEATURES`` before any is written, and a server
that does not read a feature the marker names refuses to start on it (it would take kind 5 entries
for a torn WAL end and drop acknowledged rounds). Real ``DataDir`` and a real server process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durastream_server.storage import features

from ._util import append, header, open_dd, run


def test_packed_appends_names_packed_records_before_anything_is_written(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path, packed_appends=True)
        try:
            assert features.read(tmp_path) == {
                features.PACKED_RECORDS,
                features.PACKED_CREATE_DATA,
            }
            log = await dd.create_stream(header("/s"), None)
            await append(log, b"x")
        finally:
            await dd.close()
        # Reopened without the flag: still named (never removed), and still readable by this server.
        dd = await open_dd(tmp_path)
        await dd.close()
        assert (tmp_path / features.FILE).read_text() == "packed-create-data\npacked-records\n"
        assert not (tmp_path / (features.FILE + ".tmp")).exists()

    run(go)


def test_default_writes_no_marker(tmp_path: Path) -> None:
    async def go() -> None:
        dd = await open_dd(tmp_path)
        await dd.close()

    run(go)
    assert not (tmp_path / features.FILE).exists()
    assert features.read(tmp_path) == frozenset()


def test_a_server_without_packed_records_refuses_a_directory_that_names_them(
    tmp_path: Path,
) -> None:
    features.mark(tmp_path, features.PACKED_RECORDS, sync=True)
    with pytest.raises(features.UnknownFormat, match="packed-records") as caught:
        features.require_known(tmp_path, known=frozenset())
    assert str(tmp_path / features.FILE) in str(caught.value)
    assert features.require_known(tmp_path) == {features.PACKED_RECORDS}


def test_a_server_without_packed_create_data_refuses_a_directory_that_names_it(
    tmp_path: Path,
) -> None:
    """A server that reads packed records but not a packed create's data would serve such a stream
    empty: it must refuse the directory instead."""
    features.mark(tmp_path, features.PACKED_RECORDS, features.PACKED_CREATE_DATA, sync=True)
    with pytest.raises(features.UnknownFormat, match="packed-create-data"):
        features.require_known(tmp_path, known=frozenset({features.PACKED_RECORDS}))
    assert features.require_known(tmp_path) == {
        features.PACKED_RECORDS,
        features.PACKED_CREATE_DATA,
    }


def test_unknown_feature_refuses_start_and_touches_nothing(tmp_path: Path) -> None:
    (tmp_path / features.FILE).write_text("packed-records\nfuture-feature\n")

    async def go() -> None:
        with pytest.raises(features.UnknownFormat, match="future-feature"):
            await open_dd(tmp_path)

    run(go)
    # Refused before start-up made or emptied anything (no WAL replay, no directories).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FEATURES", "LOCK"]
    # The lock was let go: a server that reads the directory's features opens it once they are known.
    (tmp_path / features.FILE).write_text("packed-records\n")

    async def reopen() -> None:
        dd = await open_dd(tmp_path)
        await dd.close()

    run(reopen)


def test_server_process_exits_with_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / features.FILE).write_text("future-feature\n")
    result = subprocess.run(
        [sys.executable, "-m", "durastream_server", "--data-dir", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "future-feature" in result.stderr
    assert "FEATURES" in result.stderr
    assert "--data-dir" in result.stderr
