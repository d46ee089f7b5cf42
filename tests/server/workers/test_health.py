"""``/healthz`` and ``/metrics`` of ``--workers 2`` (``shards/overview.py``): the whole server's, from
whichever worker the connection reaches.

Real workers: each connection may reach either one, so the tests ask until both have answered; a
SIGKILLed worker (its parent stopped, so it is not restarted meanwhile) must make the health 503
naming its shard, and the server healthy again once it is back.
"""

from __future__ import annotations

import json
import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from durastream_server.metrics.shards import (
    UP,
    _NotCanonical,
    _Relabel,
    merged_exposition,
    slow_merged_exposition,
)
from durastream_server.shards.fanout import SHARD_PAGE_HEADER
from durastream_server.shards.overview import whole_health
from tests.server.workers.test_listing import answer_while_a_worker_is_down
from tests.server.workers.test_workers import WORKERS, health_of_each, paths_on_both_shards
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")


def _own(**fields: object) -> dict:
    document = {
        "status": "ok",
        "waiters": 1,
        "recovering": False,
        "streams_pending": 0,
        "packed_streams": 2,
        "packs_bytes": 10,
        "quarantined_count": 1,
        "quarantined": [{"id": "a", "path": "p", "reason": "r", "location": "l"}],
    }
    return document | fields


def test_whole_health_sums_the_shards_and_names_the_one_not_answering() -> None:
    other = _own(waiters=2, recovering=True, quarantined=[])
    status, document = whole_health(0, _own(), {1: (200, json_bytes(other)), 2: None}, 100)
    assert status == 503
    assert (document["status"], document["unhealthy_shards"]) == ("unhealthy", [2])
    assert [entry["index"] for entry in document["shards"]] == [0, 1, 2]
    assert document["shards"][2]["status"] == "unavailable"
    # the sums are of the shards that answered
    assert (document["waiters"], document["packed_streams"], document["recovering"]) == (
        3,
        4,
        True,
    )
    assert [item["shard"] for item in document["quarantined"]] == [0]

    status, document = whole_health(1, _own(), {0: (200, json_bytes(_own()))}, 1)
    assert (status, document["status"], document["unhealthy_shards"]) == (200, "ok", [])
    assert (document["quarantined_count"], len(document["quarantined"])) == (2, 1)


def test_a_draining_or_garbled_shard_is_unhealthy_and_a_draining_receiver_says_draining() -> None:
    answers = {1: (503, json_bytes(_own(status="draining"))), 2: (500, b"<html>")}
    status, document = whole_health(0, _own(), answers, 100)
    assert (status, document["status"], document["unhealthy_shards"]) == (503, "unhealthy", [1, 2])
    assert document["shards"][2] == {"index": 2, "status": "unavailable", "error": "answered 500"}
    status, document = whole_health(0, _own(status="draining"), {1: (200, json_bytes(_own()))}, 9)
    assert (status, document["status"], document["unhealthy_shards"]) == (503, "draining", [0])


def json_bytes(document: dict) -> bytes:
    return json.dumps(document).encode()


