"""Retries on the wire, against a scripted local HTTP server (fault injection only; protocol semantics are
tested against the real server in test_client.py). Time is fake: sleeps are recorded, never slept."""

from __future__ import annotations

import email.utils
import logging
from collections.abc import Iterator

import pytest

from durastream_spark.errors import (
    AccessDenied,
    BadRequest,
    ConflictError,
    MalformedResponse,
    ProtocolError,
    RateLimited,
    ServerError,
    StreamNotFound,
    TransportError,
)
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.body import RequestBody
from durastream_spark.protocol.client import StreamClient
from tests.connector.fault_server import Drop, FaultServer, Respond
from tests.support.server_process import free_port

OFFSET = "0000000000000000_0000000000000000"
JSON = "application/json"
TOKEN = "tok-9f8e7d6c5b4a"


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.wall = 1_800_000_000.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.wall += seconds

    def clock(self) -> float:
        return self.now

    def wall_clock(self) -> float:
        return self.wall


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer() as running:
        yield running


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def make_client(root: str, fake_time: FakeTime, rng: float = 0.5, **options: str) -> StreamClient:
    connection = ConnectionOptions.parse({"url": root, "requestTimeoutMs": "10s", **options})
    return StreamClient(
        connection,
        sleep=fake_time.sleep,
        clock=fake_time.clock,
        wall_clock=fake_time.wall_clock,
        rng=lambda: rng,
    )


def ok(**headers: str) -> Respond:
    return Respond(200, {"Stream-Next-Offset": OFFSET, "Content-Type": JSON, **headers}, b"[]")


# ---- what is retried --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 502, 503, 504, 507])
def test_get_is_retried_on_transient_statuses(
    server: FaultServer, fake_time: FakeTime, status: int
) -> None:
    server.script(Respond(status), Respond(status), ok())
    chunk = make_client(server.root, fake_time).read("s", "-1")
    assert chunk.body == b"[]"
    assert len(server.requests) == 3
    assert fake_time.sleeps == [pytest.approx(0.05), pytest.approx(0.1)]  # rng 0.5 of caps 0.1, 0.2


def test_get_is_retried_after_a_dropped_connection(
    server: FaultServer, fake_time: FakeTime
) -> None:
    server.script(Drop(), ok())
    assert make_client(server.root, fake_time).read("s", "-1").next_offset == OFFSET
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, BadRequest),
        (401, AccessDenied),
        (404, StreamNotFound),
        (409, ConflictError),
        (500, ServerError),
    ],
)
def test_other_errors_are_never_retried(
    server: FaultServer, fake_time: FakeTime, status: int, error: type[Exception]
) -> None:
    server.script(Respond(status))
    with pytest.raises(error):
        make_client(server.root, fake_time).read("s", "-1")
    assert len(server.requests) == 1
    assert fake_time.sleeps == []


def test_plain_append_is_never_retried_on_a_503(server: FaultServer, fake_time: FakeTime) -> None:
    server.script(Respond(503), ok())
    with pytest.raises(ServerError) as caught:
        make_client(server.root, fake_time).append("s", b'{"a":1}', JSON)
    assert caught.value.attempts == 1
    assert caught.value.maybe_applied is True
    assert "may or may not have been applied" in str(caught.value)
    assert len(server.requests) == 1
    assert fake_time.sleeps == []


def test_plain_append_is_never_retried_on_a_429(server: FaultServer, fake_time: FakeTime) -> None:
    server.script(Respond(429, {"Retry-After": "1"}), ok())
    with pytest.raises(RateLimited):
        make_client(server.root, fake_time).append("s", b'{"a":1}', JSON)
    assert len(server.requests) == 1


