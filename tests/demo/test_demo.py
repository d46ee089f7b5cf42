"""``python -m durastream_spark.demo`` (what ``make demo`` runs): the pipeline, its summary, its pieces."""

from __future__ import annotations

import io
import re
import urllib.error
import urllib.request

import pytest

from durastream_spark.demo import cli
from durastream_spark.demo.display import Display, Snapshot, human_bytes, plain_line
from durastream_spark.demo.pipeline import (
    MAX_RESTARTS,
    Pipeline,
    Proof,
    QueryStats,
    source_lag_bytes,
)
from durastream_spark.demo.server import BundledServer, DemoError
from tests.demo.support import SUMMARY, assert_demo_passed, parse_summary, run_demo

ROWS = 3000


def test_demo_proves_exactly_once_and_stops_its_server() -> None:
    run = run_demo("--rows", str(ROWS), "--seconds", "6", timeout=400)
    assert_demo_passed(run, ROWS)
    assert "Exactly-once check" in run.stdout
    assert "AvailableNow" in run.stdout
    started = re.search(
        r"Started the bundled durastream-server: (http://\S+)/v1/stream", run.stdout
    )
    assert started, run.explain()
    assert "Stopped the bundled server." in run.stdout
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(started.group(1) + "/healthz", timeout=2)


# ---- the pieces, without Spark --------------------------------------------------------------------------


def proof(**changes: object) -> Proof:
    values = dict(
        expected=100,
        produced=100,
        read=100,
        distinct=100,
        in_range=100,
        live=100,
        live_matches=True,
    )
    values.update(changes)
    return Proof(**values)  # type: ignore[arg-type]


def test_summary_line_is_what_the_tests_parse() -> None:
    good = parse_summary(proof().line())
    assert good == {
        "verdict": "EXACTLY-ONCE",
        "produced": 100,
        "read": 100,
        "live": 100,
        "duplicates": 0,
        "missing": 0,
        "restarts": 0,
    }
    assert SUMMARY.search(proof(read=101).line())


@pytest.mark.parametrize(
    "changes",
    [
        {"read": 101, "distinct": 100},  # a duplicate
        {"read": 99, "distinct": 99, "in_range": 99},  # a lost row
        {"produced": 90},  # the writer did not commit everything
        {"live": 99},  # the live query missed rows
        {"live_matches": False},
        {"read": 101, "distinct": 101},  # an id outside 0..rows-1
    ],
)
def test_proof_fails_on_any_discrepancy(changes: dict) -> None:
    failed = proof(**changes)
    assert not failed.ok
    assert "FAILED" in failed.line()


def test_duplicates_and_missing_are_counted() -> None:
    p = proof(read=103, distinct=98, in_range=98)
    assert (p.duplicates, p.missing) == (5, 2)


def test_lag_comes_from_latest_offset() -> None:
    report = {
        "sources": [
            {
                "endOffset": '{"demo/a":"0000000000000000_0000000000000100"}',
                "latestOffset": '{"demo/a":"0000000000000000_0000000000000350"}',
            }
        ]
    }
    assert source_lag_bytes(report) == 250
    report["sources"][0]["endOffset"] = '{"demo/a":"-1"}'
    assert source_lag_bytes(report) == 350
    report["sources"][0]["latestOffset"] = '{"demo/a":"opaque-token"}'  # another server's offsets
    assert source_lag_bytes(report) is None
    assert source_lag_bytes({"sources": [{"endOffset": None, "latestOffset": None}]}) is None


def test_query_stats_fold_progress_per_batch() -> None:
    class Progress:
        def __init__(self, batch: int, rows: int) -> None:
            self.json = f'{{"batchId": {batch}, "numInputRows": {rows}, "sources": []}}'

    class Query:
        recentProgress = [Progress(0, 0), Progress(1, 40), Progress(2, 0), Progress(2, 60)]

    stats = QueryStats("q")
    stats.update(Query())
    stats.update(Query())  # seen again: not counted twice
    assert (stats.rows, stats.batch_count) == (100, 2)


def snapshot() -> Snapshot:
    writer, live = QueryStats("writer", {1: 600}), QueryStats("live", {1: 500}, lag_bytes=4096)
    return Snapshot(
        elapsed=3.0, phase="writing", expected=1000, produced=600, writer=writer, live=live
    )


def test_display_redraws_on_a_terminal_and_prints_lines_otherwise() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    display = Display(live=True, out=terminal)
    display.show(snapshot())
    display.show(snapshot())
    assert "\x1b[3F\x1b[J" in terminal.getvalue()  # the second frame replaces the first
    assert "lag 100 rows (4.0 KiB)" in terminal.getvalue()
    display.finish()
    display.message("summary")  # after finish(): printed below the last frame, nothing erased
    assert terminal.getvalue().endswith("\nsummary\n")
    assert terminal.getvalue().count("\x1b[3F") == 1

    pipe = io.StringIO()
    plain = Display(live=True, out=pipe)  # not a terminal: plain lines whatever --no-live says
    plain.show(snapshot())
    plain.show(snapshot())  # within the interval: not printed again
    assert pipe.getvalue() == plain_line(snapshot()) + "\n"
    assert "\x1b" not in pipe.getvalue()


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (None, 0, 2048, 3 * 1024**3)] == [
        "n/a",
        "0 B",
        "2.0 KiB",
        "3.0 GiB",
    ]


def test_without_the_bundled_server_the_error_says_how_to_install_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(DemoError, match=r"pip install durastream-server.*pip install \./server"):
        BundledServer(tmp_path).start()


def test_bad_header_flag_is_a_clear_error(capsys) -> None:
    assert cli.main(["--url", "http://127.0.0.1:9/v1/stream", "--header", "nonsense"]) == 1
    assert "--header 'nonsense': expected NAME=VALUE" in capsys.readouterr().err


def test_flags_and_defaults() -> None:
    args = cli.build_parser().parse_args([])
    assert (args.url, args.master, args.rows, args.seconds, args.no_live) == (
        None,
        "local[2]",
        20_000,
        20.0,
        False,
    )
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--rows", "0"])


def test_a_failed_query_is_restarted_from_its_checkpoint_a_few_times(tmp_path) -> None:
    class Failed:
        name = "demo_writer"
        isActive = False

        def exception(self) -> Exception:
            return RuntimeError("Python worker failed to connect back.\n  at ...")

    pipeline = Pipeline(spark=None, url="u", stream="s", rows=10, seconds=1, workdir=tmp_path)
    starts = []
    pipeline.start_writer = lambda: starts.append("writer")  # type: ignore[method-assign]
    pipeline.writer = Failed()
    for _ in range(MAX_RESTARTS):
        [message] = pipeline.restart_failed()
        assert "demo_writer failed (Python worker failed to connect back.)" in message
    assert starts == ["writer"] * MAX_RESTARTS
    with pytest.raises(DemoError, match="failed 4 times"):
        pipeline.restart_failed()
    assert "restarts=3" in proof(restarts=3).line()
