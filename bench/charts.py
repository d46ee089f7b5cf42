"""Benchmark figures as JSON (``bench/results/<name>.json``) and PNG charts (``docs/img/bench-<name>.png``).

The bench scripts call :func:`record` at the end of ``main()`` with their figures, converted by
:func:`server_figures`, :func:`sink_figures` or :func:`source_figures`. ``python bench/charts.py``
re-renders every PNG from the saved JSON (``python bench/charts.py sink`` just one). Rendering needs
matplotlib (``pip install -e '.[bench]'``); without it the JSON is still written and a note printed.

A chart is a row of panels, one per figure with its own unit. Each panel groups bars (ours and the
baselines of one measurement) and labels every bar of ours with how many times better it is than each
baseline: ``ours / baseline`` where higher is better, ``baseline / ours`` where lower is better, unless the
bench supplies its own ratios (the sink's are medians of per-round ratios, not ratios of medians).

JSON layout::

    {"name": "sink", "title": "...", "source": "where the figures come from", "recorded": "2026-11-26",
     "command": "python bench/sink_bench.py ...",
     "panels": [{"title": "...", "unit": "rows/s", "higher_is_better": true,
                 "ours": ["durastream (ordered)"], "baselines": ["naive foreachBatch"],
                 "groups": [{"label": "...", "values": {"<series>": 1.0},
                             "ratios": {"<ours series>": {"<baseline>": 2.5}}}]}]}
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
IMAGES = BENCH.parent / "docs" / "img"

OURS_COLORS = ("#1f6fb4", "#4a9be0", "#0b3d66")
BASELINE_COLORS = ("#9a9a9a", "#c4c4c4", "#6e6e6e")


def json_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def png_path(name: str) -> Path:
    return IMAGES / f"bench-{name}.png"


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(BENCH.parent))
    except ValueError:
        return str(path)


# ---- recording ----------------------------------------------------------------------------------------------


def record(
    name: str, figures: dict[str, Any], *, full: bool = True, command: str | None = None
) -> Path | None:
    """Save ``figures`` as ``bench/results/<name>.json`` and render ``docs/img/bench-<name>.png``.

    Only a ``full`` run (the sizes and rounds docs/benchmarks.md records) replaces the saved figures: a
    quick or experimental run must not overwrite the documented chart. Returns the JSON path, if saved.
    """
    if not full:
        print(
            f"not a full run: {_shown(json_path(name))} and its chart keep the last "
            "full run's figures",
            flush=True,
        )
        return None
    document = {
        "name": name,
        "source": f"bench/{name.split('-')[0]}_bench.py, run on this machine",
        "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command or " ".join(["python", *sys.argv]),
        **figures,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = json_path(name)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"figures saved to {path}", flush=True)
    try:
        png = render(document)
    except ImportError:
        print(
            "matplotlib is not installed (pip install -e '.[bench]'): no chart rendered", flush=True
        )
    else:
        print(f"chart rendered to {png}", flush=True)
    return path


def _median(runs: Iterable[Mapping[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def server_figures(runs: Mapping[str, Mapping[str, list[dict]]], machine: Any = None) -> dict:
    """From ``server_bench.Results.runs``: ``{bench: {"ours"|"reference": [result, ...]}}``."""
    ours, ref = "durastream-server", "reference server"

    def group(label: str, bench: str, key: str) -> dict | None:
        if bench not in runs:
            return None
        a, b = _median(runs[bench]["ours"], key), _median(runs[bench]["reference"], key)
        if a is None or b is None:
            return None
        return {"label": label, "values": {ours: a, ref: b}}

    specs = [
        (
            "appends",
            "messages/s",
            True,
            [("8 producers, 64 x 1 KiB JSON", "append", "messages_per_s")],
        ),
        ("catch-up read", "MiB/s", True, [("from offset -1", "read", "mib_per_s")]),
        (
            "long-poll wake, 100 readers",
            "ms",
            False,
            [("p50", "longpoll", "p50_ms"), ("p99", "longpoll", "p99_ms")],
        ),
        (
            "server memory",
            "MiB RSS",
            False,
            [
                ("peak during the read", "read", "rss_peak_mib"),
                ("after writing 1,000 streams", "rss", "rss_after_mib"),
            ],
        ),
        ("writes across 1,000 streams", "MiB/s", True, [("16 writers", "rss", "write_mib_per_s")]),
    ]
    panels = []
    for title, unit, higher, items in specs:
        groups = [g for g in (group(*item) for item in items) if g is not None]
        if groups:
            panels.append(
                {
                    "title": title,
                    "unit": unit,
                    "higher_is_better": higher,
                    "ours": [ours],
                    "baselines": [ref],
                    "groups": groups,
                }
            )
    return {
        "title": "durastream-server vs @durable-streams/server (medians of rounds)",
        "machine": machine,
        "panels": panels,
    }


def sink_figures(
    median: Mapping[str, float],
    best: Mapping[str, float],
    ratios: Mapping[str, Mapping[str, float]],
    rows: int,
) -> dict:
    """From ``sink_bench.main``: rows/s per writer (median and best round) and median per-round ratios."""
    ours = [name for name in median if name.startswith("durastream")]
    baselines = [name for name in median if name not in ours]
    names = {"vs_naive": "naive foreachBatch", "vs_file_sink": "spark json file sink"}
    median_ratios = {
        name: {names[k]: v for k, v in per.items() if k in names} for name, per in ratios.items()
    }
    return {
        "title": f"Sink: one micro-batch of {rows:,} rows of ~1 KiB JSON",
        "panels": [
            {
                "title": "rows/s, median round",
                "unit": "rows/s",
                "higher_is_better": True,
                "ours": ours,
                "baselines": baselines,
                "groups": [{"label": "", "values": dict(median), "ratios": median_ratios}],
            },
            {
                "title": "rows/s, best round",
                "unit": "rows/s",
                "higher_is_better": True,
                "ours": ours,
                "baselines": baselines,
                "groups": [{"label": "", "values": dict(best)}],
            },
        ],
    }


SOURCE_PAIRS = (
    ("typed JSON", "durastream (typed)", "file json (typed)"),
    ("raw", "durastream (raw)", "file text (raw)"),
    (
        "typed, streaming\nAvailableNow",
        "durastream stream AvailableNow (typed)",
        "file json (typed)",
    ),
)


def source_figures(results: Sequence[Any], messages: int, size: int) -> dict:
    """From ``source_bench.main``: its ``Result`` records (dataclasses or dicts), best run of each read."""
    by_name = {}
    for result in results:
        item = asdict(result) if is_dataclass(result) else dict(result)
        by_name[item["name"]] = item
    ours, base = "durastream source", "Spark file source (page cache)"
    groups = [
        {"label": label, "values": {ours: by_name[a]["rows_per_s"], base: by_name[b]["rows_per_s"]}}
        for label, a, b in SOURCE_PAIRS
        if a in by_name and b in by_name
    ]
    return {
        "title": f"Source: {messages:,} JSON messages ({size / 1e6:,.0f} MB) into format('noop')",
        "panels": [
            {
                "title": "rows/s, best run",
                "unit": "rows/s",
                "higher_is_better": True,
                "ours": [ours],
                "baselines": [base],
                "groups": groups,
            }
        ],
    }


# ---- rendering ----------------------------------------------------------------------------------------------


def ratio(
    panel: Mapping[str, Any], group: Mapping[str, Any], ours: str, baseline: str
) -> float | None:
    given = (group.get("ratios") or {}).get(ours, {}).get(baseline)
    if given is not None:
        return float(given)
    a, b = group["values"].get(ours), group["values"].get(baseline)
    if not a or not b:
        return None
    return a / b if panel.get("higher_is_better", True) else b / a


def _short(name: str) -> str:
    return {
        "naive foreachBatch": "naive",
        "spark json file sink": "file sink",
        "reference server": "reference",
        "Spark file source (page cache)": "file source",
    }.get(name, name)


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    if value >= 10:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def render(document: Mapping[str, Any], output: Path | None = None) -> Path:
    """Render the panels of ``document`` into one PNG. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = document["panels"]
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(max(4.6 * columns, 8.0), 3.9 * rows + 0.4), squeeze=False
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        _panel(ax, panel)
    fig.suptitle(document.get("title", document["name"]), fontsize=11, fontweight="bold")
    legend: dict[str, Any] = {}
    for ax in axes.flat[: len(panels)]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(
        legend.values(),
        legend.keys(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.95),
        ncols=len(legend),
        fontsize=8,
        frameon=False,
    )
    note = document.get("recorded", "")
    if document.get("source"):
        note = f"{note} · {document['source']}" if note else document["source"]
    fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 0.91))
    path = output or png_path(document["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _panel(ax: Any, panel: Mapping[str, Any]) -> None:
    ours, baselines = list(panel["ours"]), list(panel["baselines"])
    series = ours + baselines
    groups = panel["groups"]
    width = 0.8 / len(series)
    colors = {name: OURS_COLORS[i % len(OURS_COLORS)] for i, name in enumerate(ours)}
    colors.update({n: BASELINE_COLORS[i % len(BASELINE_COLORS)] for i, n in enumerate(baselines)})
    top = max((v for g in groups for v in g["values"].values() if v), default=1.0)
    for i, name in enumerate(series):
        xs, heights = [], []
        for gi, group in enumerate(groups):
            if name in group["values"]:
                xs.append(gi - 0.4 + width * (i + 0.5))
                heights.append(group["values"][name])
        bars = ax.bar(xs, heights, width * 0.92, label=name, color=colors[name])
        for bar, value in zip(bars, heights, strict=True):
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height() + top * 0.01,
                _number(value),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    # Ratio labels: inside each bar of ours, how many times better than each baseline.
    for gi, group in enumerate(groups):
        for i, name in enumerate(ours):
            value = group["values"].get(name)
            if not value:
                continue
            lines = []
            for baseline in baselines:
                r = ratio(panel, group, name, baseline)
                if r is not None and r < 1 and panel.get("higher_is_better", True):
                    lines.append(f"{r:.0%} of\n{_short(baseline)}")
                elif r is not None:
                    lines.append(f"{r:.2f}x\n{_short(baseline)}")
            if not lines:
                continue
            x = gi - 0.4 + width * (i + 0.5)
            text = "\n".join(lines)
            if value >= top * 0.3:  # inside the bar
                ax.text(
                    x,
                    value / 2,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                    fontweight="bold",
                )
            else:  # a short bar: above its value label
                ax.text(
                    x,
                    value + top * 0.07,
                    text,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color=colors[name],
                    fontweight="bold",
                )
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g["label"] for g in groups], fontsize=8)
    better = "higher is better" if panel.get("higher_is_better", True) else "lower is better"
    ax.set_title(f"{panel['title']}\n({panel['unit']}, {better})", fontsize=9)
    ax.set_ylim(0, top * 1.12)
    ax.tick_params(axis="y", labelsize=7)
    ax.yaxis.set_major_formatter(lambda y, _: _number(y) if y else "0")
    ax.spines[["top", "right"]].set_visible(False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Re-render docs/img/bench-*.png from bench/results/."
    )
    parser.add_argument("names", nargs="*", help="benchmarks to render (default: every saved one)")
    args = parser.parse_args(argv)
    paths = [json_path(n) for n in args.names] if args.names else sorted(RESULTS.glob("*.json"))
    if not paths:
        parser.error(f"no saved figures in {RESULTS}")
    for path in paths:
        document = json.loads(path.read_text(encoding="utf-8"))
        print(f"{_shown(path)} -> {_shown(render(document))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