@pytest.fixture
def workers(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    return server_factory(extra_args=WORKERS)


def test_healthz_from_either_worker_describes_both_shards(workers: ServerProcess) -> None:
    for path in paths_on_both_shards("health/s", each=2):
        response = requests.put(workers.stream_url(path), headers={"Content-Type": "text/plain"})
        assert response.status_code in (200, 201), response.text
    for index, document in health_of_each(workers).items():
        assert document["shard"]["index"] == index  # the worker that answered
        assert (document["status"], document["unhealthy_shards"]) == ("ok", [])
        shards = document["shards"]
        assert [entry["index"] for entry in shards] == [0, 1]
        assert [entry["shard"]["index"] for entry in shards] == [0, 1]  # each its own counters
        assert all(entry["status"] == "ok" for entry in shards)
        for name in ("waiters", "packed_streams", "packs_bytes", "quarantined_count"):
            assert document[name] == sum(entry[name] for entry in shards), name
        assert all(entry["packed_streams"] >= 2 for entry in shards), shards


def test_the_shard_mark_from_a_client_still_gets_the_whole_server(workers: ServerProcess) -> None:
    for _ in range(4):  # connections reach either worker
        response = requests.get(workers.base_url + "/healthz", headers={SHARD_PAGE_HEADER: "1"})
        assert response.status_code == 200
        assert [entry["index"] for entry in response.json()["shards"]] == [0, 1]


def test_a_dead_worker_makes_healthz_503_naming_its_shard_then_healthy_again(
    workers: ServerProcess,
) -> None:
    response = answer_while_a_worker_is_down(workers, "", {}, url=workers.base_url + "/healthz")
    assert response.status_code == 503, response.text
    document = response.json()
    assert (document["status"], document["unhealthy_shards"]) == ("unhealthy", [1])
    assert document["shard"]["index"] == 0
    assert document["shards"][1]["status"] == "unavailable"
    assert "did not answer" in document["shards"][1]["error"]
    assert document["shards"][0]["status"] == "ok"

    def healthy() -> bool:
        answer = requests.get(workers.base_url + "/healthz", timeout=30)
        return answer.status_code == 200 and answer.json()["unhealthy_shards"] == []

    poll_until(healthy, "the server healthy again", timeout=60)


def _samples(text: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def test_merged_exposition_labels_every_shard_and_marks_the_missing_ones_down() -> None:
    one = b'# HELP x_total Things.\n# TYPE x_total counter\nx_total{route="a"} 2.0\n'
    text = merged_exposition({0: one, 1: one, 2: None, 3: b"not { a metric"}).decode()
    assert text.count("# HELP x_total ") == 1 and text.count("# TYPE x_total counter") == 1
    by_name = {(s.name, s.labels.get("shard")): s for s in _samples(text)}
    assert by_name[("x_total", "0")].labels == {"route": "a", "shard": "0"}
    assert ("x_total", "1") in by_name and ("x_total", "2") not in by_name
    assert [by_name[("durastream_shard_up", str(k))].value for k in range(4)] == [1, 1, 0, 0]


# Texts in generate_latest's exact form: merged line by line, byte for byte as the slow path writes
_CANONICAL = {
    "labels before and after shard, escapes, no labels": (
        b"# HELP a_total Odd \\\\ help\\nacross lines.\n# TYPE a_total counter\n"
        b'a_total{alpha="x\\"y, } # =",zone="b\\\\c\\nd"} 2.0\na_total{route="r"} 1e+06\n'
        b"# HELP g \n# TYPE g gauge\ng NaN\n"
    ),
    "histogram, summary, an empty family, odd values": (
        b'# HELP h Seconds.\n# TYPE h histogram\nh_bucket{le="0.5"} 1.0\nh_bucket{le="+Inf"} 2.0\n'
        b'h_count 2.0\nh_sum 1.5e-07\n# HELP s S.\n# TYPE s summary\ns{quantile="0.5"} -Inf\n'
        b"s_count 3.0\ns_sum 1.2345675e+06\n# HELP e Empty.\n# TYPE e gauge\n"
    ),
    "families of one shard only, another order, one name of two types": (
        b"# HELP g Other help, the first seen is kept.\n# TYPE g gauge\ng 3.0\n"
        b'# HELP only1 One.\n# TYPE only1 gauge\nonly1{tier="t"} 0.0\n'
        b"# HELP h Seconds.\n# TYPE h summary\nh_count 1.0\nh_sum 2.0\n"
    ),
    "nothing": b"",
}
# Texts the parser reads in its own way (or refuses): merged the slow way, whole
_OTHER_FORMS = {
    "labels not sorted": b'# HELP x X.\n# TYPE x gauge\nx{b="1",a="2"} 1.0\n',
    "a value not as floatToGoString writes it": b"# HELP x X.\n# TYPE x gauge\nx 1\n",
    "a timestamp": b"# HELP x X.\n# TYPE x gauge\nx 1.0 1700000000000\n",
    "a shard label already": b'# HELP x X.\n# TYPE x gauge\nx{shard="9"} 1.0\n',
    "an escape generate_latest does not write": b"# HELP x tab\\there.\n# TYPE x gauge\nx 1.0\n",
    "a counter not named _total": b"# HELP x X.\n# TYPE x counter\nx 1.0\n",
    "a sample of another family": b"# HELP x X.\n# TYPE x gauge\ny 1.0\n",
    "two blocks of one family": b"# HELP x X.\n# TYPE x gauge\nx 1.0\n# HELP x X.\n# TYPE x gauge\n",
    "no newline at the end": b"# HELP x X.\n# TYPE x gauge\nx 1.0",
    "spaces and carriage returns": b"# HELP x X. \r\n# TYPE x gauge\r\nx  1.0\n",
    "untyped": b"# HELP x X.\n# TYPE x untyped\nx 1.0\n",
    "empty labels": b"# HELP x X.\n# TYPE x gauge\nx{} 1.0\n",
    "garbage": b"not { a metric",
    "not UTF-8": b"# HELP x \xff.\n# TYPE x gauge\nx 1.0\n",
}


@pytest.mark.parametrize("case", sorted(_CANONICAL))
def test_the_line_merge_writes_what_parsing_and_writing_again_writes(case: str) -> None:
    texts = [
        _CANONICAL[case],
        _CANONICAL["families of one shard only, another order, one name of two types"],
    ]
    for expositions in ({0: texts[0], 1: texts[1]}, {0: texts[1], 1: texts[0], 2: None}):
        relabel = _Relabel()
        for shard, text in expositions.items():
            if text is not None:
                relabel.add(shard, text.decode())  # the fast path takes it (raises otherwise)
        assert merged_exposition(expositions) == slow_merged_exposition(expositions)
    assert list(text_string_to_metric_families(merged_exposition(expositions).decode()))


@pytest.mark.parametrize("case", sorted(_OTHER_FORMS))
def test_texts_of_other_forms_are_merged_the_slow_way(case: str) -> None:
    with pytest.raises((_NotCanonical, UnicodeDecodeError)):
        _Relabel().add(0, _OTHER_FORMS[case].decode())
    expositions = {
        0: _CANONICAL["histogram, summary, an empty family, odd values"],
        1: _OTHER_FORMS[case],
    }
    assert merged_exposition(expositions) == slow_merged_exposition(expositions)


def test_a_real_workers_exposition_merges_byte_for_byte_as_before(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory()  # a one-process server writes what each worker writes for itself
    for path in ("m/a", "m/b"):
        requests.put(server.stream_url(path), headers={"Content-Type": "text/plain"})
        requests.post(server.stream_url(path), data="x", headers={"Content-Type": "text/plain"})
    requests.get(server.stream_url("m/a"), params={"offset": "-1"})
    one = requests.get(server.base_url + "/metrics", timeout=30).content
    two = requests.get(server.base_url + "/metrics", timeout=30).content
    _Relabel().add(0, one.decode())
    for expositions in ({0: one, 1: two}, {0: one, 1: None}, {0: None, 1: two, 2: one}):
        assert merged_exposition(expositions) == slow_merged_exposition(expositions)


def _scrape(server: ServerProcess) -> list[Sample]:
    response = requests.get(server.base_url + "/metrics", timeout=30)
    assert response.status_code == 200, response.text
    text = response.text
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps)), "HELP once per family"
    return _samples(text)


def test_metrics_from_either_worker_hold_both_shards_series(workers: ServerProcess) -> None:
    for path in paths_on_both_shards("metrics/s", each=2):
        response = requests.put(workers.stream_url(path), headers={"Content-Type": "text/plain"})
        assert response.status_code in (200, 201), response.text
    for _ in range(4):  # connections reach either worker
        samples = _scrape(workers)
        assert {s.labels.get("shard") for s in samples} == {"0", "1"}
        values = {
            (s.name, s.labels["shard"]): s.value for s in samples if not s.labels.keys() - {"shard"}
        }
        assert [values[("durastream_shard_up", k)] for k in "01"] == [1, 1]
        assert values[("durastream_streams", "0")] >= 2 and values[("durastream_streams", "1")] >= 2
        assert ("process_resident_memory_bytes", "1") in values


def test_metrics_while_a_worker_is_down_hold_the_others_and_mark_it_down(
    workers: ServerProcess,
) -> None:
    response = answer_while_a_worker_is_down(workers, "", {}, url=workers.base_url + "/metrics")
    assert response.status_code == 200, response.text
    samples = _samples(response.text)
    up = {s.labels["shard"]: s.value for s in samples if s.name == "durastream_shard_up"}
    assert up == {"0": 1, "1": 0}
    assert {s.labels.get("shard") for s in samples if s.name != "durastream_shard_up"} == {"0"}
    poll_until(
        lambda: {s.labels.get("shard") for s in _scrape(workers)} == {"0", "1"},
        "both shards scraped again",
        timeout=60,
    )


def test_with_tokens_every_shard_checks_the_scrapes_token(
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    token = "metrics-token-0123456789"
    server = server_factory(extra_args=(*WORKERS, "--auth-token", f"{token}:read-only:ten/"))
    for _ in range(4):  # connections reach either worker
        assert requests.get(server.base_url + "/metrics", timeout=30).status_code == 401
        response = requests.get(
            server.base_url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert response.status_code == 200, response.text
        up = {s.labels["shard"]: s.value for s in _samples(response.text) if s.name == UP}
        assert up == {"0": 1, "1": 1}  # the token carried to the other worker passed its check
        health = requests.get(server.base_url + "/healthz", timeout=30)  # anonymous, as always
        assert (health.status_code, health.json()["unhealthy_shards"]) == (200, [])
