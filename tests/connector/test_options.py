"""Option parsing: every error names the option, the value and what is accepted; secrets never show."""

from __future__ import annotations

import pickle

import pytest

from durastream_spark.errors import OptionError
from durastream_spark.options import (
    CONNECTION_KEYS,
    ConnectionOptions,
    OptionReader,
    Secret,
    parse_url,
)
from durastream_spark.protocol.retry import RetryPolicy

ROOT = "http://127.0.0.1:4437/v1/stream"
TOKEN = "s3cr3t-t0ken-value"


def parse(**options: str) -> ConnectionOptions:
    return ConnectionOptions.parse({"url": ROOT, **options})


def assert_names(
    error: OptionError, option: str, value: str | None, accepted_fragment: str
) -> None:
    text = str(error)
    assert f"'{option}'" in text
    if value is not None:
        assert repr(value) in text
    assert accepted_fragment in text
    assert error.option == option


# ---- defaults and happy paths --------------------------------------------------------------------------


def test_defaults() -> None:
    options = ConnectionOptions.parse({"url": ROOT + "/"})
    assert options.url == ROOT  # trailing slash removed
    assert options.headers == ()
    assert options.token_file is None
    assert options.tls_verify is True and options.verify is True
    assert options.request_timeout_s == 30.0
    assert options.max_connections == 32
    assert options.retry == RetryPolicy(
        max_attempts=10, max_elapsed_s=120.0, initial_backoff_s=0.1, max_backoff_s=10.0
    )


def test_keys_are_case_insensitive_and_typed() -> None:
    options = ConnectionOptions.parse(
        {
            "URL": ROOT,
            "RequestTimeoutMS": "2s",
            "retry.MAXATTEMPTS": " 3 ",
            "retry.maxElapsedMs": "1m",
            "retry.initialBackoffMs": "250ms",
            "retry.maxBackoffMs": "1500",
            "tls.verify": "FALSE",
            "maxConnections": "8",
        }
    )
    assert options.request_timeout_s == 2.0
    assert options.retry == RetryPolicy(
        max_attempts=3, max_elapsed_s=60.0, initial_backoff_s=0.25, max_backoff_s=1.5
    )
    assert options.verify is False
    assert options.max_connections == 8


def test_headers_become_secrets() -> None:
    options = parse(**{"header.Authorization": f"Bearer {TOKEN}", "header.X-Tenant": "acme"})
    assert options.header_names == ("Authorization", "X-Tenant")
    assert options.reveal_headers() == {"Authorization": f"Bearer {TOKEN}", "X-Tenant": "acme"}
    assert all(isinstance(value, Secret) for _, value in options.headers)


def test_spark_case_insensitive_dict() -> None:
    # What Spark really passes: PySpark's CaseInsensitiveDict, which lower-cases every key.
    from pyspark.sql.datasource import CaseInsensitiveDict

    spark_options = CaseInsensitiveDict(
        {"url": ROOT, "header.Authorization": "Bearer x", "retry.maxAttempts": "2"}
    )
    reader = OptionReader(spark_options)
    reader.ensure_known(CONNECTION_KEYS)
    options = ConnectionOptions.parse(reader)
    assert options.reveal_headers() == {
        "authorization": "Bearer x"
    }  # HTTP names are case-insensitive
    assert options.retry.max_attempts == 2


