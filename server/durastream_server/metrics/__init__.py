"""The server's metrics: cheap counters on the hot paths (``counters.py``), turned into the Prometheus
text format only when ``GET /metrics`` is scraped (``exposition.py``, with ``prometheus_client``)."""

from durastream_server.metrics.counters import (
    LATENCY_ROUTES,
    Histogram,
    ServerMetrics,
)

__all__ = ["LATENCY_ROUTES", "Histogram", "ServerMetrics"]
