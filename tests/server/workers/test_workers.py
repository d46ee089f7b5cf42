"""``--workers 2`` (decision 0009, first step): real processes, streams of both shards.

A stream's shard is ``shard_of(path, 2)`` (``shards/layout.py``); each test picks paths of both shards,
so that whichever worker the kernel gives a connection to, some of its requests are forwarded to the
other. Worker processes are the parent's children (``/proc/<pid>/task/<pid>/children``).
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import requests

from durastream_server.shards.layout import shard_of
from tests.support.http import poll_until, sse_events
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker tests read /proc")

TEXT = "text/plain"
WORKERS = ("--workers", "2")


def paths_on_both_shards(prefix: str, each: int = 2) -> list[str]:
    """``each`` fresh stream paths per shard (of 2), alternating shards."""
    found: dict[int, list[str]] = {0: [], 1: []}
    while min(len(v) for v in found.values()) < each:
        path = f"{prefix}-{uuid.uuid4().hex[:10]}"
        found[shard_of(path, 2)].append(path)
    return [p for pair in zip(found[0][:each], found[1][:each], strict=True) for p in pair]


def workers_of(server: ServerProcess) -> list[int]:
    text = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text()
    return sorted(int(pid) for pid in text.split())


def worker_of_shard(server: ServerProcess, index: int) -> int | None:
    """The pid of the worker serving shard ``index`` (its command line ends with the shard flags)."""
    for pid in workers_of(server):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):  # gone, or exiting, since it was listed
            continue
        if (
            b"--shard-index" in args
            and args[args.index(b"--shard-index") + 1] == str(index).encode()
        ):
            return pid
    return None


def health_of_each(server: ServerProcess) -> dict[int, dict]:
    """``/healthz`` as answered by each worker (its ``shard``): new connections until both have."""
    seen: dict[int, dict] = {}

    def both() -> bool:
        document = server.health()
        seen[document["shard"]["index"]] = document
        return len(seen) == 2

    poll_until(both, "both workers answering /healthz", timeout=30)
    return seen


@pytest.fixture
def workers(server_factory) -> ServerProcess:  # type: ignore[no-untyped-def]
    return server_factory(extra_args=WORKERS)


def test_appends_and_reads_through_one_connection(workers: ServerProcess) -> None:
    streams = paths_on_both_shards("one-conn")
    connection = http.client.HTTPConnection(workers.host, workers.port, timeout=30)
    try:
        for path in streams:
            connection.request("PUT", f"/v1/stream/{path}", headers={"Content-Type": TEXT})
            response = connection.getresponse()
            response.read()
            assert response.status == 201, path
        for round_ in range(3):
            for path in streams:
                body = f"{path}:{round_};".encode()
                connection.request(
                    "POST", f"/v1/stream/{path}", body=body, headers={"Content-Type": TEXT}
                )
                response = connection.getresponse()
                response.read()
                assert response.status == 204, (path, response.status)
        for path in streams:
            connection.request("GET", f"/v1/stream/{path}?offset=-1")
            response = connection.getresponse()
            assert response.status == 200
            assert response.read() == b"".join(f"{path}:{r};".encode() for r in range(3))
    finally:
        connection.close()
    forwarded = sum(doc["shard"]["forwarded"] for doc in health_of_each(workers).values())
    assert forwarded > 0  # the one connection reached one worker: the other shard's were forwarded


def test_appends_and_reads_through_many_connections(workers: ServerProcess) -> None:
    streams = paths_on_both_shards("many-conn", each=4)
    for path in streams:
        assert requests.put(workers.stream_url(path), headers={"Content-Type": TEXT}).ok

    def append(path: str, n: int) -> int:
        body = f"{n};".encode()
        url = workers.stream_url(path)
        return requests.post(url, data=body, headers={"Content-Type": TEXT}).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = {(path, n): pool.submit(append, path, n) for path in streams for n in range(5)}
        assert all(f.result() == 204 for f in futures.values())
    for path in streams:
        body = requests.get(workers.stream_url(path), params={"offset": "-1"}).content
        assert sorted(body.decode().rstrip(";").split(";"), key=int) == [str(n) for n in range(5)]
    for index, document in health_of_each(workers).items():
        assert document["shard"]["count"] == 2 and document["status"] == "ok", index


def test_each_shard_holds_only_its_streams(workers: ServerProcess) -> None:
    streams = paths_on_both_shards("placed", each=3)
    for path in streams:
        requests.put(workers.stream_url(path), data=b"x", headers={"Content-Type": TEXT})
    assert (workers.data_dir / "SHARDS").read_text().strip() == "2"
    for path in streams:
        shard = shard_of(path, 2)
        other = workers.data_dir / "shards" / str(1 - shard)
        own = workers.data_dir / "shards" / str(shard)
        assert path.encode() not in b"".join(p.read_bytes() for p in _files(other)), path
        assert path.encode() in b"".join(p.read_bytes() for p in _files(own)), path


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.name != "LOCK"]


def test_long_poll_and_sse_across_shards(workers: ServerProcess) -> None:
    streams = paths_on_both_shards("live", each=1)
    tails = {}
    for path in streams:
        response = requests.put(workers.stream_url(path), data=b"a", headers={"Content-Type": TEXT})
        tails[path] = response.headers["Stream-Next-Offset"]
    with concurrent.futures.ThreadPoolExecutor(len(streams)) as pool:
        polls = {
            path: pool.submit(
                requests.get,
                workers.stream_url(path),
                params={"offset": tails[path], "live": "long-poll"},
                timeout=30,
            )
            for path in streams
        }
        received: dict[str, list[str]] = {path: [] for path in streams}

        def read_sse(path: str) -> None:
            url = workers.stream_url(path)
            params = {"offset": tails[path], "live": "sse"}
            with requests.get(url, params=params, stream=True, timeout=30) as response:
                assert response.status_code == 200
                for chunk in response.iter_content(chunk_size=None, decode_unicode=True):
                    received[path].append(chunk)
                    if "later" in "".join(received[path]):
                        return

        readers = [threading.Thread(target=read_sse, args=(p,), daemon=True) for p in streams]
        for reader in readers:
            reader.start()
        poll_until(
            lambda: all("event: control" in "".join(received[p]) for p in streams),
            "the SSE readers connected",
            timeout=30,
        )
        for path in streams:
            posted = requests.post(
                workers.stream_url(path), data=b"later", headers={"Content-Type": TEXT}
            )
            assert posted.status_code == 204
        for path, poll in polls.items():
            result = poll.result(timeout=30)
            # parked then woken (200 with the data), or asked after the append: the same answer
            assert (result.status_code, result.content) == (200, b"later"), path
        for reader in readers:
            reader.join(30)
            assert not reader.is_alive()
    for path in streams:
        assert ("data", "later") in sse_events("".join(received[path])), path


def produce(server: ServerProcess, path: str, body: bytes, seq: int) -> requests.Response:
    headers = {
        "Content-Type": TEXT,
        "Producer-Id": f"p-{path}",
        "Producer-Epoch": "0",
        "Producer-Seq": str(seq),
    }
    return requests.post(server.stream_url(path), data=body, headers=headers)


def test_idempotent_producer_dedup_across_a_restart(workers: ServerProcess) -> None:
    streams = paths_on_both_shards("dedup")
    for path in streams:
        requests.put(workers.stream_url(path), headers={"Content-Type": TEXT})
        for seq in range(3):
            assert produce(workers, path, f"m{seq};".encode(), seq).status_code in (200, 204)
    assert workers.terminate() == 0
    workers.start()
    for path in streams:
        retry = produce(workers, path, b"m2;", 2)  # a retry of the last acknowledged append
        assert retry.status_code in (200, 204), (path, retry.status_code, retry.text)
        body = requests.get(workers.stream_url(path), params={"offset": "-1"}).content
        assert body == b"m0;m1;m2;", path
        assert produce(workers, path, b"m3;", 3).status_code in (200, 204)


def test_sigkill_of_one_worker_restarts_it_with_its_acknowledged_data(
    workers: ServerProcess,
) -> None:
    streams = paths_on_both_shards("killed", each=3)
    for path in streams:
        requests.put(workers.stream_url(path), headers={"Content-Type": TEXT})
        assert produce(workers, path, b"acked;", 0).status_code in (200, 204)
    victim = worker_of_shard(workers, 1)
    survivor = worker_of_shard(workers, 0)
    assert victim is not None and survivor is not None
    os.kill(victim, signal.SIGKILL)
    poll_until(
        lambda: worker_of_shard(workers, 1) not in (None, victim),
        "the killed worker restarted",
        timeout=30,
    )
    assert worker_of_shard(workers, 0) == survivor
    for path in streams:
        response = requests.get(workers.stream_url(path), params={"offset": "-1"})
        assert (response.status_code, response.content) == (200, b"acked;"), path
        # its producer state survived too: the retry is a duplicate, not a second copy
        assert produce(workers, path, b"acked;", 0).status_code in (200, 204)
        body = requests.get(workers.stream_url(path), params={"offset": "-1"}).content
        assert body == b"acked;", path


def test_requests_across_streams_answer_501_naming_the_flag(workers: ServerProcess) -> None:
    for resource in ("__ds/x-durastream",):
        response = requests.get(workers.stream_url(resource))
        assert response.status_code == 501, resource
        error = response.json()["error"]
        assert error["code"] == "NOT_AVAILABLE_WITH_WORKERS"
        assert "--workers" in error["message"]


def test_a_fork_within_and_across_shards_is_served(
    workers: ServerProcess,
) -> None:
    """Across shards it lives in its source's shard (``shards/forks.py``; ``test_forks.py`` compares
    it with one process)."""
    source, other, *_ = paths_on_both_shards("forksrc", each=1)
    requests.put(workers.stream_url(source), data=b"abc", headers={"Content-Type": TEXT})
    same = next(
        p
        for p in (f"fork-{uuid.uuid4().hex[:10]}" for _ in range(1000))
        if shard_of(p, 2) == shard_of(source, 2)
    )
    across = next(
        p
        for p in (f"fork-{uuid.uuid4().hex[:10]}" for _ in range(1000))
        if shard_of(p, 2) != shard_of(source, 2)
    )
    fork_headers = {"Content-Type": TEXT, "Stream-Forked-From": f"/v1/stream/{source}"}
    for fork in (across, same):
        served = requests.put(workers.stream_url(fork), headers=fork_headers)
        assert served.status_code == 201, served.text
        assert requests.get(workers.stream_url(fork), params={"offset": "-1"}).content == b"abc"
    assert other  # a stream of the other shard exists too (paths_on_both_shards)


# -- refusals at start-up ------------------------------------------------------------------------------


def run_server(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Start a server expected to refuse at once; its exit code and errors."""
    command = [sys.executable, "-m", "durastream_server", "--data-dir", str(data_dir)]
    command += ["--host", "127.0.0.1", "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_a_sharded_directory_refuses_another_number_of_workers(workers: ServerProcess) -> None:
    workers.terminate()
    for args, wanted in ((("--workers", "3"), "--workers 3"), ((), "--workers 1")):
        result = run_server(workers.data_dir, *args)
        assert result.returncode == 2, result.stderr
        assert "--workers 2" in result.stderr and wanted in result.stderr, result.stderr
        assert "start with --workers 2" in result.stderr


def test_an_unsharded_directory_refuses_workers(server_factory) -> None:  # type: ignore[no-untyped-def]
    single = server_factory()
    requests.put(single.stream_url("plain"), headers={"Content-Type": TEXT})
    single.terminate()
    result = run_server(single.data_dir, *WORKERS)
    assert result.returncode == 2, result.stderr
    assert "unsharded" in result.stderr and "--workers 1" in result.stderr, result.stderr
    assert not (single.data_dir / "SHARDS").exists()


def test_a_worker_that_cannot_start_stops_the_server(tmp_path: Path) -> None:
    """Shard 1's directory locked by another server: the start fails with that worker's code."""
    first = ServerProcess(tmp_path / "data", extra_args=WORKERS).start()
    first.terminate()
    blocker = ServerProcess(tmp_path / "data" / "shards" / "1").start()
    try:
        result = run_server(tmp_path / "data", *WORKERS)
        assert result.returncode != 0
        assert "locked" in result.stderr and "worker 1" in result.stderr, result.stderr
    finally:
        blocker.stop()


def test_sigterm_stops_every_worker(workers: ServerProcess) -> None:
    children = workers_of(workers)
    assert len(children) == 2
    assert workers.terminate() == 0
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_workers_flag_is_validated() -> None:
    result = run_server(Path("/nonexistent-never-created"), "--workers", "0")
    assert result.returncode == 2
    assert "--workers" in result.stderr


def test_health_of_a_worker_names_its_shard(workers: ServerProcess) -> None:
    documents = health_of_each(workers)
    assert {d["shard"]["index"] for d in documents.values()} == {0, 1}
    assert json.dumps(documents)  # plain JSON


def kill_and_await_workers(server: ServerProcess) -> list[int]:
    """SIGKILL the parent and wait until its orphaned workers have exited (they drain on SIGTERM
    from PR_SET_PDEATHSIG). A start before that may have its health check answered by an orphan
    still listening on the shared port (SO_REUSEPORT), and its first requests reset when that orphan
    closes: what a supervisor that restarts at once sees too, but not what a test of something else
    means to measure. Returns the workers' pids."""
    children = workers_of(server)
    server.kill()
    poll_until(
        lambda: all(_zombie(pid) or not Path(f"/proc/{pid}").exists() for pid in children),
        "the orphaned workers exited",
        timeout=30,
    )
    return children


def test_workers_stop_when_the_parent_is_killed(workers: ServerProcess) -> None:
    """SIGKILL of the parent: its workers get SIGTERM (PR_SET_PDEATHSIG) and release port and shards."""
    assert len(kill_and_await_workers(workers)) == 2
    workers.start()  # the shard locks and the port are free again
    assert len(workers_of(workers)) == 2


def test_a_parent_started_again_at_once_waits_for_its_draining_workers(
    workers: ServerProcess,
) -> None:
    """SIGKILL of the parent while a request is in flight on each shard, then a start at once: the
    orphaned workers still hold their shards' locks during their graceful shutdown, and the new
    workers wait for them (``StorageConfig.lock_wait_seconds``) instead of failing the start."""
    streams = paths_on_both_shards("drain", each=1)
    for path in streams:
        assert requests.put(workers.stream_url(path), headers={"Content-Type": TEXT}).ok
        assert produce(workers, path, b"kept;", 0).status_code in (200, 204)
    held = []
    for path in streams:  # a body promised and not sent: the request stays in flight (large, so
        # it takes the ASGI path, whose task the graceful shutdown waits for)
        connection = http.client.HTTPConnection(workers.host, workers.port, timeout=30)
        connection.putrequest("POST", f"/v1/stream/{path}")
        connection.putheader("Content-Type", TEXT)
        connection.putheader("Content-Length", str(4 * 1024 * 1024))
        connection.endheaders(b"partial")
        held.append(connection)
    children = workers_of(workers)
    workers.kill()
    try:
        assert any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in children), (
            "an orphaned worker should still be draining when the server starts again"
        )
        workers.start()  # (its health check may be answered by an orphan still listening)
    finally:
        for connection in held:
            connection.close()
    poll_until(
        lambda: all(_zombie(pid) or not Path(f"/proc/{pid}").exists() for pid in children),
        "the orphaned workers exited",
        timeout=30,
    )

    def served() -> bool:
        try:
            return all(
                requests.get(workers.stream_url(path), params={"offset": "-1"}).content == b"kept;"
                for path in streams
            )
        except requests.ConnectionError:  # the new workers still waiting for the locks
            return False

    poll_until(served, "both shards served by the new workers", timeout=60)
    assert workers.running, workers.log_tail()
    assert len(workers_of(workers)) == 2


