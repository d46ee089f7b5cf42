"""The client's side of docs/extensions.md sections 6 and 7: producer requests ask the server to refuse a
possible repeat of a forgotten producer (``ProducerForgottenError``), and a caller can require that a
duplicate was really compared (``UnverifiedDuplicate``)."""

from __future__ import annotations

import pickle

import pytest

from durastream_spark import errors as e
from durastream_spark.options import ConnectionOptions
from durastream_spark.protocol.client import StreamClient
from tests.connector.fault_server import FaultServer, Respond
from tests.support.http import poll_until
from tests.support.server_process import FORGET_PRODUCERS_FAST

SHORT = list(FORGET_PRODUCERS_FAST)
TEXT = "text/plain"


def _client(root: str) -> StreamClient:
    return StreamClient(ConnectionOptions.parse({"url": root, "retry.maxAttempts": "1"}))


def test_appends_and_commits_of_forgotten_producers_are_refused(server_factory) -> None:
    server = server_factory(extra_args=SHORT)
    client = _client(server.base_url + "/v1/stream")
    client.create("forgotten/s", TEXT)
    client.append("forgotten/s", b"a;", TEXT, producer=("job-0", 3, 0))
    client.stage("forgotten/s", "h1", b"b;", TEXT, producer=("h1", 0, 0))
    client.commit("forgotten/s", ["h1"], ("job-1", 3, 0))

    def forgotten() -> bool:
        try:
            result = client.append("forgotten/s", b"a;", TEXT, producer=("job-0", 3, 0))
        except e.ProducerForgottenError as error:
            assert error.forgotten_epoch == 3 and error.code == "PRODUCER_FORGOTTEN"
            assert "refused rather than written a second time" in str(error)
            return True
        assert result.duplicate and result.digest_verified
        return False

    poll_until(forgotten, "the appending producer to be forgotten", timeout=20)
    client.stage("forgotten/s", "h2", b"b;", TEXT, producer=("h2", 0, 0))

    def commit_refused() -> bool:  # a replayed commit: other handles under the same tuple
        try:
            client.commit("forgotten/s", ["h2"], ("job-1", 3, 0))
        except e.DuplicatePayloadMismatch:
            return False  # still remembered: refused as a reused tuple
        except e.ProducerForgottenError:
            return True
        raise AssertionError("a replayed commit was applied")

    poll_until(commit_refused, "the committing producer to be forgotten", timeout=20)
    # A new member of the group at a later epoch is new.
    assert not client.append("forgotten/s", b"c;", TEXT, producer=("job-2", 4, 0)).duplicate
    assert b"".join(c.body for c in client.iter_range("forgotten/s", "-1", None)) == b"a;b;c;"


@pytest.mark.parametrize(
    ("advertised", "digest", "raises"),
    [
        ("payload-digest=2", "unknown", True),
        ("payload-digest=2", "match", False),
        ("payload-digest=1", None, False),  # an older server: the plan warns about it instead
        (None, None, False),  # no digests at all (the Node reference server)
    ],
)
def test_a_duplicate_that_was_not_compared_fails_when_required(
    advertised: str | None, digest: str | None, raises: bool
) -> None:
    headers = {"Stream-Next-Offset": "0000000000000000_0000000000000005"}
    if advertised:
        headers["Durastream-Extensions"] = advertised
    if digest:
        headers["Durastream-Digest"] = digest
    with FaultServer(default=Respond(204, headers)) as server:
        client = _client(server.root)
        plain = client.append("s", b"x", TEXT, producer=("p-0", 1, 0))
        assert plain.duplicate
        assert plain.digest_verified is {"match": True, "unknown": False}.get(digest or "")
        assert server.requests[-1].headers["Durastream-Forgotten-Producer"] == "refuse"
        if raises:
            with pytest.raises(e.UnverifiedDuplicate) as info:
                client.append("s", b"x", TEXT, producer=("p-0", 1, 0), require_verified=True)
            assert "Nothing of this request was written" in str(info.value)
            assert type(pickle.loads(pickle.dumps(info.value))) is e.UnverifiedDuplicate
        else:
            client.append("s", b"x", TEXT, producer=("p-0", 1, 0), require_verified=True)


def test_plain_appends_and_callers_that_opt_out_do_not_ask() -> None:
    with FaultServer(default=Respond(204, {"Stream-Next-Offset": "0_0"})) as server:
        client = _client(server.root)
        client.append("s", b"x", TEXT)
        assert "Durastream-Forgotten-Producer" not in server.requests[-1].headers
        client.append("s", b"x", TEXT, producer=("p-0", 0, 0), refuse_forgotten=False)
        assert "Durastream-Forgotten-Producer" not in server.requests[-1].headers
