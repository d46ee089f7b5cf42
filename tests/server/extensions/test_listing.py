"""Listing: ``GET {root}/__ds/x-durastream/streams`` (docs/extensions.md, 4)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import requests

from tests.server.extensions.support import JSON, TIMEOUT, append, create, error_code
from tests.support.server_process import ServerProcess


def listing(server: ServerProcess, **params: object) -> dict:
    response = requests.get(
        server.base_url + "/v1/stream/__ds/x-durastream/streams", params=params, timeout=TIMEOUT
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    return response.json()


def all_pages(server: ServerProcess, **params: object) -> tuple[list[str], int]:
    paths: list[str] = []
    pages = 0
    after = None
    while True:
        page = listing(server, **params, **({"after": after} if after is not None else {}))
        pages += 1
        paths += [item["path"] for item in page["streams"]]
        if page["next"] is None:
            return paths, pages
        # The last stream listed, or a path after it that the page examined without listing it.
        assert after is None or page["next"] > after
        assert not page["streams"] or page["next"] >= page["streams"][-1]["path"]
        after = page["next"]


@pytest.fixture
def tree(durastream_server: ServerProcess) -> str:
    root = f"list-{uuid.uuid4().hex[:8]}"
    for path in ("a", "b/x", "b/y", "b/y/z", "c", "events/2024/01", "events/2024/02", "events/x"):
        create(durastream_server, f"{root}/{path}", b"[]" if "events" in path else b"")
    return root


def test_entries_and_prefix(durastream_server: ServerProcess, tree: str) -> None:
    append(durastream_server, f"{tree}/c", b'["one"]')
    append(durastream_server, f"{tree}/c", b"", close=True)
    page = listing(durastream_server, prefix=f"{tree}/")
    assert [item["path"] for item in page["streams"]] == [
        f"{tree}/{p}"
        for p in ("a", "b/x", "b/y", "b/y/z", "c", "events/2024/01", "events/2024/02", "events/x")
    ]
    assert page["next"] is None
    by_path = {item["path"]: item for item in page["streams"]}
    assert by_path[f"{tree}/c"] == {
        "path": f"{tree}/c",
        "content_type": JSON,
        "next_offset": f"{0:016d}_{5:016d}",
        "closed": True,
    }
    assert by_path[f"{tree}/a"]["closed"] is False


def test_the_page_is_the_bytes_json_dumps_gives(durastream_server: ServerProcess) -> None:
    """The page is encoded by msgspec from the engine's entries (no dict a stream); its bytes are
    those ``json.dumps`` gave, also for text JSON must escape or may leave as it is."""
    root = f"list-bytes-{uuid.uuid4().hex[:8]}"
    odd = {
        f"{root}/caf\u00e9-\u65e5\u672c": "text/plain; charset=utf-8",
        f"{root}/q'uote\\back": 'application/x-thing; name="a\\b"',
        f"{root}/plain": JSON,
    }
    for path, content_type in odd.items():
        create(durastream_server, path, b"", content_type=content_type)
    append(durastream_server, f"{root}/plain", b'["x"]', close=True)
    response = requests.get(
        durastream_server.base_url + "/v1/stream/__ds/x-durastream/streams",
        params={"prefix": f"{root}/"},
        timeout=TIMEOUT,
    )
    assert response.status_code == 200, response.text
    document = json.loads(response.content)
    assert {item["path"]: item["content_type"] for item in document["streams"]} == odd
    assert list(document["streams"][0]) == ["path", "content_type", "next_offset", "closed"]
    expected = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    assert response.content == expected


def test_pagination(durastream_server: ServerProcess, tree: str) -> None:
    everything, _ = all_pages(durastream_server, prefix=f"{tree}/")
    for limit in (1, 2, 3, 7, 8, 9):
        paths, pages = all_pages(durastream_server, prefix=f"{tree}/", limit=limit)
        assert paths == everything
        assert pages == -(-len(everything) // limit)  # no empty trailing page
    first = listing(durastream_server, prefix=f"{tree}/", limit=3)
    assert first["next"] == f"{tree}/b/y" and len(first["streams"]) == 3
    rest = listing(durastream_server, prefix=f"{tree}/", after=first["next"])
    assert rest["streams"][0]["path"] == f"{tree}/b/y/z"


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("*", ["a", "c"]),
        ("b/*", ["b/x", "b/y"]),
        ("b/**", ["b/x", "b/y", "b/y/z"]),
        ("events/*/0*", ["events/2024/01", "events/2024/02"]),
        ("**/z", ["b/y/z"]),
        ("events/x", ["events/x"]),
    ],
)
def test_patterns(
    durastream_server: ServerProcess, tree: str, pattern: str, expected: list[str]
) -> None:
    paths, _ = all_pages(durastream_server, pattern=f"{tree}/{pattern}", limit=2)
    assert paths == [f"{tree}/{p}" for p in expected]


def test_deleted_streams_are_excluded(durastream_server: ServerProcess, tree: str) -> None:
    url = durastream_server.stream_url(f"{tree}/a")
    assert requests.delete(url, timeout=TIMEOUT).status_code == 204
    # a soft-deleted source (kept for its fork) is not listed either
    source = durastream_server.stream_url(f"{tree}/b/x")
    fork = requests.put(
        durastream_server.stream_url(f"{tree}/b/x-fork"),
        headers={"Content-Type": JSON, "Stream-Forked-From": f"/v1/stream/{tree}/b/x"},
        timeout=TIMEOUT,
    )
    assert fork.status_code == 201, fork.text
    assert requests.delete(source, timeout=TIMEOUT).status_code == 204
    assert requests.get(source, timeout=TIMEOUT).status_code == 410
    paths, _ = all_pages(durastream_server, prefix=f"{tree}/")
    assert f"{tree}/a" not in paths and f"{tree}/b/x" not in paths
    assert f"{tree}/b/x-fork" in paths


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "10001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "-5"}, "limit"),
        ({"pattern": ""}, "pattern"),
        ({"pattern": "/abs"}, "pattern"),
        ({"pattern": "a**b"}, "pattern"),
    ],
)
def test_bad_parameters(durastream_server: ServerProcess, params: dict, name: str) -> None:
    response = requests.get(
        durastream_server.base_url + "/v1/stream/__ds/x-durastream/streams",
        params=params,
        timeout=TIMEOUT,
    )
    assert response.status_code == 400
    assert error_code(response) == "INVALID_PARAMETER"
    assert name in response.json()["error"]["message"]


# ---- cost: a page examines at most limit + 1000 paths, whatever the pattern ------------------------

ALLOWANCE = 1000  # http/discovery.py EXAMINE_ALLOWANCE


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own with 1,500 streams: more than one page's allowance of paths."""
    server = ServerProcess(
        tmp_path_factory.mktemp("durastream-listing") / "data",
        extra_args=("--durability", "none"),
    )
    server.start()
    try:
        with requests.Session() as session:
            for n in range(1500):
                url = server.stream_url(f"many/{n:05d}")
                assert session.put(url, timeout=TIMEOUT).status_code == 201
            for path in ("other/x", "other/y/z"):
                assert session.put(server.stream_url(path), timeout=TIMEOUT).status_code == 201
        yield server
    finally:
        server.stop()