def test_plain_append_lost_response_says_it_may_have_been_applied(
    server: FaultServer, fake_time: FakeTime
) -> None:
    """Hazard 11: the server read the append and the connection died. Repeating could duplicate it."""
    server.script(Drop(), ok())
    with pytest.raises(TransportError) as caught:
        make_client(server.root, fake_time).append("s", b'{"a":1}', JSON)
    assert caught.value.maybe_applied is True
    assert "may or may not have been applied" in str(caught.value)
    assert "stream 's'" in str(caught.value)
    assert len(server.requests) == 1
    assert fake_time.sleeps == []


def test_append_and_close_without_producer_is_not_retried(
    server: FaultServer, fake_time: FakeTime
) -> None:
    server.script(Drop(), ok())
    with pytest.raises(TransportError) as caught:
        make_client(server.root, fake_time).append("s", b'{"a":1}', JSON, close=True)
    assert caught.value.maybe_applied is True
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        b'[{"a":1},{"b":2}]',
        # The sink's bodies: views of its encoded rows, sent piece by piece, never joined.
        RequestBody([b"[", memoryview(b'{"a":1},{"b":2},')[:-1], b"", b"]"]),
    ],
    ids=["bytes", "pieces"],
)
def test_producer_append_is_retried_with_identical_tuple_and_bytes(
    server: FaultServer, fake_time: FakeTime, body: bytes | RequestBody
) -> None:
    server.script(
        Drop(), Respond(503), Respond(204, {"Stream-Next-Offset": OFFSET, "Producer-Seq": "4"})
    )
    result = make_client(server.root, fake_time).append("s", body, JSON, producer=("p-1", 3, 4))
    assert result.duplicate is True and result.delivered is True
    assert len(server.requests) == 3
    sent = {
        (r.body, r.headers["Producer-Id"], r.headers["Producer-Epoch"], r.headers["Producer-Seq"])
        for r in server.requests
    }
    assert sent == {
        (b'[{"a":1},{"b":2}]', "p-1", "3", "4")
    }  # hazard 4: never new bytes for a tuple


def test_producer_append_is_retried_while_the_server_disk_is_full(
    server: FaultServer, fake_time: FakeTime
) -> None:
    # durastream-server answers 507 with nothing written, and heals by itself once space returns.
    server.script(Respond(507), Respond(507), ok())
    make_client(server.root, fake_time).append("s", b'[{"a":1}]', JSON, producer=("p-1", 0, 0))
    assert len(server.requests) == 3


def test_plain_append_is_never_retried_on_a_507(server: FaultServer, fake_time: FakeTime) -> None:
    server.script(Respond(507), ok())
    with pytest.raises(ServerError):
        make_client(server.root, fake_time).append("s", b'{"a":1}', JSON)
    assert len(server.requests) == 1


def test_close_only_is_retried(server: FaultServer, fake_time: FakeTime) -> None:
    server.script(
        Respond(503), Respond(204, {"Stream-Next-Offset": OFFSET, "Stream-Closed": "true"})
    )
    result = make_client(server.root, fake_time).close("s")
    assert result.closed is True
    assert len(server.requests) == 2
    assert server.requests[0].headers["Stream-Closed"] == "true"
    assert server.requests[0].body == b""


def test_plain_append_is_resent_when_the_connection_never_opened(fake_time: FakeTime) -> None:
    """Connection refused proves nothing was sent, so even a plain append may go again."""
    late = FaultServer(port=free_port(), default=Respond(204, {"Stream-Next-Offset": OFFSET}))

    class StartServerWhileSleeping(FakeTime):
        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            if late._httpd is None:
                late.start()

    clock = StartServerWhileSleeping()
    client = make_client(late.root, clock)
    try:
        result = client.append("s", b'{"a":1}', JSON)
    finally:
        late.stop()
    assert result.status == 204
    assert len(clock.sleeps) == 1
    assert len(late.requests) == 1


