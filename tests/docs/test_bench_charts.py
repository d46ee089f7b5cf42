"""bench/charts.py: the saved figures render, every chart is embedded in docs/benchmarks.md, and the
converters accept what the bench scripts hand them."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_charts", REPO / "bench" / "charts.py")
assert spec is not None and spec.loader is not None
charts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(charts)

SAVED = sorted((REPO / "bench" / "results").glob("*.json"))


def test_every_benchmark_has_saved_figures_a_chart_and_a_link() -> None:
    names = {path.stem for path in SAVED}
    assert {"server", "sink", "source"} <= names
    benchmarks_md = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for name in names:
        document = json.loads(charts.json_path(name).read_text(encoding="utf-8"))
        assert document["name"] == name
        assert document["source"], "say where the figures come from"
        assert document["panels"] and all(p["groups"] for p in document["panels"])
        assert charts.png_path(name).is_file(), f"run python bench/charts.py {name}"
        assert f"](img/bench-{name}.png)" in benchmarks_md, f"docs/benchmarks.md lacks bench-{name}"


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.stem)
def test_saved_figures_render(path: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the bench extra is not installed")
    document = json.loads(path.read_text(encoding="utf-8"))
    out = charts.render(document, tmp_path / "chart.png")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_server_figures_from_bench_results() -> None:
    runs = {
        "append": {
            "ours": [{"messages_per_s": 100.0}, {"messages_per_s": 140.0}],
            "reference": [{"messages_per_s": 40.0}],
        },
        "longpoll": {
            "ours": [{"p50_ms": 5.0, "p99_ms": 10.0}],
            "reference": [{"p50_ms": 20.0, "p99_ms": 60.0}],
        },
    }
    figures = charts.server_figures(runs, machine={"cores": 2})
    titles = [p["title"] for p in figures["panels"]]
    assert titles == ["appends", "long-poll wake, 100 readers"]
    append, longpoll = figures["panels"]
    group = append["groups"][0]
    assert group["values"]["durastream-server"] == 120.0
    assert charts.ratio(append, group, "durastream-server", "reference server") == 3.0
    p99 = longpoll["groups"][1]
    assert charts.ratio(longpoll, p99, "durastream-server", "reference server") == 6.0


def test_sink_and_source_figures() -> None:
    median = {
        "durastream (ordered)": 80.0,
        "spark json file sink": 160.0,
        "naive foreachBatch": 20.0,
    }
    ratios = {"durastream (ordered)": {"vs_naive": 3.5, "vs_file_sink": 0.45}}
    sink = charts.sink_figures(median, median, ratios, rows=1000)
    panel = sink["panels"][0]
    assert panel["ours"] == ["durastream (ordered)"]
    group = panel["groups"][0]
    # The bench's own median-of-rounds ratios win over the ratio of medians.
    assert charts.ratio(panel, group, "durastream (ordered)", "naive foreachBatch") == 3.5
    assert (
        charts.ratio(
            sink["panels"][1], sink["panels"][1]["groups"][0], *panel["ours"], "naive foreachBatch"
        )
        == 4.0
    )

    @dataclass
    class Result:  # as bench/source_bench.py's
        name: str
        rows_per_s: float

    results = [Result("file json (typed)", 200.0), Result("durastream (typed)", 100.0)]
    source = charts.source_figures(results, messages=10, size=10_000)
    (group,) = source["panels"][0]["groups"]
    assert group["values"] == {"durastream source": 100.0, "Spark file source (page cache)": 200.0}


def test_record_saves_only_full_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(charts, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(charts, "IMAGES", tmp_path / "img")
    figures = charts.sink_figures(
        {"durastream (ordered)": 2.0, "naive foreachBatch": 1.0}, {}, {}, 10
    )
    figures["panels"] = figures["panels"][:1]
    assert charts.record("sink", figures, full=False, command="quick") is None
    assert not (tmp_path / "results").exists()
    saved = charts.record("sink", figures, command="python bench/sink_bench.py")
    assert saved == tmp_path / "results" / "sink.json"
    document = json.loads(saved.read_text(encoding="utf-8"))
    assert document["source"] and document["command"] == "python bench/sink_bench.py"
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "img" / "bench-sink.png").is_file()
