"""Nothing a client sends can stop the server from starting (issue 14, item 1).

Client timestamps are checked at parse time against a stated range, written so that they always parse
back, and checked before anything reaches the disk. A stream the server cannot use at start-up, whatever
the reason, is quarantined (set aside under ``quarantine/``, logged once, listed by ``/healthz``) while
every other stream is served. Each test SIGKILLs a real server and starts it again on the same directory.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import requests

from durastream_server.storage import codec, wal
from durastream_server.storage.records import StreamHeader
from durastream_server.storage.segments import segment_name
from tests.support.http import poll_until

TEXT = "text/plain"
RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"

# Row 1 of issue 14 and the ends of the range: each answered 201 (and kept) or 400 (and not stored).
ACCEPTED = {
    "0999-12-31T00:00:00Z": "0999-12-31T00:00:00Z",  # was 500, and the server never started again
    "0001-01-01T00:00:00Z": "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00-23:59": "0001-01-01T23:59:00Z",
    "9999-12-31T23:59:59+23:59": "9999-12-31T00:00:59Z",
    "9999-12-31T23:59:59.999999999Z": "9999-12-31T23:59:59.999999Z",
    "2030-01-02T03:04:05.5+05:30": "2030-01-01T21:34:05.500Z",
}
REJECTED = [
    "9999-12-31T23:59:59-23:59",  # year 10000 in UTC: was 500 (OverflowError)
    "0001-01-01T00:00:00+23:59",  # year 0 in UTC: was 500 (OverflowError)
    "0000-01-01T00:00:00Z",
    "10000-01-01T00:00:00Z",
    "999-12-31T00:00:00Z",
    "2030-02-30T00:00:00Z",
    "2030-01-01T24:00:00Z",
    "2030-01-01T00:00:60Z",
    "2030-01-01T00:00:00+24:00",
    "2030-01-01T00:00:00",
    "garbage",
]


def _kill_once_checkpointed(server) -> None:  # noqa: ANN001
    """SIGKILL once the write-ahead log is checkpointed (after 1 s idle): the headers edited below stand
    for damage on disk after their creates were synced; while the WAL still held a create, the restart
    would write its header back (storage/wal.py)."""
    poll_until(
        lambda: not list((server.data_dir / wal.WAL_DIR).glob("*.wal")), "the WAL checkpoint"
    )
    server.kill()


def _stream_dirs(data_dir: Path) -> dict[str, Path]:
    """Stream path -> its directory under ``streams/`` (read from each header record)."""
    found = {}
    for directory in (data_dir / "streams").iterdir():
        try:
            raw = (directory / segment_name(0)).read_bytes()
        except FileNotFoundError:  # deleted meanwhile (an expired stream, by the sweeper)
            continue
        frame = codec.parse_frame(raw[: codec.FRAME_SIZE])
        body = raw[codec.FRAME_SIZE : codec.FRAME_SIZE + frame.body_len]
        found[codec.decode_header(body).path] = directory
    return found


def _write_header(directory: Path, header: StreamHeader | bytes) -> None:
    """Replace an empty stream's log by one header record with a valid checksum (a hand edit)."""
    if isinstance(header, StreamHeader):
        frame = codec.encode_header(header)
    else:
        frame = codec.encode_frame(codec.Kind.HEADER, header)
    (directory / segment_name(0)).write_bytes(bytes(frame))


def test_bad_expiry_times_get_400_and_the_server_starts_again(server_factory) -> None:
    server = server_factory()
    kept = server.stream_url("kept")
    assert requests.put(kept, data=b"hello", headers={"Content-Type": TEXT}).status_code == 201
    for n, value in enumerate(ACCEPTED):
        response = requests.put(
            server.stream_url(f"ok/{n}"), headers={"Content-Type": TEXT, "Stream-Expires-At": value}
        )
        assert response.status_code == 201, (value, response.text)
    for n, value in enumerate(REJECTED):
        response = requests.put(
            server.stream_url(f"bad/{n}"),
            headers={"Content-Type": TEXT, "Stream-Expires-At": value},
        )
        assert response.status_code == 400, (value, response.status_code, response.text)
        message = response.json()["error"]["message"]
        assert "Stream-Expires-At" in message and repr(value) in message and RANGE in message
    for value in ("100000000001", "-1", "1e3"):
        response = requests.put(
            server.stream_url("bad/ttl"), headers={"Content-Type": TEXT, "Stream-TTL": value}
        )
        assert response.status_code == 400, (value, response.text)
        message = response.json()["error"]["message"]
        assert "Stream-TTL" in message and repr(value) in message and "100000000000" in message
    far = requests.put(
        server.stream_url("ok/ttl"), headers={"Content-Type": TEXT, "Stream-TTL": "100000000000"}
    )
    assert far.status_code == 201
    # Validated before anything reached the disk: no directory for a rejected request.
    assert not any(path.startswith("bad/") for path in _stream_dirs(server.data_dir))

    server.kill()
    server.restart()
    assert server.health()["quarantined"] == []
    assert requests.get(kept, params={"offset": "-1"}).content == b"hello"
    for n, text in enumerate(ACCEPTED.values()):
        head = requests.head(server.stream_url(f"ok/{n}"))
        if text >= "2030":
            assert head.headers["Stream-Expires-At"] == text
        else:
            assert head.status_code == 404  # already expired: gone, like any expired stream
    assert requests.head(server.stream_url("ok/ttl")).headers["Stream-TTL"] == "100000000000"


