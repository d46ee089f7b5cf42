"""SIGKILL, restart, and use streams at once: the server serves while it recovers (engine/recovery.py).

Each request for a stream not recovered yet recovers that stream first; listing waits for every stream.
The checks hold whatever the recovery's pace (the server may have finished before the first request):
every stream reads back exactly its acknowledged data, appends right after the restart land once, and
every create acknowledged before a kill exists after it, also when the kill lands during the background
recovery itself.
"""

from __future__ import annotations

import concurrent.futures
import random

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http import poll_until

TEXT = "text/plain"
STREAMS = 120


def _create_all(server, first: int, count: int) -> dict[str, bytes]:
    def one(i: int) -> tuple[str, bytes]:
        path = f"lazy/s{i:04d}"
        body = f"<{i}>".encode()
        created = requests.put(
            server.stream_url(path), data=body, headers={"Content-Type": TEXT}, timeout=30
        )
        assert created.status_code == 201, created.text
        return path, body

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return dict(pool.map(one, range(first, first + count)))


def _read(server, path: str) -> bytes:
    response = requests.get(server.stream_url(path), params={"offset": "-1"}, timeout=60)
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.content


def _metrics(server) -> dict[str, float]:
    response = requests.get(server.base_url + "/metrics", timeout=30)
    assert response.status_code == 200, response.text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if not sample.labels
    }


def test_streams_are_served_while_the_server_recovers(server_factory) -> None:
    server = server_factory()
    expected = _create_all(server, 0, STREAMS)
    source = next(iter(expected))
    fork = requests.put(
        server.stream_url("lazy/fork"),
        headers={"Stream-Forked-From": f"/v1/stream/{source}"},
        timeout=30,
    )
    assert fork.status_code == 201
    expected["lazy/fork"] = expected[source]
    server.kill()

    server.restart(recovered=False)
    health = server.health()
    assert "recovering" in health and "streams_pending" in health
    # /metrics answers at once during recovery (the partial figures: test_metrics_while_recovering).
    during = _metrics(server)
    assert during["durastream_streams_pending"] >= 0
    assert during["durastream_recovering"] in (0, 1)
    order = list(expected)
    random.Random(17).shuffle(order)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = dict(zip(order, pool.map(lambda p: _read(server, p), order), strict=True))
    assert got == expected

    # Appends and a delete right after a second restart, in another order.
    server.kill()
    server.restart(recovered=False)
    random.Random(18).shuffle(order)
    for path in order[:40]:
        answer = requests.post(
            server.stream_url(path),
            data=b"+",
            headers={
                "Content-Type": TEXT,
                "Producer-Id": "p",
                "Producer-Epoch": "0",
                "Producer-Seq": "0",
            },
            timeout=60,
        )
        assert answer.status_code in (200, 204), answer.text
        expected[path] += b"+"
    deleted = requests.delete(server.stream_url(source), timeout=60)
    assert deleted.status_code == 204
    del expected[source]
    assert _read(server, "lazy/fork") == expected["lazy/fork"]  # the fork still reads its source
    listing = requests.get(
        server.base_url + "/v1/stream/__ds/x-durastream/streams",
        params={"pattern": "lazy/*", "limit": "1000"},
        timeout=60,
    )
    assert listing.status_code == 200
    assert sorted(s["path"] for s in listing.json()["streams"]) == sorted(expected)
    poll_until(lambda: not server.health()["recovering"], "recovery to finish", timeout=60)
    assert server.health()["streams_pending"] == 0
    after = _metrics(server)
    assert after["durastream_streams_pending"] == 0 and after["durastream_recovering"] == 0

    server.kill()
    server.restart()
    assert {p: _read(server, p) for p in expected} == expected
    assert requests.head(server.stream_url(source), timeout=30).status_code in (404, 410)


def test_sigkill_during_background_recovery_loses_nothing(server_factory) -> None:
    server = server_factory()
    expected = _create_all(server, 0, STREAMS)
    server.kill()
    for _ in range(3):
        # Killed as soon as it answers: the background recovery is under way, or done.
        server.restart(recovered=False)
        more = _create_all(server, len(expected), 5)  # acknowledged creates during recovery
        expected.update(more)
        server.kill()
    server.restart(recovered=False)
    assert {p: _read(server, p) for p in expected} == expected