def test_ca_bundle_is_the_verify_argument(tmp_path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    options = parse(**{"tls.caBundle": str(bundle)})
    assert options.verify == str(bundle)


# ---- secrets ---------------------------------------------------------------------------------------------


def test_repr_and_str_hide_header_values() -> None:
    options = parse(**{"header.Authorization": f"Bearer {TOKEN}", "header.X-Api-Key": TOKEN})
    for text in (repr(options), str(options), repr(options.headers), str(options.headers)):
        assert TOKEN not in text
    assert "Authorization" in repr(options)
    assert "X-Api-Key" in repr(options)


def test_pickle_round_trip_keeps_values_and_hides_them() -> None:
    options = parse(**{"header.Authorization": f"Bearer {TOKEN}", "retry.maxAttempts": "4"})
    copy = pickle.loads(pickle.dumps(options))
    assert copy == options
    assert copy.reveal_headers() == {"Authorization": f"Bearer {TOKEN}"}
    assert TOKEN not in repr(copy)
    with pytest.raises(AttributeError):
        copy.url = "http://elsewhere"  # type: ignore[misc]


def test_header_value_errors_do_not_echo_the_value() -> None:
    with pytest.raises(OptionError) as caught:
        parse(**{"header.X-Api-Key": f"{TOKEN}\r\nX-Evil: 1"})
    assert TOKEN not in str(caught.value)
    assert "header.X-Api-Key" in str(caught.value)
    assert "<redacted>" in str(caught.value)


def test_unknown_key_error_does_not_echo_its_value() -> None:
    reader = OptionReader({"url": ROOT, "authorization": TOKEN})
    with pytest.raises(OptionError) as caught:
        reader.ensure_known(CONNECTION_KEYS)
    assert TOKEN not in str(caught.value)
    assert "'authorization'" in str(caught.value)


def test_url_with_credentials_is_refused_without_echoing_the_password() -> None:
    with pytest.raises(OptionError) as caught:
        parse_url(f"http://user:{TOKEN}@127.0.0.1:4437/v1/stream")
    assert TOKEN not in str(caught.value)
    assert "header.Authorization" in str(caught.value)


# ---- errors name option, value and accepted values -----------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "accepted"),
    [
        ("retry.maxAttempts", "0", "an integer from 1 to 1000"),
        ("retry.maxAttempts", "three", "an integer from 1 to 1000"),
        ("maxConnections", "5000", "an integer from 1 to 1024"),
        ("tls.verify", "yes", "true or false"),
        ("requestTimeoutMs", "10 parsecs", "a duration in milliseconds"),
        ("requestTimeoutMs", "0", "from 1 to 3600000 ms"),
        ("requestTimeoutMs", "0.5ms", "a duration in milliseconds"),
        ("retry.maxElapsedMs", "-1", "a duration in milliseconds"),
    ],
)
def test_bad_values_name_option_value_and_accepted(option: str, value: str, accepted: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse(**{option: value})
    assert_names(caught.value, option, value, accepted)
    assert isinstance(caught.value, ValueError)


def test_max_backoff_below_initial_is_refused() -> None:
    with pytest.raises(OptionError) as caught:
        parse(**{"retry.initialBackoffMs": "500", "retry.maxBackoffMs": "100"})
    assert_names(caught.value, "retry.maxBackoffMs", "100", ">= retry.initialBackoffMs (500 ms)")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://127.0.0.1/v1/stream", "http or https"),
        ("http:///v1/stream", "no host"),
        ("http://127.0.0.1:4437/v1/stream?x=1", "no query"),
        ("http://127.0.0.1:4437/v1/stream#frag", "no query or fragment"),
        ("http://127.0.0.1:notaport/v1/stream", "port"),
        ("127.0.0.1:4437/v1/stream", "http or https"),
    ],
)
def test_bad_urls(url: str, reason: str) -> None:
    with pytest.raises(OptionError) as caught:
        ConnectionOptions.parse({"url": url})
    assert_names(caught.value, "url", url, "http:// or https://")
    assert reason in str(caught.value)


def test_missing_url() -> None:
    with pytest.raises(OptionError) as caught:
        ConnectionOptions.parse({"retry.maxAttempts": "3"})
    assert "'url' is required" in str(caught.value)
    assert "http(s) stream root" in str(caught.value)


