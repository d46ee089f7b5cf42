"""The dashboard's key panels from a real run, without Docker: start a server, put a load on it (producers
appending to many small streams, long-polls following some of them), scrape ``/metrics`` every second, and
render what Grafana's panels show (docker/metrics/grafana/dashboards/durastream.json) with matplotlib.

    python bench/metrics_dashboard.py --seconds 30 --out docs/img/metrics-dashboard.png

Rates and quantiles are computed from the deltas between scrapes, as Prometheus' ``rate`` and
``histogram_quantile`` do (linear interpolation inside a bucket).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import requests  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.support.server_process import ServerProcess  # noqa: E402

TEXT = {"Content-Type": "text/plain"}
Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: ServerProcess) -> Sample:
    text = requests.get(server.base_url + "/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(sample: Sample, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in sample.items() if n == name and wanted <= set(ls))


def quantile(q: float, before: Sample, after: Sample, name: str, **labels: str) -> float | None:
    """``histogram_quantile`` over the bucket deltas between two scrapes."""
    buckets: dict[float, float] = defaultdict(float)
    wanted = set(labels.items())
    for (n, ls), value in after.items():
        if n == name + "_bucket" and wanted <= set(ls):
            le = float(dict(ls)["le"])
            buckets[le] += value - before.get((n, ls), 0.0)
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return None


def load(server: ServerProcess, stop: threading.Event, streams: int) -> list[threading.Thread]:
    paths = [f"dash/{i}" for i in range(streams)]
    for path in paths:
        requests.put(server.stream_url(path), headers=TEXT, timeout=10)

    def producer(worker: int) -> None:
        session, seq = requests.Session(), 0
        while not stop.is_set():
            path = paths[(worker * 7 + seq) % len(paths)]
            headers = {**TEXT, "Producer-Id": f"w{worker}-{path}", "Producer-Epoch": "0"}
            headers["Producer-Seq"] = str(seq // len(paths))
            session.post(
                server.stream_url(path), data=b"event-%d" % seq, headers=headers, timeout=10
            )
            seq += 1

    def follower(path: str) -> None:
        session, offset = requests.Session(), "-1"
        while not stop.is_set():
            answer = session.get(
                server.stream_url(path), params={"offset": offset, "live": "long-poll"}, timeout=30
            )
            offset = answer.headers.get("Stream-Next-Offset", offset)

    threads = [threading.Thread(target=producer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=follower, args=(p,)) for p in paths[:8]]
    for thread in threads:
        thread.start()
    return threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("docs/img/metrics-dashboard.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "data", long_poll_timeout=5)
        server.start()
        stop = threading.Event()
        try:
            threads = load(server, stop, args.streams)
            samples = [(time.monotonic(), scrape(server))]
            for _ in range(args.seconds):
                time.sleep(1)  # the scrape interval of this render (Prometheus' is 5 s)
                samples.append((time.monotonic(), scrape(server)))
        finally:
            stop.set()
            server.terminate()
        for thread in threads:
            thread.join(timeout=30)
    render(samples, args.out)
    print(f"wrote {args.out}")


def render(samples: list[tuple[float, Sample]], out: Path) -> None:
    start = samples[0][0]
    xs = [t - start for t, _ in samples[1:]]
    pairs = list(zip(samples, samples[1:], strict=False))

    def rate(name: str, **labels: str) -> list[float]:
        return [
            (total(b, name, **labels) - total(a, name, **labels)) / (tb - ta)
            for (ta, a), (tb, b) in pairs
        ]

    def q(quant: float, name: str, **labels: str) -> list[float]:
        return [
            (v * 1000 if (v := quantile(quant, a, b, name, **labels)) is not None else float("nan"))
            for (_, a), (_, b) in pairs
        ]

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    panels = [
        (
            "Requests per second by route",
            {r: rate("durastream_http_requests_total", route=r) for r in ("append", "long_poll")},
            "req/s",
        ),
        (
            "Append latency (ms)",
            {
                "p50": q(0.5, "durastream_request_duration_seconds", route="append"),
                "p99": q(0.99, "durastream_request_duration_seconds", route="append"),
            },
            "ms",
        ),
        (
            "Long-poll wake latency p99 (ms)",
            {"p99": q(0.99, "durastream_long_poll_wake_seconds")},
            "ms",
        ),
        (
            "Messages per second",
            {
                "written": rate("durastream_messages_written_total"),
                "read": rate("durastream_messages_read_total"),
            },
            "msg/s",
        ),
        (
            "Records per group commit (mean)",
            {
                "records": [
                    r / c if c else float("nan")
                    for r, c in zip(
                        rate("durastream_group_commit_records_sum"),
                        rate("durastream_group_commit_records_count"),
                        strict=True,
                    )
                ]
            },
            "records",
        ),
        ("fsync latency p99 (ms)", {"p99": q(0.99, "durastream_fsync_seconds")}, "ms"),
    ]
    for ax, (title, series, unit) in zip(axes.flat, panels, strict=True):
        for label, ys in series.items():
            ax.plot(xs, ys, label=label)
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle("durastream-server /metrics during a run (bench/metrics_dashboard.py)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


if __name__ == "__main__":
    main()