def test_a_worker_waits_for_its_shards_lock_instead_of_failing_the_start(
    workers: ServerProcess,
) -> None:
    """The same, made deterministic: the test holds shard 1's lock (as a draining worker would) until
    the new worker says it is waiting for it; the start then completes with the shard's data."""
    streams = paths_on_both_shards("lockwait", each=1)
    for path in streams:
        assert requests.put(workers.stream_url(path), headers={"Content-Type": TEXT}).ok
        assert produce(workers, path, b"kept;", 0).status_code in (200, 204)
    assert workers.terminate() == 0
    lock = os.open(workers.data_dir / "shards" / "1" / "LOCK", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    released = threading.Event()

    def release_once_waiting() -> None:
        try:
            poll_until(
                lambda: "is locked by another process; waiting" in workers.log_tail(200),
                "the new worker waiting for shard 1's lock",
                timeout=60,
            )
        finally:
            os.close(lock)  # releases the flock
            released.set()

    releaser = threading.Thread(target=release_once_waiting, daemon=True)
    releaser.start()
    workers.start()
    releaser.join(timeout=60)
    assert released.is_set()
    for path in streams:
        response = requests.get(workers.stream_url(path), params={"offset": "-1"})
        assert (response.status_code, response.content) == (200, b"kept;"), path
