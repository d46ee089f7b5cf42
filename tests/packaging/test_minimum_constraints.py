"""`make test-compat` tests the minimum version of every connector dependency that pyproject.toml declares."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def declared_minimums() -> dict[str, str]:
    """``name>=version`` entries of ``[project] dependencies`` in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S)
    assert block, "pyproject.toml has no [project] dependencies list"
    found = re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9][^",;]*)"', block.group(1))
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
    minimums, pinned = declared_minimums(), pins()
    assert set(minimums) == {"pyspark", "pyarrow", "requests"}
    assert set(pinned) == set(minimums)
    for name in ("pyarrow", "requests"):  # exactly the declared minimum
        assert release(pinned[name]) == release(minimums[name]), name
    # pyspark: the newest patch of the oldest supported minor version (4.0.x, no admission control)
    assert pinned["pyspark"].startswith(minimums["pyspark"] + ".")


def test_the_makefile_installs_with_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "test-compat:" in makefile
    assert "-c constraints/minimum.txt" in makefile