@pytest.mark.parametrize(
    "name", ["Content-Type", "Producer-Id", "stream-closed", "Durastream-Txn", "Host"]
)
def test_reserved_headers_are_refused(name: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse(**{f"header.{name}": "x"})
    assert f"header.{name}" in str(caught.value)
    assert "reserved header" in str(caught.value)


def test_invalid_header_name() -> None:
    with pytest.raises(OptionError) as caught:
        parse(**{"header.Bad Name": "x"})
    assert "header.Bad Name" in str(caught.value)
    assert "HTTP header name" in str(caught.value)


def test_token_file_must_exist_and_conflicts_with_authorization_header(tmp_path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(OptionError) as caught:
        parse(tokenFile=str(missing))
    assert_names(caught.value, "tokenFile", str(missing), "a readable file")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    with pytest.raises(OptionError) as caught:
        parse(tokenFile=str(token), **{"header.Authorization": "Bearer x"})
    assert "not both" in str(caught.value)
    options = parse(tokenFile=str(token))
    assert TOKEN not in repr(options)  # only the path is kept, never the content


def test_ca_bundle_checks(tmp_path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(OptionError) as caught:
        parse(**{"tls.caBundle": str(missing)})
    assert_names(caught.value, "tls.caBundle", str(missing), "a readable file or directory")
    missing.write_text("x")
    with pytest.raises(OptionError) as caught:
        parse(**{"tls.caBundle": str(missing), "tls.verify": "false"})
    assert "tls.verify" in str(caught.value)


def test_duplicate_keys_differing_in_case_are_refused() -> None:
    with pytest.raises(OptionError) as caught:
        OptionReader({"url": ROOT, "URL": ROOT})
    assert "given twice" in str(caught.value)


# ---- the toolkit ------------------------------------------------------------------------------------------


def test_ensure_known_suggests_and_lists() -> None:
    reader = OptionReader({"url": ROOT, "retry.maxAttempt": "3", "header.X-Any": "ok"})
    with pytest.raises(OptionError) as caught:
        reader.ensure_known(CONNECTION_KEYS | {"stream"})
    text = str(caught.value)
    assert "Unknown option 'retry.maxAttempt'" in text
    assert "did you mean 'retry.maxAttempts'" in text
    for key in ("url", "stream", "tokenFile", "tls.caBundle", "header.<Name>"):
        assert key in text
    OptionReader({"url": ROOT, "header.X-Any": "ok", "STREAM": "a"}).ensure_known(
        CONNECTION_KEYS | {"stream"}
    )


def test_choice_json_and_prefixed() -> None:
    reader = OptionReader(
        {"mode": "Transactional", "offsets": '{"a": "0_1"}', "bad": "{", "p.One": "1", "p.two": "2"}
    )
    assert reader.choice("mode", "auto", ["auto", "transactional", "ordered"]) == "transactional"
    assert reader.choice("missing", "auto", ["auto"]) == "auto"
    assert reader.json_value("offsets") == {"a": "0_1"}
    assert reader.prefixed("p.") == {"One": "1", "two": "2"}
    with pytest.raises(OptionError) as caught:
        reader.json_value("bad", accepted='JSON like {"path": "<offset>"}')
    assert_names(caught.value, "bad", "{", 'JSON like {"path": "<offset>"}')
    assert "not valid JSON" in str(caught.value)
    with pytest.raises(OptionError) as caught:
        OptionReader({"mode": "fast"}).choice("mode", "auto", ["auto", "ordered"])
    assert_names(caught.value, "mode", "fast", "one of 'auto', 'ordered'")


def test_integer_bounds_and_defaults() -> None:
    reader = OptionReader({"n": "+7", "m": "-3", "empty": "  "})
    assert reader.integer("n", 1, minimum=0) == 7
    assert reader.integer("absent", 42) == 42
    with pytest.raises(OptionError) as caught:
        reader.integer("m", 1, minimum=0)
    assert_names(caught.value, "m", "-3", "an integer >= 0")
    with pytest.raises(OptionError):
        reader.string("empty")
    with pytest.raises(OptionError):
        reader.integer("empty", 1)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1500", 1500),
        ("250ms", 250),
        ("1.5s", 1500),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("3 S", 3000),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert OptionReader({"d": text}).duration_ms("d", 0) == ms


def test_option_error_pickles() -> None:
    error = OptionError("retry.maxAttempts", "0", "an integer from 1 to 1000")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)
    assert copy.option == "retry.maxAttempts"


def test_the_sinks_default_request_fits_the_servers_default_message_cap() -> None:
    """A sink request carries at most maxMessagesPerRequest rows; durastream-server refuses requests of
    more than --max-messages-per-request messages (413 TOO_MANY_MESSAGES)."""
    server_config = pytest.importorskip("durastream_server.config")
    from durastream_spark.sink.options import DEFAULT_MAX_MESSAGES_PER_REQUEST

    assert DEFAULT_MAX_MESSAGES_PER_REQUEST <= server_config.DEFAULT_MAX_MESSAGES_PER_REQUEST
