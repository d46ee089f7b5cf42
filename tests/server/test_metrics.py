"""``GET /metrics`` against a real server: the output parses with ``prometheus_client``'s own parser, the
counters move by exactly what known requests did, labels stay bounded whatever the number of streams,
and the endpoint is protected like every other one when tokens are configured."""

from __future__ import annotations

import threading

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

TEXT = {"Content-Type": "text/plain"}
RW = "metrics-rw-token-0123456789abcdef"
RO = "metrics-ro-token-0123456789abcdef"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: ServerProcess, headers: dict[str, str] | None = None) -> Samples:
    response = requests.get(server.base_url + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_every_family_parses_with_prometheus_clients_parser(server_factory) -> None:
    server = server_factory()
    samples = scrape(server)
    names = {name for name, _ in samples}
    for expected in (
        "durastream_http_requests_total",
        "durastream_request_duration_seconds_bucket",
        "durastream_long_poll_wake_seconds_count",
        "durastream_http_request_bytes_total",
        "durastream_http_response_bytes_total",
        "durastream_messages_read_total",
        "durastream_messages_written_total",
        "durastream_written_bytes_total",
        "durastream_group_commit_records_bucket",
        "durastream_fsync_seconds_count",
        "durastream_open_long_polls",
        "durastream_open_sse_connections",
        "durastream_streams",
        "durastream_producers",
        "durastream_staged_handles",
        "durastream_staged_bytes",
        "durastream_quarantined_streams",
        "durastream_recovering",
        "durastream_streams_pending",
        "durastream_data_dir_free_bytes",
        "durastream_build_info",
        "process_resident_memory_bytes",
    ):
        assert expected in names, f"{expected} missing from /metrics: {sorted(names)}"
    assert value(samples, "durastream_data_dir_free_bytes") > 0
    # The latency histogram's buckets are cumulative and end with +Inf.
    buckets = sorted(
        (float(dict(labels)["le"]), count)
        for (name, labels), count in samples.items()
        if name == "durastream_request_duration_seconds_bucket"
        and dict(labels)["route"] == "append"
    )
    assert buckets[-1][0] == float("inf")
    assert [count for _, count in buckets] == sorted(count for _, count in buckets)


def test_counters_move_by_what_known_requests_did(server_factory) -> None:
    server = server_factory(long_poll_timeout=20)
    url = server.stream_url("metrics/counted")
    assert requests.put(url, headers=TEXT, timeout=10).status_code == 201
    before = scrape(server)
    bodies = [b"alpha", b"bravo-bravo", b"c"]
    statuses = [
        requests.post(url, data=body, headers=TEXT, timeout=10).status_code for body in bodies
    ]
    read = requests.get(url, params={"offset": "-1"}, timeout=10)
    assert read.status_code == 200 and read.content == b"".join(bodies)
    after = scrape(server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    (status,) = set(statuses)
    assert moved("durastream_http_requests_total", route="append", code=str(status)) == 3
    assert moved("durastream_http_requests_total", route="read", code="200") == 1
    assert moved("durastream_request_duration_seconds_count", route="append") == 3
    assert moved("durastream_request_duration_seconds_count", route="read") == 1
    assert moved("durastream_messages_written_total") == 3
    assert moved("durastream_written_bytes_total") == sum(map(len, bodies))
    assert moved("durastream_http_request_bytes_total") == sum(map(len, bodies))
    assert moved("durastream_messages_read_total") == 3
    assert moved("durastream_http_response_bytes_total") >= len(read.content)
    assert moved("durastream_group_commit_records_count") >= 1  # appends may share a batch
    assert moved("durastream_group_commit_records_sum") == 3  # one record per append
    assert moved("durastream_fsync_seconds_count") >= 1  # --durability fsync is the default
    assert value(after, "durastream_streams") == 1
    # The previous scrape counted itself once it was answered.
    assert moved("durastream_http_requests_total", route="metrics", code="200") == 1

    # A parked long-poll shows as open, and its wake-up is measured once it is answered.
    tail = read.headers["Stream-Next-Offset"]
    answer: dict[str, requests.Response] = {}
    poller = threading.Thread(
        target=lambda: answer.setdefault(
            "poll",
            requests.get(url, params={"offset": tail, "live": "long-poll"}, timeout=30),
        )
    )
    poller.start()
    poll_until(
        lambda: value(scrape(server), "durastream_open_long_polls") == 1, "the long-poll to park"
    )
    requests.post(url, data=b"wake", headers=TEXT, timeout=10)
    poller.join(timeout=30)
    assert answer["poll"].status_code == 200 and answer["poll"].content == b"wake"
    woken = scrape(server)
    assert value(woken, "durastream_open_long_polls") == 0
    assert (
        value(woken, "durastream_long_poll_wake_seconds_count")
        - value(after, "durastream_long_poll_wake_seconds_count")
        == 1
    )
    assert (
        value(woken, "durastream_messages_read_total")
        - value(after, "durastream_messages_read_total")
        == 1
    )
    assert value(woken, "durastream_http_requests_total", route="long_poll", code="200") == 1


def test_labels_stay_bounded_whatever_the_number_of_streams(server_factory) -> None:
    server = server_factory()
    session = requests.Session()
    session.put(server.stream_url("few/0"), headers=TEXT, timeout=10)
    session.post(server.stream_url("few/0"), data=b"x", headers=TEXT, timeout=10)
    few = scrape(server)
    for i in range(1, 150):
        stream = server.stream_url(f"many/{i}")
        session.put(stream, headers=TEXT, timeout=10)
        session.post(stream, data=b"x", headers=TEXT, timeout=10)
        session.get(stream, params={"offset": "-1"}, timeout=10)
    many = scrape(server)
    assert value(many, "durastream_streams") == 150
    # The same series exist: no stream path became a label value.
    assert set(many) == set(few) | {
        key for key in many if key[0] == "durastream_http_requests_total"
    }
    label_values = {v for _, labels in many for _, v in labels}
    assert not any("many" in v or "few" in v for v in label_values)
    assert len(many) < 400


def test_metrics_need_a_token_when_tokens_are_configured(server_factory) -> None:
    server = server_factory(
        extra_args=["--auth-token", RW, "--auth-token", f"{RO}:read-only:tenant"]
    )
    anonymous = requests.get(server.base_url + "/metrics", timeout=10)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"]
    wrong = requests.get(
        server.base_url + "/metrics", headers={"Authorization": "Bearer not-a-token-xxxxxxxxxx"}
    )
    assert wrong.status_code == 401
    # A read-only token, even one limited to a prefix, may read the figures (they name no stream).
    assert value(scrape(server, {"Authorization": f"Bearer {RO}"}), "durastream_streams") == 0
    refused = requests.post(
        server.base_url + "/metrics", headers={"Authorization": f"Bearer {RW}"}, timeout=10
    )
    assert refused.status_code == 405 and refused.headers["Allow"] == "GET, HEAD"
