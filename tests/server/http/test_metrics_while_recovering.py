"""``/metrics`` during the background recovery after a start (engine/recovery.py): a scrape answers at
once with what is recovered so far and a gauge of the streams still pending, and the figures are complete
once recovery is. The app and engine are the real ones on a real data directory, driven in-process; the
only stand-in holds the background recovery back (fault injection: a slow disk at 100,000 streams), so
that the scrape provably comes before recovery ends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from durastream_server.engine.engine import Engine
from durastream_server.http.app import DurastreamApp
from durastream_server.storage import DataDir
from tests.server.engine.support import append, close_engine, config, create, open_engine
from tests.server.http.test_app_inprocess import _Backend, _call, _started

STREAMS = 6


async def _populate(root: Path) -> None:
    data, engine = await open_engine(root)
    for i in range(STREAMS):
        await create(engine, f"m/s{i}", b"x")
        await append(engine, f"m/s{i}", b"y", producer=(f"p{i}", 0, 0))
    await close_engine(data, engine)


async def _scrape(app: DurastreamApp) -> dict[str, float]:
    status, _, body = await asyncio.wait_for(_call(app, "GET", b"/metrics", []), 30)
    assert status == 200, body
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if not sample.labels
    }


def test_a_scrape_during_recovery_answers_with_partial_figures_and_the_pending_gauge(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        await _populate(tmp_path)
        data = await DataDir.open(config(tmp_path), lazy=True)
        engine = Engine(data, sweep_interval=0)
        release = asyncio.Event()
        real = data.recover

        async def held(ids: list[str]) -> list:
            await release.wait()
            return await real(ids)

        data.recover = held  # type: ignore[method-assign]
        try:
            await engine.start()  # the background recovery starts, and waits on ``release``
            app = await _started(_Backend(engine, None))
            during = await _scrape(app)
            assert during["durastream_recovering"] == 1
            assert during["durastream_streams_pending"] == STREAMS
            assert during["durastream_streams"] == 0  # none recovered yet: partial, and says so
            assert during["durastream_producers"] == 0
            release.set()
            await asyncio.wait_for(engine.recovered(), 30)
            after = await _scrape(app)
            assert after["durastream_recovering"] == 0
            assert after["durastream_streams_pending"] == 0
            assert after["durastream_streams"] == STREAMS
            assert after["durastream_producers"] == STREAMS
        finally:
            release.set()
            await close_engine(data, engine)

    asyncio.run(main())