def test_a_pattern_that_matches_nothing_answers_a_bounded_page(crowded: ServerProcess) -> None:
    """Before: every such request walked (and sorted) every path; ``next`` was null at once."""
    first = listing(crowded, pattern="**/nomatch", limit=1)
    assert first["streams"] == [] and first["next"] is not None
    examined = sorted(f"many/{n:05d}" for n in range(1500)).index(first["next"]) + 1
    assert examined == 1 + ALLOWANCE  # limit + allowance paths, not 1,502
    paths, pages = all_pages(crowded, pattern="**/nomatch", limit=1)
    assert paths == [] and pages == 2  # 1,502 paths at 1,001 per page


def test_the_patterns_literal_prefix_bounds_the_range(crowded: ServerProcess) -> None:
    page = listing(crowded, pattern="other/**", limit=1)
    assert [item["path"] for item in page["streams"]] == ["other/x"]
    assert page["next"] == "other/x"
    rest = listing(crowded, pattern="other/**", limit=1, after="other/x")
    assert [item["path"] for item in rest["streams"]] == ["other/y/z"] and rest["next"] is None
    # prefix and pattern that no path can satisfy together: nothing, at once
    assert listing(crowded, prefix="many/", pattern="other/*") == {"streams": [], "next": None}
    narrowed = listing(crowded, prefix="oth", pattern="other/*")
    assert [item["path"] for item in narrowed["streams"]] == ["other/x"]


def test_sparse_matches_are_all_found_across_pages(crowded: ServerProcess) -> None:
    paths, pages = all_pages(crowded, pattern="*/*9", limit=10)
    assert paths == [f"many/{n:05d}" for n in range(9, 1500, 10)]
    full = all_pages(crowded, pattern="**", limit=10000)
    assert full == ([f"many/{n:05d}" for n in range(1500)] + ["other/x", "other/y/z"], 1)


def test_a_pattern_built_to_backtrack_answers_at_once(server_factory) -> None:
    """Before: ``*a*a*a*a*a*a*a*b`` became a regex whose backtracking over a 2,000-character segment
    held the event loop for longer than anyone would wait; any token holder could send it."""
    server = server_factory()
    create(server, "redos/" + "a" * 2000)
    create(server, "redos/ab")
    page = listing(server, pattern="redos/" + "*a" * 7 + "*b")
    assert page == {"streams": [], "next": None}
    page = listing(server, pattern="redos/*a*b")
    assert [item["path"] for item in page["streams"]] == ["redos/ab"]
    assert requests.get(server.base_url + "/healthz", timeout=TIMEOUT).status_code == 200
