"""The change feed over HTTP: ``GET {root}/__ds/x-durastream/changes`` and ``POST .../selections``
(docs/extensions.md, 8)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import requests

from tests.server.extensions.support import TIMEOUT, append, create, error_code
from tests.support.server_process import ServerProcess

NS = "__ds/x-durastream"


def changes(server: ServerProcess, **params: Any) -> dict[str, Any]:
    response = requests.get(server.stream_url(f"{NS}/changes"), params=params, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    return response.json()


def all_changes(server: ServerProcess, **params: Any) -> tuple[dict[str, Any], str, bool]:
    """Follow ``more``: the latest entry per path, the final cursor, and whether it was a reset."""
    seen: dict[str, Any] = {}
    reset = False
    while True:
        page = changes(server, **params)
        reset = reset or page["reset"]
        seen.update({entry["path"]: entry for entry in page["changes"]})
        params["since"] = page["cursor"]
        params.pop("wait", None)
        if not page["more"]:
            return seen, page["cursor"], reset


def register(server: ServerProcess, body: Any) -> requests.Response:
    return requests.post(server.stream_url(f"{NS}/selections"), json=body, timeout=TIMEOUT)


@pytest.fixture
def root(durastream_server: ServerProcess) -> str:
    base = f"chg-{uuid.uuid4().hex[:8]}"
    for name in ("a", "b", "c"):
        create(durastream_server, f"{base}/{name}")
    create(durastream_server, f"{base}-other/x")
    return base


def test_a_snapshot_then_only_what_changed(durastream_server: ServerProcess, root: str) -> None:
    snapshot, cursor, reset = all_changes(durastream_server, pattern=f"{root}/*")
    assert reset and sorted(snapshot) == [f"{root}/a", f"{root}/b", f"{root}/c"]
    assert snapshot[f"{root}/a"] == {
        "path": f"{root}/a",
        "content_type": "application/json",
        "next_offset": "0000000000000000_0000000000000000",
        "closed": False,
    }
    tail = append(durastream_server, f"{root}/b", b"[1,2]")
    append(durastream_server, f"{root}/c", b"", close=True)
    append(durastream_server, f"{root}-other/x", b"[1]")  # not selected
    requests.delete(durastream_server.stream_url(f"{root}/a"), timeout=TIMEOUT)
    create(durastream_server, f"{root}/d")
    moved, cursor2, reset = all_changes(durastream_server, pattern=f"{root}/*", since=cursor)
    assert not reset
    assert moved == {
        f"{root}/a": {"path": f"{root}/a", "deleted": True},
        f"{root}/b": {
            "path": f"{root}/b",
            "content_type": "application/json",
            "next_offset": tail,
            "closed": False,
        },
        f"{root}/c": {**snapshot[f"{root}/c"], "closed": True},
        f"{root}/d": {**snapshot[f"{root}/a"], "path": f"{root}/d"},
    }
    assert all_changes(durastream_server, pattern=f"{root}/*", since=cursor2)[0] == {}


def test_pages_follow_more_to_every_change(durastream_server: ServerProcess, root: str) -> None:
    _, cursor, _ = all_changes(durastream_server, prefix=f"{root}/")
    for name in ("a", "b", "c"):
        append(durastream_server, f"{root}/{name}", b"[1]")
    first = changes(durastream_server, prefix=f"{root}/", since=cursor, limit=2)
    assert len(first["changes"]) == 2 and first["more"]
    second = changes(durastream_server, prefix=f"{root}/", since=first["cursor"], limit=2)
    assert [e["path"] for e in second["changes"]] == [f"{root}/c"] and not second["more"]


def test_a_long_poll_answers_the_first_selected_change(
    durastream_server: ServerProcess, root: str
) -> None:
    _, cursor, _ = all_changes(durastream_server, pattern=f"{root}/*")

    def later() -> None:
        append(durastream_server, f"{root}-other/x", b"[1]")  # does not end the wait
        append(durastream_server, f"{root}/b", b"[1]")

    writer = threading.Timer(0.3, later)
    writer.start()
    try:
        page = changes(durastream_server, pattern=f"{root}/*", since=cursor, wait=30_000)
    finally:
        writer.join()
    assert [entry["path"] for entry in page["changes"]] == [f"{root}/b"]
    # Nothing selected changes: the wait ends empty, with a cursor that skips what it examined.
    idle = changes(durastream_server, pattern=f"{root}/*", since=page["cursor"], wait=200)
    assert idle["changes"] == [] and not idle["more"] and not idle["reset"]


def test_selections_name_explicit_paths(durastream_server: ServerProcess, root: str) -> None:
    response = register(durastream_server, {"streams": [f"{root}/b", f"{root}/a", "missing/x"]})
    assert response.status_code == 200, response.text
    selection = response.json()["selection"]
    assert response.json()["streams"] == 3
    again = register(durastream_server, {"streams": ["missing/x", f"{root}/a", f"{root}/b"]})
    assert again.json()["selection"] == selection  # the same set, the same id
    snapshot, cursor, _ = all_changes(durastream_server, selection=selection)
    assert sorted(snapshot) == [f"{root}/a", f"{root}/b"]
    append(durastream_server, f"{root}/c", b"[1]")
    append(durastream_server, f"{root}/a", b"[1]")
    moved, _, _ = all_changes(durastream_server, selection=selection, since=cursor)
    assert list(moved) == [f"{root}/a"]

    unknown = requests.get(
        durastream_server.stream_url(f"{NS}/changes"), params={"selection": "0" * 32}
    )
    assert unknown.status_code == 404 and error_code(unknown) == "SELECTION_NOT_FOUND"


@pytest.mark.parametrize(
    "body",
    [
        {"streams": []},
        {"streams": "a"},
        {"streams": [1]},
        {"paths": ["a"]},
        ["a"],
        {"streams": [""]},
    ],
)
def test_bad_selections_are_400(durastream_server: ServerProcess, body: Any) -> None:
    response = register(durastream_server, body)
    assert response.status_code == 400 and "streams" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"since": "nocolon"}, "since"),
        ({"since": "abc:-1"}, "since"),
        ({"limit": "0"}, "limit"),
        ({"limit": "10001"}, "limit"),
        ({"wait": "60001"}, "wait"),
        ({"wait": "01"}, "wait"),
        ({"pattern": "a/**b"}, "pattern"),
    ],
)
def test_bad_parameters_are_400_naming_them(
    durastream_server: ServerProcess, params: dict[str, str], named: str
) -> None:
    response = requests.get(
        durastream_server.stream_url(f"{NS}/changes"), params=params, timeout=TIMEOUT
    )
    assert response.status_code == 400 and error_code(response) == "INVALID_PARAMETER"
    assert named in response.json()["error"]["message"]
    twice = requests.get(
        durastream_server.stream_url(f"{NS}/changes") + "?limit=1&limit=2", timeout=TIMEOUT
    )
    assert twice.status_code == 400 and "limit" in twice.json()["error"]["message"]


def test_a_restart_resets_old_cursors_to_a_snapshot(server_factory) -> None:
    server = server_factory()
    create(server, "r/a")
    create(server, "r/b")
    _, cursor, _ = all_changes(server, prefix="r/")
    append(server, "r/a", b"[1]")
    server.kill()
    server.restart()
    snapshot, _, reset = all_changes(server, prefix="r/", since=cursor)
    assert reset and sorted(snapshot) == ["r/a", "r/b"]
    assert snapshot["r/a"]["next_offset"].endswith("1")


def test_a_parked_wait_is_answered_when_the_server_stops(server_factory) -> None:
    server = server_factory()
    create(server, "p/a")
    _, cursor, _ = all_changes(server, prefix="p/")
    answer: dict[str, Any] = {}

    def park() -> None:
        answer["page"] = changes(server, prefix="p/", since=cursor, wait=60_000)

    parked = threading.Thread(target=park)
    parked.start()
    deadline_polls = 0
    while deadline_polls < 500:  # until the request is parked (counted as a waiter by /healthz)
        if requests.get(server.base_url + "/healthz", timeout=TIMEOUT).json()["waiters"] == 1:
            break
        deadline_polls += 1
        threading.Event().wait(0.01)
    server.stop()  # SIGTERM: parked waits answer as at their timeout
    parked.join(timeout=30)
    assert not parked.is_alive() and answer["page"]["changes"] == []
