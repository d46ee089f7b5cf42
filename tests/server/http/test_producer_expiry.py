"""Issue 14 items 5 and 6, over HTTP against the real server: idle producers are forgotten after
``--producer-expiry-seconds``, a request that may repeat one of theirs is 409 ``PRODUCER_FORGOTTEN`` for
a client that sends ``Durastream-Forgotten-Producer: refuse`` (never new data, also across a SIGKILL and
restart), duplicates say whether their digest was compared, and aborts are capped like commits."""

from __future__ import annotations

import pytest
import requests

from durastream_server.cli import build_parser, config_from_args, main
from tests.support.http import poll_until
from tests.support.server_process import FORGET_PRODUCERS_FAST

TEXT = {"Content-Type": "text/plain"}
REFUSE = {"Durastream-Forgotten-Producer": "refuse"}
SHORT = list(FORGET_PRODUCERS_FAST)


def _produce(url: str, body: bytes, producer: tuple[str, int, int], **headers: str):
    pid, epoch, seq = producer
    return requests.post(
        url,
        data=body,
        headers={
            **TEXT,
            "Producer-Id": pid,
            "Producer-Epoch": str(epoch),
            "Producer-Seq": str(seq),
            **headers,
        },
        timeout=10,
    )


def _error_code(response: requests.Response) -> str:
    return response.json()["error"]["code"]


def _refused_once_forgotten(
    url: str, producer: tuple[str, int, int], body: bytes, group_epoch: int | None = None
) -> None:
    """Replay until the server has forgotten the producer: 204 while it remembers, then 409 naming
    the highest epoch its group reached; never 200 (new data)."""

    def forgotten() -> bool:
        response = _produce(url, body, producer, **REFUSE)
        assert response.status_code in (204, 409), (response.status_code, response.text)
        if response.status_code == 409:
            assert _error_code(response) == "PRODUCER_FORGOTTEN"
            # The group's highest forgotten epoch: the producer's own, or a later one once the sweep
            # forgot a newer producer of its group (``group_epoch``); which of the two depends on when
            # the sweep ran, and both refuse the replay.
            allowed = {producer[1]} if group_epoch is None else {producer[1], group_epoch}
            assert int(response.headers["Durastream-Forgotten-Epoch"]) in allowed
            return True
        assert response.headers["Durastream-Digest"] == "match"
        return False

    poll_until(forgotten, "the producer to be forgotten", timeout=20)


def test_a_replay_after_expiry_is_refused_never_new_data(server_factory) -> None:
    server = server_factory(extra_args=SHORT)
    url = server.stream_url("expiry/replay")
    assert requests.put(url, headers=TEXT, timeout=10).status_code == 201
    assert _produce(url, b"batch5;", ("spark-q-0", 5, 0), **REFUSE).status_code == 200
    _refused_once_forgotten(url, ("spark-q-0", 5, 0), b"batch5;")
    # A partition's first write to this stream at a later batch is a new producer: accepted.
    assert _produce(url, b"p7;", ("spark-q-7", 6, 0), **REFUSE).status_code == 200

    server.kill()  # forgetting is not in the log: a restart must not let the replay in either
    server.restart()
    _refused_once_forgotten(url, ("spark-q-0", 5, 0), b"batch5;", group_epoch=6)
    assert requests.get(url, params={"offset": "-1"}, timeout=10).text == "batch5;p7;"


def test_without_the_header_a_forgotten_producer_is_new_as_the_protocol_says(
    server_factory,
) -> None:
    server = server_factory(extra_args=SHORT)
    url = server.stream_url("expiry/plain")
    requests.put(url, headers=TEXT, timeout=10)
    assert _produce(url, b"a", ("p-0", 0, 0)).status_code == 200
    _refused_once_forgotten(url, ("p-0", 0, 0), b"a")
    assert _produce(url, b"a", ("p-0", 0, 0)).status_code == 200  # section 5.2.1: treated as new


def test_forgotten_producer_header_is_checked(durastream_server) -> None:
    url = durastream_server.stream_url("expiry/header-check")
    requests.put(url, headers=TEXT, timeout=10)
    bad = _produce(url, b"x", ("p-0", 0, 0), **{"Durastream-Forgotten-Producer": "maybe"})
    assert bad.status_code == 400 and "Durastream-Forgotten-Producer" in bad.text
    assert "'refuse'" in bad.json()["error"]["message"]
    alone = requests.post(url, data=b"x", headers={**TEXT, **REFUSE}, timeout=10)
    assert alone.status_code == 400 and "producer headers" in alone.json()["error"]["message"]
    assert requests.get(url, params={"offset": "-1"}, timeout=10).text == ""


def test_a_duplicate_says_whether_its_digest_was_compared(durastream_server) -> None:
    url = durastream_server.stream_url("expiry/digest-header")
    requests.put(url, headers=TEXT, timeout=10)
    for seq in range(100):  # more than the 64 seqs the server used to keep
        assert _produce(url, b"r%d" % seq, ("d-0", 0, seq)).status_code == 200
    retry = _produce(url, b"r0", ("d-0", 0, 0))
    assert retry.status_code == 204 and retry.headers["Durastream-Digest"] == "match"
    assert "Durastream-Digest" in retry.headers["Access-Control-Expose-Headers"]
    reordered = _produce(url, b"r1", ("d-0", 0, 0))  # issue 15 item 6: was a silent 204
    assert reordered.status_code == 409
    assert _error_code(reordered) == "DUPLICATE_PAYLOAD_MISMATCH"


def test_an_abort_names_at_most_as_many_handles_as_a_commit(server_factory) -> None:
    server = server_factory(extra_args=["--max-header-bytes", str(1 << 20)])
    url = server.stream_url("expiry/abort-cap")
    requests.put(url, headers=TEXT, timeout=10)
    names = ", ".join(f"h{n}" for n in range(10_001))
    response = requests.post(url, headers={"Durastream-Abort": names}, timeout=10)
    assert response.status_code == 400
    assert "at most 10000 per request" in response.json()["error"]["message"]
    ok = requests.post(url, headers={"Durastream-Abort": "h1, h2"}, timeout=10)
    assert ok.status_code == 204


def test_producer_flags_map_onto_the_policy_and_are_checked(capsys) -> None:
    config = config_from_args(build_parser().parse_args(SHORT))
    assert (
        config.producer_policy.quiet_seconds,
        config.producer_policy.expiry_seconds,
        config.producer_policy.group_expiry_seconds,
    ) == (1, 1, 3600)
    defaults = config_from_args(build_parser().parse_args([])).producer_policy
    assert (defaults.quiet_seconds, defaults.expiry_seconds) == (86400, 604800)
    assert main(["--producer-quiet-seconds", "10", "--producer-expiry-seconds", "5"]) == 2
    assert "must not exceed the producer expiry" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--producer-expiry-seconds", "-1"])
    assert "--producer-expiry-seconds" in capsys.readouterr().err