def test_unreachable_server_gives_up_after_max_attempts(fake_time: FakeTime) -> None:
    root = f"http://127.0.0.1:{free_port()}/v1/stream"
    client = make_client(root, fake_time, **{"retry.maxAttempts": "4"})
    with pytest.raises(TransportError) as caught:
        client.head("s")
    assert caught.value.attempts == 4
    assert caught.value.maybe_applied is False
    assert len(fake_time.sleeps) == 3
    assert str(caught.value).startswith(
        f"The server at {root.removesuffix('/v1/stream')} is not answering (is it running? is the "
        "port right?): connection refused (HEAD stream 's'; 4 attempt(s) in "
    )


# ---- how long it waits --------------------------------------------------------------------------------


def test_retry_after_seconds_is_a_floor(server: FaultServer, fake_time: FakeTime) -> None:
    server.script(Respond(503, {"Retry-After": "7"}), ok())
    make_client(server.root, fake_time).read("s", "-1")
    assert fake_time.sleeps == [7.0]


def test_retry_after_http_date(server: FaultServer, fake_time: FakeTime) -> None:
    when = email.utils.formatdate(fake_time.wall + 30, usegmt=True)
    server.script(Respond(429, {"Retry-After": when}), ok())
    make_client(server.root, fake_time).read("s", "-1")
    assert fake_time.sleeps == [pytest.approx(30.0)]


def test_attempt_count_bounds_the_loop(server: FaultServer, fake_time: FakeTime) -> None:
    server.default = Respond(503)
    with pytest.raises(ServerError) as caught:
        make_client(server.root, fake_time, **{"retry.maxAttempts": "5"}).read("s", "-1")
    assert caught.value.attempts == 5
    assert "5 attempt(s)" in str(caught.value)
    assert len(server.requests) == 5
    assert len(fake_time.sleeps) == 4


def test_elapsed_time_bounds_the_loop(server: FaultServer, fake_time: FakeTime) -> None:
    server.default = Respond(503)
    client = make_client(
        server.root,
        fake_time,
        rng=1.0,
        **{
            "retry.maxElapsedMs": "1000",
            "retry.initialBackoffMs": "400",
            "retry.maxBackoffMs": "400",
        },
    )
    with pytest.raises(ServerError) as caught:
        client.read("s", "-1")
    # t=0 fail, wait .4; t=.4 fail, wait .4; t=.8 fail: .8 + .4 > 1.0, give up without sleeping
    assert fake_time.sleeps == [pytest.approx(0.4), pytest.approx(0.4)]
    assert caught.value.attempts == 3


def test_retry_after_beyond_the_budget_gives_up_at_once(
    server: FaultServer, fake_time: FakeTime
) -> None:
    server.script(Respond(503, {"Retry-After": "3600"}), ok())
    with pytest.raises(ServerError) as caught:
        make_client(server.root, fake_time).read("s", "-1")
    assert caught.value.headers["Retry-After"] == "3600"
    assert fake_time.sleeps == []


# ---- wire hygiene -------------------------------------------------------------------------------------


def test_redirects_are_not_followed(server: FaultServer, fake_time: FakeTime) -> None:
    server.script(Respond(307, {"Location": "http://evil.example/steal"}))
    with pytest.raises(ProtocolError) as caught:
        make_client(server.root, fake_time, **{"header.Authorization": f"Bearer {TOKEN}"}).read(
            "s", "-1"
        )
    assert "redirect" in str(caught.value)
    assert len(server.requests) == 1


def test_no_body_is_read_on_head_204_and_304(server: FaultServer, fake_time: FakeTime) -> None:
    """Hazard 41: the announced body never comes; reading it would block until the timeout."""
    lying = {"Content-Length": "5", "Stream-Next-Offset": OFFSET, "Content-Type": JSON}
    server.script(Respond(200, lying), Respond(204, lying), Respond(304, lying), ok())
    client = make_client(server.root, fake_time, requestTimeoutMs="30s")
    assert client.head("s").next_offset == OFFSET
    assert client.append("s", b"1", JSON).status == 204
    with pytest.raises(MalformedResponse, match="unexpected status 304"):
        client.read("s", "-1")  # we never send If-None-Match, so a 304 is an error, not data
    assert (
        client.read("s", "-1").body == b"[]"
    )  # the connection was left clean for the next exchange
    assert len({r.peer_port for r in server.requests}) == 1  # and it was kept alive
    assert fake_time.sleeps == []


