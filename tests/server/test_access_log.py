"""Request ids, ``--access-log`` and ``--log-format json`` against a real server: every line the server
writes to stderr parses as one JSON object, access lines carry the request's fields and id, and neither
tokens nor bodies ever appear."""

from __future__ import annotations

import json
from urllib.parse import quote

import requests

from durastream_server.http.access import REDACTED, redact_query
from durastream_server.http.requestid import RequestIds, acceptable
from tests.support.http import poll_until
from tests.support.server_process import ServerProcess

TEXT = {"Content-Type": "text/plain"}
TOKEN = "access-log-token-0123456789abcdef"
SECRET_BODY = b"body-that-must-never-be-logged"


def server_lines(server: ServerProcess) -> list[str]:
    """What the server wrote: stderr (logs) and stdout (the one start-up line), harness lines excluded."""
    lines = server.log_path.read_text(errors="replace").splitlines()
    return [line for line in lines if line and not line.startswith("=== start ")]


def log_lines(server: ServerProcess) -> list[str]:
    """The log lines only: the ``serving ...`` announcement on stdout is not a log record."""
    return [line for line in server_lines(server) if not line.startswith("durastream-server ")]


def test_request_ids_keep_a_sane_client_id_and_replace_anything_else() -> None:
    ids = RequestIds()
    assert ids.take("trace-01:a.b_c") == "trace-01:a.b_c"
    fresh = {ids.take(bad) for bad in (None, "", "a b", "x" * 65, "-lead", "a\nb", "a,b")}
    assert len(fresh) == 7 and all(acceptable(value) for value in fresh)
    assert (
        redact_query("offset=-1&token=abc&api_key=k")
        == f"offset=-1&token={REDACTED}&api_key={REDACTED}"
    )


def test_every_response_carries_its_request_id(server_factory) -> None:
    server = server_factory()
    url = server.stream_url("ids/one")
    created = requests.put(url, headers={**TEXT, "X-Request-Id": "client-chosen-1"}, timeout=10)
    assert created.headers["X-Request-Id"] == "client-chosen-1"
    forged = requests.get(url, headers={"X-Request-Id": "a b\tc"}, timeout=10)
    assert forged.headers["X-Request-Id"] not in ("", "a b\tc")
    assert acceptable(forged.headers["X-Request-Id"])
    missing = requests.get(server.stream_url("ids/missing"), timeout=10)
    assert missing.status_code == 404 and acceptable(missing.headers["X-Request-Id"])
    assert missing.headers["X-Request-Id"] != forged.headers["X-Request-Id"]


def test_json_access_log_parses_line_by_line_and_never_holds_tokens_or_bodies(
    server_factory,
) -> None:
    server = server_factory(
        extra_args=["--log-format", "json", "--access-log", "--auth-token", TOKEN]
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = server.stream_url("logs/" + quote("a\nforged line", safe=""))
    requests.put(url, headers={**auth, **TEXT, "X-Request-Id": "put-1"}, timeout=10)
    requests.post(url, data=SECRET_BODY, headers={**auth, **TEXT, "X-Request-Id": "post-1"})
    requests.get(url, params={"offset": "-1", "token": TOKEN}, headers=auth, timeout=10)
    requests.get(url, headers={"Authorization": "Bearer wrong-token-0123456789abcdef"})

    def access_lines() -> list[dict]:
        documents = [json.loads(line) for line in log_lines(server)]  # every line is one object
        return [doc for doc in documents if doc["event"] == "request"]

    # The refused GET was sent last; its line is the last to appear.
    poll_until(lambda: any(doc["status"] == 401 for doc in access_lines()), "the 401's line")
    text = "\n".join(server_lines(server))
    assert TOKEN not in text and SECRET_BODY.decode() not in text
    assert "wrong-token" not in text
    by_id = {doc["request_id"]: doc for doc in access_lines()}
    post = by_id["post-1"]
    assert post["method"] == "POST" and post["route"] == "append"
    assert post["status"] in (200, 204) and post["bytes_in"] == len(SECRET_BODY)
    assert post["path"] == "/v1/stream/logs/a%0Aforged%20line"  # as sent: escaped, one line
    assert isinstance(post["duration_ms"], float) and post["time"].endswith("Z")
    assert post["level"] == "INFO"
    (read,) = [doc for doc in access_lines() if doc["route"] == "read" and doc["status"] == 200]
    assert read["query"] == f"offset=-1&token={REDACTED}"
    assert read["bytes_out"] == len(SECRET_BODY)


def test_access_log_is_off_by_default_and_text_stays_the_default(server_factory) -> None:
    server = server_factory()
    requests.put(server.stream_url("quiet"), headers=TEXT, timeout=10)
    requests.get(server.stream_url("quiet"), params={"offset": "-1"}, timeout=10)
    lines = log_lines(server)
    assert lines and not any(line.startswith("{") for line in lines)
    assert not any("durastream_server.access" in line for line in lines)
    on = server_factory(extra_args=["--access-log"])
    requests.put(on.stream_url("loud"), headers={**TEXT, "X-Request-Id": "loud-1"}, timeout=10)
    poll_until(
        lambda: any(
            "durastream_server.access" in line
            and "PUT /v1/stream/loud -> 201" in line
            and "[loud-1]" in line
            for line in log_lines(on)
        ),
        "the access-log line of the PUT",
    )
