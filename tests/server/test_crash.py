"""SIGKILL a real server in the middle of concurrent producer appends, restart it, and check the log.

Every acknowledged append must be present exactly once; an unacknowledged one at most once; retried tuples
get 204 (or 200 if the first attempt never reached the disk); closure survives; offsets keep increasing.
"""

from __future__ import annotations

import concurrent.futures
import threading

import requests

from durastream_server.offsets import parse_position

JSON = "application/json"


def _producer_loop(url: str, pid: str, stop: threading.Event, acked: list, unacked: list) -> None:
    seq = 0
    while not stop.is_set():
        body = f'{{"p":"{pid}","seq":{seq}}}'
        headers = {
            "Content-Type": JSON,
            "Producer-Id": pid,
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
        }
        try:
            response = requests.post(url, data=body, headers=headers, timeout=10)
        except requests.RequestException:
            unacked.append((pid, seq, body))
            return
        if response.status_code != 200:
            unacked.append((pid, seq, body))
            return
        acked.append((pid, seq, body))
        seq += 1


def test_sigkill_during_concurrent_producer_appends(server_factory) -> None:
    server = server_factory()
    url = server.stream_url("crash/producers")
    assert requests.put(url, headers={"Content-Type": JSON}).status_code == 201
    tails = []
    for _ in range(
        3
    ):  # three kill/restart rounds on the same stream, with fresh producers each round
        acked: list = []
        unacked: list = []
        stop = threading.Event()
        round_ = len(tails)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [
                pool.submit(_producer_loop, url, f"r{round_}p{i}", stop, acked, unacked)
                for i in range(8)
            ]
            deadline_count = 200 * (round_ + 1)
            while len(acked) < deadline_count // (round_ + 1) and not all(
                f.done() for f in futures
            ):
                threading.Event().wait(0.01)
            server.kill()
            stop.set()
            for future in futures:
                future.result()
        server.restart()

        for pid, seq, body in acked[-20:]:
            retry = requests.post(
                url,
                data=body,
                headers={
                    "Content-Type": JSON,
                    "Producer-Id": pid,
                    "Producer-Epoch": "0",
                    "Producer-Seq": str(seq),
                },
            )
            assert retry.status_code == 204, (pid, seq, retry.status_code)
        for pid, seq, body in unacked:
            retry = requests.post(
                url,
                data=body,
                headers={
                    "Content-Type": JSON,
                    "Producer-Id": pid,
                    "Producer-Epoch": "0",
                    "Producer-Seq": str(seq),
                },
            )
            assert retry.status_code in (200, 204), (pid, seq, retry.status_code, retry.text)

        messages = _read_all_messages(url)
        keys = [(m["p"], m["seq"]) for m in messages]
        assert len(keys) == len(set(keys)), "duplicate message after crash"
        present = set(keys)
        for pid, seq, _ in acked + unacked:
            assert (pid, seq) in present, f"acknowledged or retried {(pid, seq)} lost"
        for pid in {k[0] for k in keys}:
            seqs = [s for p, s in keys if p == pid]
            assert seqs == sorted(seqs) == list(range(len(seqs))), pid
        tail = requests.head(url).headers["Stream-Next-Offset"]
        assert not tails or parse_position(tail) > parse_position(tails[-1])
        tails.append(tail)

    closing = requests.post(url, headers={"Stream-Closed": "true"})
    assert closing.status_code == 204
    server.kill()
    server.restart()
    head = requests.head(url)
    assert head.headers["Stream-Closed"] == "true"
    assert head.headers["Stream-Next-Offset"] == closing.headers["Stream-Next-Offset"]


def _read_all_messages(url: str) -> list[dict]:
    messages: list[dict] = []
    offset = "-1"
    while True:
        response = requests.get(url, params={"offset": offset})
        assert response.status_code == 200
        batch = response.json()
        messages.extend(batch)
        next_offset = response.headers["Stream-Next-Offset"]
        if response.headers.get("Stream-Up-To-Date") == "true":
            return messages
        assert parse_position(next_offset) > parse_position(offset) if offset != "-1" else True
        offset = next_offset
