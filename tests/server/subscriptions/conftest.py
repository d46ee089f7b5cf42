"""Fixtures of the subscription tests: an ``Api`` on the shared server, and a local webhook receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.subscriptions.receiver import WebhookReceiver
from tests.server.subscriptions.test_end_to_end import Api
from tests.support.server_process import ServerProcess


@pytest.fixture
def api(durastream_server: ServerProcess) -> Api:
    return Api(durastream_server)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as hook:
        yield hook
