"""Helpers for the staged-append tests: request shorthands and a way to find a stream's staging files on
disk (the engine itself: ``tests.server.engine.support``)."""

from __future__ import annotations

from pathlib import Path

from durastream_server.engine.engine import Engine
from durastream_server.engine.txnapi import (
    AbortRequest,
    AbortResult,
    CommitRequest,
    CommitResult,
    StageRequest,
    StageResult,
)
from durastream_server.storage.records import ProducerTuple

JSON = "application/json"
TEXT = "text/plain"


async def stage(
    engine: Engine,
    path: str,
    handle: str,
    body: bytes,
    content_type: str = TEXT,
    *,
    producer: tuple[str, int, int] | None = None,
    ttl: int | None = None,
) -> StageResult:
    return await engine.stage(
        StageRequest(
            path=path,
            handle=handle,
            content_type=content_type,
            body=body,
            producer=ProducerTuple(*producer) if producer else None,
            ttl_seconds=ttl,
        )
    )


async def commit(
    engine: Engine,
    path: str,
    *handles: str,
    producer: tuple[str, int, int] = ("committer", 0, 0),
    close: bool = False,
    stream_seq: str | None = None,
    refuse_forgotten: bool = False,
) -> CommitResult:
    return await engine.commit(
        CommitRequest(
            path=path,
            handles=handles,
            producer=ProducerTuple(*producer),
            close=close,
            stream_seq=stream_seq,
            refuse_forgotten=refuse_forgotten,
        )
    )


async def abort(engine: Engine, path: str, *handles: str) -> AbortResult:
    return await engine.abort(AbortRequest(path=path, handles=handles))


def staging_files(data_root: Path) -> list[Path]:
    """Every staging file under a data directory (all streams)."""
    return sorted(data_root.glob("streams/*/txn/*.stg"))
