"""``GET /metrics``: the counters (``counters.py``) and a census of what the server holds, in the
Prometheus text exposition format, written by ``prometheus_client``.

``prometheus_client`` is the Prometheus project's own Python client: its exposition writer and parser
follow the format as the project revises it (escaping, ``_total``/``_created`` conventions, OpenMetrics),
and its process collector reports memory, CPU and open file descriptors from ``/proc``. The server's own
figures enter it through a custom collector that reads them at scrape time, so the hot paths never touch
the library (``counters.py`` says why).

Every family, with its labels:

==========================================  =========  ==========================================
``durastream_http_requests_total``          counter    ``route`` (a fixed set), ``code``
``durastream_request_duration_seconds``     histogram  ``route``: append, read, commit
``durastream_long_poll_wake_seconds``       histogram  from the wake-up to the answers written
``durastream_http_request_bytes_total``     counter    request body bytes received
``durastream_http_response_bytes_total``    counter    response body bytes sent
``durastream_messages_read_total``          counter    messages in read responses
``durastream_messages_written_total``       counter    messages written into stream logs
``durastream_written_bytes_total``          counter    payload bytes written into stream logs
``durastream_group_commit_records``         histogram  records per group-commit batch
``durastream_fsync_seconds``                histogram  one fdatasync of a segment
``durastream_open_long_polls``              gauge      long-poll requests in flight
``durastream_open_sse_connections``         gauge      SSE responses in flight
``durastream_streams``                      gauge      streams (current paths)
``durastream_producers``                    gauge      producer ids the streams remember
``durastream_staged_handles``               gauge      open staged-append handles
``durastream_staged_bytes``                 gauge      payload bytes they hold
``durastream_quarantined_streams``          gauge      streams set aside under quarantine/
``durastream_recovering``                   gauge      1 while streams still recover after a start
``durastream_streams_pending``              gauge      stream directories not recovered yet
``durastream_data_dir_free_bytes``          gauge      free space of the data directory's disk
``durastream_build_info``                   gauge      ``version``; always 1
``process_*``                               various    ``prometheus_client``'s process collector
==========================================  =========  ==========================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from durastream_server import __version__
from durastream_server.engine.census import Census
from durastream_server.metrics.counters import Histogram, ServerMetrics

CONTENT_TYPE = CONTENT_TYPE_LATEST


def _histogram(
    name: str, documentation: str, labels: list[str] | None = None
) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, labels=labels)


def _add(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    buckets = [(_le(bound), count) for bound, count in histogram.cumulative()]
    family.add_metric(labels, buckets, histogram.sum)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _ServerCollector:
    """Reads ``ServerMetrics`` and the latest census whenever the registry is collected."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics
        self.census: Census | None = None

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        requests = CounterMetricFamily(
            "durastream_http_requests",
            "HTTP requests answered, by route class and status code.",
            labels=["route", "code"],
        )
        for route, by_status in metrics.requests.items():
            for status, count in sorted(by_status.items()):
                requests.add_metric([route, str(status)], count)
        yield requests
        latency = _histogram(
            "durastream_request_duration_seconds",
            "Time from a request's arrival to its answer, by route class.",
            ["route"],
        )
        for route, histogram in metrics.latency.items():
            _add(latency, [route], histogram)
        yield latency
        wake = _histogram(
            "durastream_long_poll_wake_seconds",
            "Per woken long-poll: time from its wake-up by a durable commit to its answer.",
        )
        _add(wake, [], metrics.long_poll_wake)
        yield wake
        yield CounterMetricFamily(
            "durastream_http_request_bytes",
            "Request body bytes received.",
            value=metrics.request_bytes,
        )
        yield CounterMetricFamily(
            "durastream_http_response_bytes",
            "Response body bytes sent.",
            value=metrics.response_bytes,
        )
        yield CounterMetricFamily(
            "durastream_messages_read",
            "Messages in read responses (catch-up, long-poll, SSE, frames).",
            value=metrics.messages_read,
        )
        batches, fsyncs, messages, payload = metrics.write_side()
        yield CounterMetricFamily(
            "durastream_messages_written",
            "Messages written into stream logs (appends, and commits of staged appends).",
            value=messages,
        )
        yield CounterMetricFamily(
            "durastream_written_bytes",
            "Payload bytes written into stream logs.",
            value=payload,
        )
        batch = _histogram(
            "durastream_group_commit_records", "Log records written per group-commit batch."
        )
        _add(batch, [], batches)
        yield batch
        fsync = _histogram("durastream_fsync_seconds", "Duration of one fdatasync of a segment.")
        _add(fsync, [], fsyncs)
        yield fsync
        yield GaugeMetricFamily(
            "durastream_open_long_polls",
            "Long-poll requests in flight.",
            value=metrics.open_long_polls,
        )
        yield GaugeMetricFamily(
            "durastream_open_sse_connections", "SSE responses in flight.", value=metrics.open_sse
        )
        census = self.census
        if census is not None:
            yield from _census(census)
        info = GaugeMetricFamily(
            "durastream_build_info", "The server's version (always 1).", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info


def _census(census: Census) -> Iterator[Metric]:
    yield GaugeMetricFamily("durastream_streams", "Streams (current paths).", value=census.streams)
    yield GaugeMetricFamily(
        "durastream_producers", "Producer ids the streams remember.", value=census.producers
    )
    yield GaugeMetricFamily(
        "durastream_staged_handles", "Open staged-append handles.", value=census.staged_handles
    )
    yield GaugeMetricFamily(
        "durastream_staged_bytes",
        "Payload bytes held by open staged-append handles.",
        value=census.staged_bytes,
    )
    yield GaugeMetricFamily(
        "durastream_quarantined_streams",
        "Streams set aside under quarantine/ (see /healthz and the start-up log).",
        value=census.quarantined,
    )
    yield GaugeMetricFamily(
        "durastream_recovering",
        "1 while streams are still recovering after a start: durastream_streams, "
        "durastream_producers and durastream_staged_* then count the recovered streams only.",
        value=1 if census.recovering else 0,
    )
    yield GaugeMetricFamily(
        "durastream_streams_pending",
        "Stream directories not recovered yet after a start (0 once recovery is complete).",
        value=census.streams_pending,
    )
    if census.disk_free_bytes is not None:
        yield GaugeMetricFamily(
            "durastream_data_dir_free_bytes",
            "Bytes available on the data directory's file system.",
            value=census.disk_free_bytes,
        )


class Exporter:
    """Renders ``/metrics``: takes a census (asynchronously, see ``engine/census.py``), then lets
    ``prometheus_client`` write every family."""

    def __init__(self, metrics: ServerMetrics, census: Callable[[], Awaitable[Census]]) -> None:
        self.metrics = metrics
        self._census = census
        self._collector = _ServerCollector(metrics)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self._collector)  # type: ignore[arg-type]
        ProcessCollector(registry=self._registry)

    async def render(self) -> bytes:
        # No await between setting the census and writing: one scrape's figures go together.
        self._collector.census = await self._census()
        return generate_latest(self._registry)