def test_headers_and_rotating_token_file_are_sent(
    server: FaultServer, fake_time: FakeTime, tmp_path
) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    client = make_client(
        server.root, fake_time, tokenFile=str(token), **{"header.X-Tenant": "acme"}
    )
    client.head("s")
    token.write_text("second-token-after-rotation\n")
    client.head("s")
    assert [r.headers["Authorization"] for r in server.requests] == [
        "Bearer first-token",
        "Bearer second-token-after-rotation",
    ]
    assert all(r.headers["X-Tenant"] == "acme" for r in server.requests)


def test_errors_never_contain_credentials(server: FaultServer, fake_time: FakeTime) -> None:
    client = make_client(server.root, fake_time, **{"header.Authorization": f"Bearer {TOKEN}"})
    server.script(
        Respond(401, {"Content-Type": "application/json"}, b'{"error": {"code": "UNAUTHORIZED"}}')
    )
    with pytest.raises(AccessDenied) as denied:
        client.head("s")
    server.script(Drop())
    with pytest.raises(TransportError) as transport:
        client.append("s", b"1", JSON)
    for error in (denied.value, transport.value):
        assert TOKEN not in str(error) and TOKEN not in repr(error)
        assert TOKEN not in repr(error.__dict__)
    assert TOKEN not in repr(client)


# ---- what the user reads --------------------------------------------------------------------------------


def test_refused_connection_is_one_sentence_without_the_urllib3_chain(fake_time: FakeTime) -> None:
    origin = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TransportError) as caught:
        make_client(origin + "/v1/stream", fake_time, **{"retry.maxAttempts": "3"}).head("s")
    text = str(caught.value)
    assert text.startswith(
        f"The server at {origin} is not answering (is it running? is the port right?)"
    )
    assert "\n" not in text
    for noise in ("HTTPConnectionPool", "Max retries", "NewConnectionError", "urllib3"):
        assert noise not in text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_unknown_host_names_the_host(fake_time: FakeTime) -> None:
    root = "http://durastream-no-such-host.invalid:4437/v1/stream"
    with pytest.raises(TransportError) as caught:
        make_client(root, fake_time, **{"retry.maxAttempts": "2"}).head("s")
    assert str(caught.value).startswith(
        "The server at http://durastream-no-such-host.invalid:4437 is not answering (is it running? "
        "is the host name right?): 'durastream-no-such-host.invalid' does not resolve ("
    )


def test_a_failing_request_logs_one_warning_not_one_per_attempt(
    fake_time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="durastream_spark.protocol.retry")
    root = f"http://127.0.0.1:{free_port()}/v1/stream"
    with pytest.raises(TransportError):
        make_client(root, fake_time, **{"retry.maxAttempts": "6"}).head("s")
    retry_records = [r for r in caplog.records if r.name == "durastream_spark.protocol.retry"]
    warnings = [r for r in retry_records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].getMessage().startswith(
        "HEAD stream 's': http://127.0.0.1:"
    ) and "refused the connection; retrying for up to 120 s (at most 6 attempts" in (
        warnings[0].getMessage()
    )
    # The later attempts and the low-level chain are at DEBUG only.
    assert len([r for r in retry_records if r.levelno == logging.DEBUG]) == 5
    assert any(r.exc_info and "ConnectionRefusedError" in caplog.text for r in retry_records)


def test_transient_statuses_log_one_warning_too(
    server: FaultServer, fake_time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="durastream_spark.protocol.retry")
    server.script(Respond(503), Respond(503), Respond(503), ok())
    make_client(server.root, fake_time).read("s", "-1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "GET stream 's': HTTP 503; retrying for up to 120 s (at most 10 attempts; retry.* options)"
    ]