def test_unusable_stream_header_is_quarantined_while_the_others_are_served(
    server_factory,
) -> None:
    # Victims with data and no packed appends: a directory each (a PUT without a body, or with
    # packed appends with a small one, is packed: storage/packs.py).
    server = server_factory(extra_args=("--no-packed-appends",))
    for name in ("good", "victim/expiry", "victim/type", "victim/json"):
        body = b"" if name == "good" else b"x"
        response = requests.put(server.stream_url(name), data=body, headers={"Content-Type": TEXT})
        assert response.status_code == 201
    assert requests.post(server.stream_url("good"), data=b"ok", headers={"Content-Type": TEXT}).ok
    _kill_once_checkpointed(server)
    dirs = _stream_dirs(server.data_dir)
    base = StreamHeader(path="victim/expiry", content_type=TEXT, created_at_ms=1)
    # What main wrote for "0999-12-31T00:00:00Z" (strftime's unpadded year), and two hand edits
    # that still pass the checksum.
    _write_header(
        dirs["victim/expiry"], dataclasses.replace(base, expires_at="999-12-31T00:00:00Z")
    )
    typed = json.dumps({**dataclasses.asdict(base), "path": "victim/type", "content_type": 5})
    _write_header(dirs["victim/type"], typed.encode())
    _write_header(dirs["victim/json"], b'["not", "a", "header"]')

    server.restart()
    assert requests.get(server.stream_url("good"), params={"offset": "-1"}).content == b"ok"
    assert requests.put(server.stream_url("new"), headers={"Content-Type": TEXT}).status_code == 201
    health = requests.get(server.base_url + "/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["quarantined_count"] == 3
    quarantined = {entry["id"]: entry for entry in health.json()["quarantined"]}
    assert set(quarantined) == {dirs[name].name for name in dirs if name.startswith("victim/")}
    expiry = quarantined[dirs["victim/expiry"].name]
    assert expiry["path"] == "victim/expiry" and "999-12-31" in expiry["reason"]
    # The header itself is unreadable; the catalog (storage/catalog.py) still knows the path.
    assert quarantined[dirs["victim/type"].name]["path"] == "victim/type"
    for entry in quarantined.values():
        moved = server.data_dir / entry["location"]
        assert moved.is_dir() and (moved / segment_name(0)).exists()  # set aside, not deleted
        assert not (server.data_dir / "streams" / entry["id"]).exists()
    # The known path answers as quarantined, and cannot be re-created empty.
    head = requests.get(server.stream_url("victim/expiry"))
    assert head.status_code == 500 and head.json()["error"]["code"] == "CORRUPT_STREAM"
    again = requests.put(server.stream_url("victim/expiry"), headers={"Content-Type": TEXT})
    assert again.status_code == 500
    log = server.log_path.read_text()
    assert log.count(f"storage id {dirs['victim/expiry'].name}) quarantined") == 1

    server.kill()
    server.restart()
    assert {entry["id"] for entry in server.health()["quarantined"]} == set(quarantined)
    assert requests.head(server.stream_url("victim/expiry")).status_code == 500
    assert requests.get(server.stream_url("good"), params={"offset": "-1"}).content == b"ok"
    assert requests.head(server.stream_url("new")).status_code == 200


def test_unreadable_staged_append_state_is_quarantined(server_factory) -> None:
    server = server_factory()
    for name in ("good", "victim"):
        assert requests.put(server.stream_url(name), headers={"Content-Type": TEXT}).ok
        staged = requests.post(
            server.stream_url(name),
            data=b"staged",
            headers={"Content-Type": TEXT, "Durastream-Txn": "h1"},
        )
        assert staged.status_code == 200, staged.text
    server.kill()
    txn = _stream_dirs(server.data_dir)["victim"] / "txn"
    (txn / "tombstones").mkdir()  # reading it fails with IsADirectoryError
    server.restart()
    (entry,) = server.health()["quarantined"]
    assert entry["path"] == "victim" and "staged appends" in entry["reason"]
    assert requests.head(server.stream_url("victim")).status_code == 500
    commit = requests.post(
        server.stream_url("good"),
        headers={
            "Durastream-Commit": "h1",
            "Producer-Id": "p",
            "Producer-Epoch": "0",
            "Producer-Seq": "0",
        },
    )
    assert commit.status_code == 200, commit.text
    assert requests.get(server.stream_url("good"), params={"offset": "-1"}).content == b"staged"


@pytest.mark.parametrize("auth", [False, True])
def test_healthz_lists_quarantined_streams_without_paths_when_tokens_are_required(
    server_factory, tmp_path: Path, auth: bool
) -> None:
    args = ["--auth-token", "secret-token-1234"] if auth else []
    # A directory for its stream created with data (packed appends would pack it).
    server = server_factory(extra_args=[*args, "--no-packed-appends"])
    headers = {"Authorization": "Bearer secret-token-1234", "Content-Type": TEXT}
    secret = server.stream_url("tenant-a/secret")
    assert requests.put(secret, data=b"x", headers=headers).status_code == 201
    _kill_once_checkpointed(server)
    directory = _stream_dirs(server.data_dir)["tenant-a/secret"]
    _write_header(
        directory,
        StreamHeader(path="tenant-a/secret", content_type=TEXT, created_at_ms=1, expires_at="x"),
    )
    server.restart()
    health = requests.get(server.base_url + "/healthz")  # no token
    assert health.status_code == 200
    (entry,) = health.json()["quarantined"]
    assert entry["id"] == directory.name
    assert entry["path"] == (None if auth else "tenant-a/secret")
    assert "tenant-a" not in health.text if auth else "tenant-a" in health.text
