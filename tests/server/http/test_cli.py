"""The command line: flag validation, the startup line, a locked data dir, a busy port, clean SIGTERM."""

from __future__ import annotations

import subprocess
import sys

import pytest

from durastream_server.cli import build_parser, config_from_args, main
from durastream_server.storage.datadir import Durability


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--port", "abc"], "--port"),
        (["--port", "70000"], "--port"),
        (["--long-poll-timeout", "0"], "--long-poll-timeout"),
        (["--long-poll-timeout", "nan"], "--long-poll-timeout"),
        (["--long-poll-timeout", "soon"], "--long-poll-timeout"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--max-body-bytes", "1.5"], "--max-body-bytes"),
        (["--chunk-bytes", "-5"], "--chunk-bytes"),
        (["--durability", "maybe"], "--durability"),
        (["--sse-reconnect-seconds", "-1"], "--sse-reconnect-seconds"),
        (["--log-level", "loud"], "--log-level"),
        (["--no-such-flag"], "--no-such-flag"),
    ],
)
def test_bad_flag_values_are_usage_errors_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def test_defaults_and_flags_map_onto_the_config(tmp_path) -> None:
    defaults = config_from_args(build_parser().parse_args([]))
    assert (defaults.host, defaults.port, defaults.long_poll_timeout) == ("127.0.0.1", 4437, 30.0)
    assert defaults.durability is Durability.FSYNC
    config = config_from_args(
        build_parser().parse_args(
            [
                "--data-dir",
                str(tmp_path),
                "--port",
                "0",
                "--long-poll-timeout",
                "0.5",
                "--max-body-bytes",
                "10",
                "--durability",
                "none",
                "--chunk-bytes",
                "7",
                "--log-level",
                "debug",
            ]
        )
    )
    assert config.data_dir == tmp_path
    assert (config.port, config.long_poll_timeout, config.max_body_bytes) == (0, 0.5, 10)
    assert (config.durability, config.chunk_bytes, config.log_level) == (
        Durability.NONE,
        7,
        "DEBUG",
    )


def test_startup_line_and_clean_sigterm(server_factory) -> None:
    server = server_factory()
    root = f"http://127.0.0.1:{server.port}/v1/stream"
    assert f"serving {root} (data dir: " in server.log_path.read_text()
    assert server.terminate() == 0
    assert "Traceback" not in server.log_path.read_text()


def test_second_server_on_the_same_data_dir_exits_2(server_factory) -> None:
    server = server_factory()
    second = server.start_second_on_same_data_dir()
    assert second.returncode == 2
    assert "--data-dir" in second.stderr and "locked" in second.stderr
    assert server.health()["status"] == "ok"  # the first one is untouched


def test_busy_port_is_a_clear_error(server_factory, tmp_path) -> None:
    server = server_factory()
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "durastream_server",
            "--data-dir",
            str(tmp_path / "other"),
            "--port",
            str(server.port),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 1
    assert "--port" in completed.stderr and "cannot listen" in completed.stderr


@pytest.mark.parametrize("under", [False, True], ids=["the-file", "under-a-file"])
def test_a_data_dir_that_is_a_file_is_named_as_such(
    tmp_path, under: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("not a directory")
    data_dir = blocker / "data" if under else blocker
    code = main(["--data-dir", str(data_dir), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"--data-dir {data_dir}" in err
    assert f"{blocker} is a file, not a directory" in err
    assert "Errno" not in err
    assert blocker.read_text() == "not a directory"  # untouched
