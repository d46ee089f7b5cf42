"""``durastream-server check`` and ``inspect`` on directories written by a real server: a clean directory
passes, damage injected into each file kind is found (exit 1), repairs the server makes by itself do not
fail the check, a directory a live server holds is refused, and ``inspect`` shows what the server said.
Damage is injected into copies of the clean directory, as an operator would check a copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from durastream_server.storage.snapshot import (
    IndexImage,
    capture,
    decode_snapshot,
    encode_snapshot,
)
from tests.support.server_process import ServerProcess

TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}


def run(command: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durastream_server", command, "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def check_json(data_dir: Path, *args: str) -> tuple[int, dict]:
    result = run("check", data_dir, "--json", *args)
    return result.returncode, json.loads(result.stdout)


def producer(pid: str, epoch: int, seq: int) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


def fill(server: ServerProcess) -> dict[str, dict]:
    """Streams of every kind the checker reads; returns what the server said about each."""
    seen: dict[str, dict] = {}
    orders = server.stream_url("tenant/orders")
    assert requests.put(orders, headers=TEXT, timeout=10).status_code == 201
    session = requests.Session()
    for seq in range(300):  # enough for the shutdown to write a snapshot (datadir._close_log)
        answer = session.post(
            orders, data=b"order-%03d" % seq, headers={**TEXT, **producer("p1", 3, seq)}, timeout=10
        )
        assert answer.ok, answer.text
    requests.post(orders, data=b"late", headers={**TEXT, **producer("p2", 0, 0)}, timeout=10)
    events = server.stream_url("tenant/events")
    requests.put(events, headers={**JSON, "Stream-TTL": "3600"}, timeout=10)
    requests.post(events, data=b'[{"a":1},{"a":2}]', headers=JSON, timeout=10)
    requests.post(events, headers={"Stream-Closed": "true"}, timeout=10)
    staged = server.stream_url("tenant/staged")
    requests.put(staged, headers=TEXT, timeout=10)
    for part in (b"one", b"two", b"three"):
        answer = requests.post(
            staged, data=part, headers={**TEXT, "Durastream-Txn": "job-1.task-0"}, timeout=10
        )
        assert answer.status_code == 200, answer.text
    requests.put(server.stream_url("wake/pool"), headers=JSON, timeout=10)
    subscription = requests.put(
        server.stream_url("__ds/subscriptions/sub-1"),
        data=json.dumps({"type": "pull-wake", "pattern": "tenant/*", "wake_stream": "wake/pool"}),
        headers=JSON,
        timeout=10,
    )
    assert subscription.status_code == 201, subscription.text
    for path in ("tenant/orders", "tenant/events", "tenant/staged", "wake/pool"):
        head = requests.head(server.stream_url(path), timeout=10)
        seen[path] = {
            "offset": head.headers["Stream-Next-Offset"],
            "closed": head.headers.get("Stream-Closed") == "true",
            "content_type": head.headers["Content-Type"],
        }
    return seen


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    """A data directory a real server wrote and shut down cleanly (so with snapshots): a directory per
    stream (``--no-packed-appends``), whose file kinds the damage tests below hit."""
    root = tmp_path_factory.mktemp("check-clean")
    server = ServerProcess(root / "data", extra_args=("--no-packed-appends",))
    server.start()
    try:
        seen = fill(server)
        live = run("check", server.data_dir)
        assert live.returncode == 2 and "held by a running server" in live.stderr
        assert "--force" in live.stderr
        inspected_live = json.loads(run("inspect", server.data_dir, "--json").stdout)
    finally:
        assert server.terminate() == 0
    seen["__live_inspect__"] = inspected_live
    return server.data_dir, seen


def copy_of(clean_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(clean_dir, copy)
    return copy


def stream_dir(data_dir: Path, path: str) -> Path:
    for directory in (data_dir / "streams").iterdir():
        segment = directory / ("0" * 20 + ".seg")
        if (
            f'"{path}"'.encode() in segment.read_bytes()[:4096]
            or path.encode() in (segment.read_bytes()[:4096])
        ):
            return directory
    raise AssertionError(f"no stream directory for {path}")


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_clean_directory_passes(clean) -> None:
    data_dir, _ = clean
    code, report = check_json(data_dir)
    assert code == 0 and not report["damaged"], report
    by_path = {stream["path"]: stream for stream in report["streams"]}
    assert set(by_path) == {"tenant/orders", "tenant/events", "tenant/staged", "wake/pool"}
    assert all(stream["status"] == "ok" for stream in by_path.values())
    assert by_path["tenant/orders"]["snapshot"] == "ok"  # written at the graceful shutdown
    assert by_path["tenant/staged"]["staged_handles"] == 1
    assert by_path["tenant/staged"]["staged_bytes"] == len(b"onetwothree")
    assert report["subscriptions"] == 1 and report["quarantined"] == []
    text = run("check", data_dir)
    assert text.returncode == 0 and "checked 4 streams, 1 subscriptions" in text.stdout


def _inspected_as_seen(document: dict, seen: dict[str, dict]) -> None:
    by_path = {stream["path"]: stream for stream in document["streams"]}
    for path in ("tenant/orders", "tenant/events", "tenant/staged", "wake/pool"):
        assert by_path[path]["tail_offset"] == seen[path]["offset"], path
        assert by_path[path]["closed"] == seen[path]["closed"], path
        assert by_path[path]["content_type"] == seen[path]["content_type"].split(";")[0], path
    orders = by_path["tenant/orders"]
    assert orders["producers"] == {
        "p1": {"epoch": 3, "last_seq": 299},
        "p2": {"epoch": 0, "last_seq": 0},
    }
    assert orders["messages"] == 301
    assert by_path["tenant/events"]["ttl_seconds"] == 3600


def test_inspect_shows_what_the_server_said(clean) -> None:
    data_dir, seen = clean
    for document in (
        json.loads(run("inspect", data_dir, "--json").stdout),
        seen["__live_inspect__"],
    ):
        _inspected_as_seen(document, seen)
    one = run("inspect", data_dir, "tenant/orders")
    assert one.returncode == 0
    assert "p1: epoch 3, last seq 299" in one.stdout and "tenant/events" not in one.stdout
    missing = run("inspect", data_dir, "no/such")
    assert missing.returncode == 1 and "no stream at path 'no/such'" in missing.stderr


def test_check_and_inspect_of_packed_streams_show_what_the_server_said(tmp_path: Path) -> None:
    """With packed appends (the default) the small streams have no directory: ``check`` passes and
    ``inspect`` folds their packed records to the same tail, closure, messages and producers."""
    server = ServerProcess(tmp_path / "data")
    server.start()
    try:
        seen = fill(server)
    finally:
        assert server.terminate() == 0
    packed = {d.name for d in (server.data_dir / "streams").iterdir()}
    assert len(packed) == 1  # tenant/staged's staged appends gave it one; the others are packed
    code, report = check_json(server.data_dir)
    assert code == 0 and not report["damaged"], report
    assert {stream["path"] for stream in report["streams"]} == {
        "tenant/orders",
        "tenant/events",
        "tenant/staged",
        "wake/pool",
    }
    _inspected_as_seen(json.loads(run("inspect", server.data_dir, "--json").stdout), seen)


def _damage_record(data_dir: Path) -> str:
    segment = stream_dir(data_dir, "tenant/orders") / ("0" * 20 + ".seg")
    flip(segment, segment.stat().st_size // 2)  # mid-file: valid records follow
    (stream_dir(data_dir, "tenant/orders") / "snapshot").unlink()  # so the full replay decides
    return "record"


def _damage_header(data_dir: Path) -> str:
    flip(stream_dir(data_dir, "tenant/events") / ("0" * 20 + ".seg"), 12)
    return "header"


def _damage_missing_segment(data_dir: Path) -> str:
    (stream_dir(data_dir, "tenant/staged") / ("0" * 20 + ".seg")).unlink()
    return "segment"


def _damage_pack(data_dir: Path) -> str:
    """wake/pool was never written: it is a packed create, in a pack (storage/packs.py)."""
    [pack] = (data_dir / "packs").glob("*.pack")
    flip(pack, pack.read_bytes().index(b"wake/pool"))
    return "pack"


def _damage_snapshot(data_dir: Path) -> str:
    snapshot = stream_dir(data_dir, "tenant/orders") / "snapshot"
    flip(snapshot, snapshot.stat().st_size - 3)
    return "snapshot"


def _damage_index(data_dir: Path) -> str:
    """A snapshot that decodes and lines up, whose index points one record too late: only the index
    comparison can find it."""
    path = stream_dir(data_dir, "tenant/orders") / "snapshot"
    snapshot = decode_snapshot(path.read_bytes())
    snapshot.index.ordinals[-1] += 1
    path.write_bytes(
        encode_snapshot(
            snapshot.log_id,
            snapshot.covered_end,
            snapshot.last_record,
            capture(snapshot.state),
            IndexImage.of(snapshot.index),
        )
    )
    return "index"


def _damage_staging(data_dir: Path) -> str:
    (staging,) = (stream_dir(data_dir, "tenant/staged") / "txn").glob("*.stg")
    flip(staging, staging.stat().st_size - 60)  # inside the second of three records
    return "staging"


def _damage_subscription(data_dir: Path) -> str:
    (state,) = (data_dir / "meta" / "subscriptions" / "subscriptions").glob("*.json")
    state.write_bytes(state.read_bytes()[:-5])
    return "subscription"


@pytest.mark.parametrize(
    "damage",
    [
        _damage_record,
        _damage_header,
        _damage_missing_segment,
        _damage_pack,
        _damage_snapshot,
        _damage_index,
        _damage_staging,
        _damage_subscription,
    ],
)
def test_damage_in_each_file_kind_is_found(clean, tmp_path: Path, damage) -> None:
    data_dir = copy_of(clean[0], tmp_path)
    kind = damage(data_dir)
    code, report = check_json(data_dir)
    assert code == 1 and report["damaged"]
    findings = [*report["findings"]] + [f for s in report["streams"] for f in s["findings"]]
    assert any(f["severity"] == "damage" and f["kind"] == kind for f in findings), findings
    text = run("check", data_dir)
    assert text.returncode == 1 and "DAMAGE FOUND" in text.stdout


def test_a_torn_tail_is_repairable_not_damage(clean, tmp_path: Path) -> None:
    data_dir = copy_of(clean[0], tmp_path)
    segment = stream_dir(data_dir, "tenant/orders") / ("0" * 20 + ".seg")
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 7)  # a crash mid-write of the last record
    (stream_dir(data_dir, "tenant/orders") / "snapshot").unlink()
    before = segment.stat().st_size
    code, report = check_json(data_dir)
    assert code == 0 and not report["damaged"]
    (orders,) = [s for s in report["streams"] if s["path"] == "tenant/orders"]
    assert orders["status"] == "repairable"
    assert "torn tail" in orders["findings"][0]["message"]
    assert segment.stat().st_size == before  # read-only: the server repairs it, not the check


def test_force_reads_a_directory_whose_lock_is_held(server_factory) -> None:
    server = server_factory()
    requests.put(server.stream_url("forced"), headers=TEXT, timeout=10)
    assert run("check", server.data_dir).returncode == 2
    forced = run("check", server.data_dir, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "checked 1 streams" in forced.stdout
    not_a_dir = run("check", server.data_dir / "streams")
    assert not_a_dir.returncode == 2 and "not a durastream data directory" in not_a_dir.stderr
    assert os.path.exists(server.data_dir / "LOCK")


def test_inspect_given_the_data_directory_as_its_stream_says_what_was_meant(tmp_path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "streams").mkdir(parents=True)
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    result = run("inspect", elsewhere, str(data_dir))
    assert result.returncode == 2
    assert f"did you mean --data-dir {data_dir}?" in result.stderr
    plain = run("inspect", elsewhere, "tenant/orders")
    assert plain.returncode == 2 and "did you mean" not in plain.stderr
