"""`make test-compat` tests the minimum version of every dependency that the two pyproject.toml files declare."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def declared_minimums(pyproject: Path) -> dict[str, str]:
    """``name>=version`` entries (markers allowed) of ``[project] dependencies`` in ``pyproject``."""
    text = pyproject.read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S)
    assert block, f"{pyproject} has no [project] dependencies list"
    found = re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9][^",;]*)[;"]', block.group(1))
    return {name.lower(): version for name, version in found}


def release(version: str) -> tuple[int, ...]:
    """``15`` and ``15.0.0`` are the same release."""
    parts = [int(part) for part in version.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints" / "minimum.txt").read_text(encoding="utf-8").splitlines()
    entries = [line.split("#")[0].strip() for line in lines]
    return dict(entry.lower().split("==", 1) for entry in entries if entry)


def test_every_declared_minimum_is_pinned_for_test_compat() -> None:
    connector = declared_minimums(ROOT / "pyproject.toml")
    server = declared_minimums(ROOT / "server" / "pyproject.toml")
    pinned = pins()
    assert set(connector) == {"pyspark", "pyarrow", "requests"}
    assert set(server) == {
        "uvicorn",
        "httptools",
        "uvloop",
        "cryptography",
        "httpx",
        "zlib-ng",
        "msgspec",
        "blake3",
        "sortedcontainers",
        "prometheus_client",
    }
    assert set(pinned) == set(connector) | set(server)
    for name, minimum in {**connector, **server}.items():
        if name == "pyspark":
            # the newest patch of the oldest supported minor version (4.0.x, no admission control)
            assert pinned[name].startswith(minimum + "."), name
        else:  # exactly the declared minimum
            assert release(pinned[name]) == release(minimum), name


def test_the_makefile_installs_with_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "test-compat:" in makefile
    assert "-c constraints/minimum.txt" in makefile
    assert "tests/server" in makefile  # the server's minimums are exercised by its own tests
