"""Many small streams on one server (issue 17): start-up after SIGKILL recovers every one of them in
batches, staged appends come back for the streams that had them (and only those are looked at), and the
number of open segment files stays within ``--max-open-files`` however many streams are touched.

Small here (a few hundred streams); the figures at 100,000 come from ``bench/scale_bench.py``.
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest
import requests

from durastream_server.sizes import parse_byte_size
from durastream_server.storage.datadir import _RECOVERY_BATCH
from durastream_server.storage.recovery import Quarantine, Recovered, recover_batch
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

JSON = "application/json"


def _create_with_one_message(server: ServerProcess, paths: list[str]) -> None:
    def one(path: str) -> None:
        url = server.stream_url(path)
        assert requests.put(url, headers={"Content-Type": JSON}, timeout=30).status_code == 201
        posted = requests.post(
            url, data=f'{{"path":"{path}"}}', headers={"Content-Type": JSON}, timeout=30
        )
        assert posted.status_code in (200, 204), posted.text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, paths))


def _segment_fds(pid: int) -> int:
    """Open fds of ``pid`` that point at segment files."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.endswith(".seg"):
            count += 1
    return count


def test_every_stream_and_staged_handle_survives_sigkill_across_recovery_batches(
    server_factory,
) -> None:
    server = server_factory()
    # More streams than one recovery batch, so start-up recovers several batches.
    paths = [f"many/s{i:04d}" for i in range(_RECOVERY_BATCH + 44)]
    _create_with_one_message(server, paths)
    staged = paths[:: len(paths) // 3][:3]
    for path in staged:
        response = requests.post(
            server.stream_url(path),
            data=b'[{"staged":true}]',
            headers={"Content-Type": JSON, "Durastream-Txn": "h1"},
            timeout=30,
        )
        assert response.status_code == 200, response.text

    server.kill()
    server.restart()

    for path in paths:
        response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=30)
        assert response.status_code == 200, (path, response.text)
        assert response.json() == [{"path": path}], path
    for path in staged:
        done = requests.post(
            server.stream_url(path),
            headers={
                "Durastream-Commit": "h1",
                "Producer-Id": "c",
                "Producer-Epoch": "0",
                "Producer-Seq": "0",
            },
            timeout=30,
        )
        assert done.status_code == 200, (path, done.text)
        read = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=30)
        assert read.json() == [{"path": path}, {"staged": True}]
    listing = requests.get(
        f"{server.base_url}/v1/stream/__ds/x-durastream/streams",
        params={"pattern": "many/*", "limit": "1000"},
        timeout=30,
    )
    assert listing.status_code == 200, listing.text
    assert len(listing.json()["streams"]) == len(paths)


def test_recover_batch_quarantines_what_cannot_be_read_and_recovers_the_rest(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory(extra_args=("--no-packed-appends",))  # directories to damage
    _create_with_one_message(server, ["batch/a", "batch/b"])
    server.stop()
    streams = server.data_dir / "streams"
    ids = sorted(os.listdir(streams))
    (streams / "0-not-a-directory").write_bytes(b"x")
    results = recover_batch(str(streams), ["0-not-a-directory", *ids], 64 * 1024, sync=False)
    assert isinstance(results[0], Quarantine)
    assert results[0].reason == "not a stream directory"
    recovered = results[1:]
    assert all(isinstance(r, Recovered) for r in recovered)
    assert sorted(r.header.path for r in recovered) == ["batch/a", "batch/b"]  # type: ignore[union-attr]
    assert not any(r.has_staging for r in recovered)  # type: ignore[union-attr]


def test_open_segment_files_stay_within_max_open_files(server_factory) -> None:
    limit = 8
    # Directories (segment files to keep open): packed streams open none of their own.
    server = server_factory(extra_args=["--max-open-files", str(limit), "--no-packed-appends"])
    paths = [f"fds/s{i:03d}" for i in range(60)]
    _create_with_one_message(server, paths)
    for path in paths:  # every stream's segment is read, after every one was written
        response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=30)
        assert response.json() == [{"path": path}]
    # Segments written in the current WAL generation stay open until its checkpoint (at most a
    # quarter of the limit per generation, or a second of quiet): the bound holds once that ran. The
    # checkpoint syncs each segment and directory first, which a disk busy with a whole test suite
    # (CI: 2 cores) stretched past 30 s once: the deadline is generous, the bound is what is tested.
    poll_until(
        lambda: _segment_fds(server.pid) <= limit,
        timeout=120,
        what=f"fds within the limit of {limit} (segment fds when the wait began: {_segment_fds(server.pid)})",
    )
    server.kill()
    server.restart()
    for path in paths:
        response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=30)
        assert response.status_code == 200
    assert _segment_fds(server.pid) <= limit


def test_max_open_files_must_be_positive(tmp_path: Path, capsys) -> None:
    from durastream_server.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--data-dir", str(tmp_path / "d"), "--max-open-files", "0"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--max-open-files" in error and "positive integer" in error and "'0'" in error


@pytest.mark.parametrize("value", ["67108865", "128m"])
def test_a_packed_threshold_beyond_the_segment_size_is_refused(
    tmp_path: Path, capsys, value: str
) -> None:
    """``--packed-threshold`` goes from 0 to the segment size (64 MiB): beyond it refused, naming the
    option, the value and the range, before anything is made."""
    from durastream_server.cli import main

    code = main(["--data-dir", str(tmp_path / "d"), "--packed-threshold", value, "--port", "0"])
    assert code == 2
    error = capsys.readouterr().err
    assert "--packed-threshold" in error and "0..67108864" in error
    assert str(parse_byte_size(value)) in error
    assert not (tmp_path / "d").exists()


def test_a_packed_threshold_that_is_not_a_size_is_refused(tmp_path: Path, capsys) -> None:
    from durastream_server.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--data-dir", str(tmp_path / "d"), "--packed-threshold", "-1"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--packed-threshold" in error and "'-1'" in error


@pytest.mark.parametrize(
    ("argv", "environ", "packed"),
    [
        ([], {}, True),  # the default with fsync durability
        (["--durability", "none"], {}, False),  # no write-ahead log: off, not refused
        (["--no-packed-appends"], {}, False),
        (["--packed-appends"], {}, True),
        ([], {"DURASTREAM_PACKED_APPENDS": "false"}, False),
        (["--durability", "none"], {"DURASTREAM_PACKED_APPENDS": "false"}, False),
    ],
)
def test_packed_appends_default_on_with_fsync_durability_only(
    argv: list[str], environ: dict[str, str], packed: bool
) -> None:
    """Decision 0010: packed appends are the default where they can work (fsync durability), off
    with ``--durability none`` without a refusal, and ``--no-packed-appends`` (or the variable) turns
    them off; what the server is given is a plain bool."""
    from durastream_server.cli import build_parser, config_from_args, parse_args

    config = config_from_args(parse_args(build_parser(), argv, environ))
    assert config.packed_appends is packed


def test_packed_appends_without_fsync_durability_is_refused(tmp_path: Path, capsys) -> None:
    """``--packed-appends`` with ``--durability none`` would pack nothing (there is no write-ahead
    log): refused, naming both options and the value, instead of silently ignored."""
    from durastream_server.cli import main

    code = main(
        [
            "--data-dir",
            str(tmp_path / "d"),
            "--packed-appends",
            "--durability",
            "none",
            "--port",
            "0",
        ]
    )
    assert code == 2
    error = capsys.readouterr().err
    assert "--packed-appends" in error and "--durability fsync" in error and "none" in error
    assert not (tmp_path / "d").exists()  # refused before anything was made
