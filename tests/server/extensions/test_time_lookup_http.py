"""Time lookups over HTTP: ``GET {stream}?lookup=time&timestamp=T[&offset=S][&end=E]``
(docs/extensions.md, 7). The model comparison (clock steps, forks, restarts) is in ``test_time_lookup.py``."""

from __future__ import annotations

import pytest

from tests.server.extensions.support import (
    append,
    create,
    error_code,
    frames_range,
    get,
    token,
    unique,
)
from tests.support.server_process import ServerProcess


def test_wire_format_and_the_first_message_at_or_after_an_instant(
    durastream_server: ServerProcess,
) -> None:
    path = unique("time")
    create(durastream_server, path, b'["ab"]')
    append(durastream_server, path, b'["cd","ef"]')
    frames, _ = frames_range(durastream_server, path, "-1", None)
    first, last = frames.timestamps[0], frames.timestamps[-1]
    response = get(durastream_server, path, lookup="time", timestamp=first)
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    assert response.json() == {
        "timestamp": first,
        "start": token(0),
        "end": token(12),
        "offset": token(0),
        "found": True,
        "tail": token(12),
        "closed": False,
    }
    later = get(durastream_server, path, lookup="time", timestamp=last + 1).json()
    assert (later["offset"], later["found"]) == (token(12), False)
    bounded = get(
        durastream_server, path, lookup="time", timestamp=0, offset=token(4), end=token(8)
    ).json()
    assert (bounded["offset"], bounded["found"], bounded["end"]) == (token(4), True, token(8))


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"lookup": "time"}, "timestamp"),
        ({"lookup": "time", "timestamp": "-5"}, "timestamp"),
        ({"lookup": "time", "timestamp": "2024-01-01"}, "timestamp"),
        ({"timestamp": "5"}, "timestamp is only valid with lookup=time"),
        ({"lookup": "time", "timestamp": "5", "max_messages": "1"}, "max_messages"),
        ({"lookup": "time", "timestamp": "5", "format": "frames"}, "format"),
        ({"lookup": "time", "timestamp": "5", "live": "long-poll"}, "live"),
        ({"lookup": "clock"}, "lookup"),
    ],
)
def test_bad_parameters_name_themselves(
    durastream_server: ServerProcess, params: dict[str, str], names: str
) -> None:
    path = unique("time-bad")
    create(durastream_server, path, b'["ab"]')
    response = get(durastream_server, path, offset="-1", **params)
    assert response.status_code == 400
    assert error_code(response) == "INVALID_PARAMETER"
    assert names in response.json()["error"]["message"]


def test_offsets_inside_messages_and_ends_past_the_tail(durastream_server: ServerProcess) -> None:
    path = unique("time-range")
    create(durastream_server, path, b'["abc"]')
    inside = get(durastream_server, path, lookup="time", timestamp=0, offset=token(2))
    assert (inside.status_code, error_code(inside)) == (400, "INVALID_OFFSET")
    beyond = get(durastream_server, path, lookup="time", timestamp=0, end=token(99))
    assert (beyond.status_code, error_code(beyond)) == (400, "END_BEYOND_TAIL")
    missing = get(durastream_server, unique("time-missing"), lookup="time", timestamp=0)
    assert missing.status_code == 404
