"""Hazard 38: an internal I/O error must reach the client as a 5xx, never as a 404 or 409.

The real storage, engine and ASGI app run in-process so that an I/O error can be injected exactly where a
disk would raise it (``os.pwritev`` / ``os.pread``). The error text deliberately reads like "not found":
statuses come from exception types, never from message text.
"""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path

import pytest

from durastream_server.config import ServerConfig
from durastream_server.server import Backend
from tests.server.http.test_app_inprocess import _call, _started

MISLEADING = "No such file or directory: stream not found"


def _eio(*_args: object, **_kwargs: object) -> int:
    raise OSError(errno.EIO, MISLEADING)


@pytest.mark.parametrize("target", ["os.pwritev", "os.pread"])
def test_hazard_38_io_error_is_5xx_not_404(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    async def scenario() -> None:
        backend = await Backend.open(ServerConfig(data_dir=tmp_path / "data"))
        try:
            app = await _started(backend)  # type: ignore[arg-type]
            path = b"/v1/stream/h38"
            headers = [(b"content-type", b"text/plain")]
            status, _, _ = await _call(app, "PUT", path, headers, b"hello")
            assert status == 201
            with monkeypatch.context() as patch:
                patch.setattr(target, _eio)
                if target == "os.pwritev":
                    status, _, body = await _call(app, "POST", path, headers, b"more")
                else:
                    status, _, body = await _call(app, "GET", path, [], query=b"offset=-1")
            assert status == 503, (status, body)
            assert json.loads(body)["error"]["code"] == "STORAGE_FAILURE"
            health, _, _ = await _call(app, "GET", b"/healthz", [])
            assert health == 200
        finally:
            await backend.close()

    asyncio.run(scenario())
