"""The Node reference server fixture works, and it advertises none of our extensions."""

from __future__ import annotations

import requests


def test_reference_server_round_trip_without_extensions(reference_server) -> None:
    url = reference_server.stream_url("compat/smoke")
    created = requests.put(url, data=b'[{"a":1}]', headers={"Content-Type": "application/json"})
    assert created.status_code == 201
    assert "Durastream-Extensions" not in created.headers
    read = requests.get(url, params={"offset": "-1"})
    assert read.json() == [{"a": 1}]
