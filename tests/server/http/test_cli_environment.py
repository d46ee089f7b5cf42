"""Operators configure the server by environment variables too, and it greets them with the stream root.

Every flag reads ``DURASTREAM_<FLAG>`` (derived from the argparse definitions, shown in ``--help``); the
command line wins; values are checked like arguments. The first stdout line names the stream root (the
connector's ``url``), and the webhook signing key id stays out of the INFO log.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from durastream_server import __version__, environment
from durastream_server.cli import build_parser, config_from_args, main, parse_args, startup_line
from durastream_server.config import ServerConfig
from durastream_server.storage.datadir import Durability
from durastream_server.subscriptions.signing import WebhookSigner
from tests.support.server_process import read_line

TOKEN = "env-token-" + "x" * 24


def test_every_flag_shows_its_variable_in_help() -> None:
    parser = build_parser()
    text = " ".join(parser.format_help().split())
    flags = environment.configurable(parser)
    assert len(flags) >= 20
    for action in flags:
        long = next(f for f in action.option_strings if f.startswith("--"))
        name = "DURASTREAM_" + long[2:].upper().replace("-", "_")
        assert f"[env: {name}]" in text, f"--help does not show {name} for {long}"
    assert "[env: DURASTREAM_DATA_DIR]" in text
    assert "the command line wins over the environment" in text
    assert "DURASTREAM_HELP" not in text and "DURASTREAM_VERSION" not in text


def test_a_flag_added_later_gets_its_variable_without_more_code() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--max-frobs", type=int, default=3, help="frobs at most")
    parser.add_argument("--loud", action="store_true")
    parser.add_argument("--tag", action="append", default=[])
    environment.with_environment(parser)
    assert "[env: DURASTREAM_MAX_FROBS]" in parser.format_help()
    env = {"DURASTREAM_MAX_FROBS": "7", "DURASTREAM_LOUD": "true", "DURASTREAM_TAG": "a, b"}
    args = environment.parse_with_environment(parser, [], env)
    assert (args.max_frobs, args.loud, args.tag) == (7, True, ["a", "b"])
    args = environment.parse_with_environment(parser, [], {})
    assert (args.max_frobs, args.loud, args.tag) == (3, False, [])
    parser.add_argument("--zone", required=True)
    environment.with_environment(parser)
    assert environment.parse_with_environment(parser, [], {"DURASTREAM_ZONE": "z"}).zone == "z"
    with pytest.raises(SystemExit):
        environment.parse_with_environment(parser, [], {})


def test_the_environment_configures_every_kind_of_flag(tmp_path: Path) -> None:
    env = {
        "DURASTREAM_DATA_DIR": str(tmp_path / "data"),
        "DURASTREAM_PORT": "5123",
        "DURASTREAM_MAX_BODY_BYTES": "64m",
        "DURASTREAM_CHUNK_BYTES": "1 MiB",
        "DURASTREAM_LONG_POLL_TIMEOUT": "2.5",
        "DURASTREAM_DURABILITY": "none",
        "DURASTREAM_CORS_ORIGIN": "https://a.example,https://b.example",
        "DURASTREAM_AUTH_TOKEN": f"{TOKEN}:read-only",
        "DURASTREAM_LOG_LEVEL": "debug",
        "DURASTREAM_WEBHOOK_LOCALHOST": "deny",
    }
    config = config_from_args(parse_args(build_parser(), [], env))
    assert config.data_dir == tmp_path / "data"
    assert (config.port, config.long_poll_timeout, config.log_level) == (5123, 2.5, "DEBUG")
    assert (config.max_body_bytes, config.chunk_bytes) == (64 << 20, 1 << 20)
    assert config.durability is Durability.NONE
    assert config.cors_origins == ("https://a.example", "https://b.example")
    assert [t.mode.value for t in config.auth_tokens] == ["read-only"]
    assert config.webhook_localhost == "deny"


def test_the_command_line_wins_over_the_environment() -> None:
    env = {
        "DURASTREAM_PORT": "5123",
        "DURASTREAM_CORS_ORIGIN": "https://a.example,https://b.example",
    }
    args = parse_args(build_parser(), ["--port", "6000", "--cors-origin", "https://c.example"], env)
    assert (args.port, args.cors_origin) == (6000, ["https://c.example"])
    defaults = parse_args(build_parser(), [], {})
    assert (defaults.port, defaults.cors_origin) == (4437, [])


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("DURASTREAM_PORT", "70000", "expected a port in 0..65535"),
        ("DURASTREAM_MAX_BODY_BYTES", "1.5g", "512k, 64m, 1g"),
        ("DURASTREAM_DURABILITY", "maybe", "invalid choice 'maybe'"),
        ("DURASTREAM_AUTH_TOKEN", f"{TOKEN}:admin", "MODE"),
    ],
)
def test_a_bad_variable_is_a_usage_error_naming_it(
    variable: str,
    value: str,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: environment variable {variable}: " in err and expected in err
    assert TOKEN not in err


def test_the_startup_line_names_the_stream_root() -> None:
    local = ServerConfig(data_dir=Path("d"))
    assert startup_line(local, "http://127.0.0.1:4437") == (
        f"durastream-server {__version__} serving http://127.0.0.1:4437/v1/stream "
        "(data dir: d; listening on http://127.0.0.1:4437)"
    )
    public = ServerConfig(data_dir=Path("d"), public_url="https://streams.example.com/ds")
    assert startup_line(public, "http://0.0.0.0:4437").startswith(
        f"durastream-server {__version__} serving https://streams.example.com/ds/v1/stream "
    )


def test_signing_key_id_is_logged_at_debug_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="durastream_server")
    signer = WebhookSigner.load_or_create(tmp_path)
    records = [r for r in caplog.records if signer.active_kid in r.getMessage()]
    assert [r.levelno for r in records] == [logging.DEBUG]


def test_a_server_configured_only_by_the_environment(tmp_path: Path) -> None:
    data = tmp_path / "from-env"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURASTREAM_")}
    env.update(DURASTREAM_DATA_DIR=str(data), DURASTREAM_PORT="0", DURASTREAM_LOG_LEVEL="INFO")
    process = subprocess.Popen(
        [sys.executable, "-m", "durastream_server"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(process, timeout=60)
        match = re.fullmatch(
            rf"durastream-server {re.escape(__version__)} serving (http://127\.0\.0\.1:\d+)/v1/stream "
            rf"\(data dir: {re.escape(str(data))}; listening on \1\)\n",
            line,
        )
        assert match, line
        with urllib.request.urlopen(match.group(1) + "/healthz", timeout=10) as response:
            assert response.status == 200
        assert (data / "LOCK").exists()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0
    assert "webhook signing key" not in stderr and "ds_" not in stderr
