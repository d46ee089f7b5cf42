"""Property: any option dict given to the data source's entry points yields a reader/writer or an
``OptionError`` naming the option and what is accepted; never another exception, never a secret in it.

Driven through ``DurableStreamDataSource`` exactly as Spark calls it (a case-insensitive options dict, then
``schema``/``reader``/``streamReader``/``writer``/``streamWriter``), which parse on construction and contact
no server.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import StringType, StructField, StructType

from durastream_spark import DurableStreamDataSource
from durastream_spark.errors import DurastreamError, OptionError, TransportError
from durastream_spark.options import CONNECTION_KEYS
from durastream_spark.sink.options import SINK_KEYS, SPARK_PASSTHROUGH_KEYS
from durastream_spark.source.options import SOURCE_KEYS

SECRET = "SECRETVALUE-7c1d"
ROOT = "http://127.0.0.1:1/v1/stream"
KNOWN = sorted(CONNECTION_KEYS | SOURCE_KEYS | SINK_KEYS | SPARK_PASSTHROUGH_KEYS | {"path"})

_text = st.text(max_size=30)
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["0", "1", "-1", "1.5", "1e3", " 7 ", "0x10", "１２", "99999999999999999999"]),
)
_durations = st.one_of(
    st.sampled_from(["250ms", "30s", "5m", "1h", "1.5s", "0.0001s", "1d", "ms", "-5s", "1 h"]),
    st.tuples(st.integers(-5, 10**12), st.sampled_from(["", "ms", "s", "m", "h", "x"])).map(
        lambda t: f"{t[0]}{t[1]}"
    ),
)
_sizes = st.sampled_from(["1k", "32m", "1g", "2t", "1023", "1024", "0", "1 kib", "9" * 30, "12q"])
_json = st.one_of(
    st.sampled_from(
        [
            "earliest",
            "latest",
            "{}",
            "[]",
            "null",
            '{"a": "-1"}',
            '{"a": 5}',
            '{"a": "0000000000000000_0000000000000000"}',
            '{"b": "latest"}',
            '{"a": {"x": 1}}',
            "{bad",
        ]
    ),
    st.dictionaries(_text, st.one_of(_text, st.integers(), st.none()), max_size=3).map(str),
)
_paths = st.sampled_from(["a", "a,b", "a,a", "a/b", "/a/", "a//b", "..", ".", "", " ", "a,,b", "*"])
_patterns = st.sampled_from(["*", "**", "a/*", "a/**/b", "/a", "a/**x", "", "a/b"])
_urls = st.one_of(
    st.just(ROOT),
    st.sampled_from(
        [
            "https://example.com/v1/stream/",
            "ftp://x/y",
            "http://",
            "http://h:99999/",
            "http://user:pw@h/",
            "http://h/?q=1",
            "http://h/#f",
            "not a url",
            "",
            "http://[::1/",
        ]
    ),
    _text,
)
_values = st.one_of(
    _text,
    _numbers,
    _durations,
    _sizes,
    _json,
    _paths,
    _patterns,
    st.sampled_from(["true", "FALSE", "yes"]),
)
_header_values = st.one_of(
    st.just(f"Bearer {SECRET}"),
    st.sampled_from([f"{SECRET}\r\nX: 1", f"{SECRET}\x00", f" {SECRET} "]),
)
_header_names = st.one_of(
    st.sampled_from(
        ["Authorization", "X-Api-Key", "Content-Type", "Stream-Seq", "Host", "Bad Name", "", "é"]
    ),
    st.text(max_size=12),
)
_key_case = st.sampled_from([str, str.lower, str.upper])


READ_KEYS = sorted(CONNECTION_KEYS | SOURCE_KEYS)
# Writers ask the server for its extensions while planning: keep them at one attempt (fail fast).
WRITE_KEYS = sorted((CONNECTION_KEYS | SINK_KEYS | SPARK_PASSTHROUGH_KEYS) - {"retry.maxAttempts"})
PLAUSIBLE = {
    "streams": ["a", "a,b", "x/y/z"],
    "pattern": ["a/*", "**"],
    "startingOffsets": ["earliest", "latest", '{"a": "-1"}', '{"a": "now"}'],
    "endingOffsets": ["latest", '{"a": "latest"}'],
    "maxMessagesPerTrigger": ["100"],
    "maxBytesPerTrigger": ["1m", "4096"],
    "failOnDataLoss": ["false", "TRUE"],
    "minPartitions": ["4"],
    "maxBytesPerPartition": ["64m"],
    "maxMessagesPerPartition": ["1000"],
    "fallback.pinPrefix": ["__pins", "p/q"],
    "fallback.pinTtl": ["2h", "3600s"],
    "stream": ["x", "x/y"],
    "contentType": ["text/plain", "application/json; charset=utf-8"],
    "createStreams": ["false"],
    "producerId": ["p-1"],
    "maxMessagesPerRequest": ["500"],
    "maxBytesPerRequest": ["65536"],
    "maxInFlight": ["2"],
    "exactlyOnce": ["ordered", "transactional", "AUTO"],
    "transactionTtl": ["1h", "60s"],
    "tls.verify": ["false", "true"],
    "tls.caBundle": ["/etc/ssl/certs", "/nonexistent.pem"],
    "requestTimeoutMs": ["5s", "1500"],
    "maxConnections": ["8"],
    "retry.maxAttempts": ["3"],
    "retry.maxElapsedMs": ["10s"],
    "retry.initialBackoffMs": ["50ms"],
    "retry.maxBackoffMs": ["2s", "10"],
    "checkpointLocation": ["/tmp/chk"],
    "queryName": ["q"],
}


@st.composite
def option_dicts(draw: st.DrawFn, writing: bool) -> dict[str, str]:
    """Mostly plausible options with a few hostile values, so parsing gets deep before it fails."""
    options: dict[str, str] = {"retry.maxAttempts": "1"}
    if draw(st.integers(0, 9)):  # mostly a usable url, so parsing goes past it
        options["url"] = ROOT if draw(st.integers(0, 3)) else draw(_urls)
    if draw(st.integers(0, 9)):
        options["stream" if writing else draw(st.sampled_from(["streams", "pattern"]))] = "a"
    for key in draw(st.lists(st.sampled_from(WRITE_KEYS if writing else READ_KEYS), max_size=5)):
        plausible = st.sampled_from(PLAUSIBLE.get(key, ["1"]))
        value = draw(plausible) if draw(st.integers(0, 2)) else draw(_values)
        options[key if draw(st.integers(0, 5)) else draw(_key_case)(key)] = value
    for _ in range(draw(st.integers(0, 2))):
        options[f"header.{draw(_header_names)}"] = draw(_header_values)
    if draw(st.integers(0, 7)) == 0:
        options[draw(st.sampled_from(KNOWN + ["x"]))] = draw(_values)  # maybe unknown for this side
    if draw(st.integers(0, 5)) == 0:
        options["tokenFile"] = draw(
            st.sampled_from(["/nonexistent/token", "/", "", "/etc/hostname"])
        )
    return options


VALUE_SCHEMA = StructType([StructField("value", StringType())])
ENTRY_POINTS = {
    "schema": lambda ds: ds.schema(),
    "reader": lambda ds: ds.reader(StructType()),
    "streamReader": lambda ds: ds.streamReader(StructType()),
    "writer": lambda ds: ds.writer(VALUE_SCHEMA, False),
    "streamWriter": lambda ds: ds.streamWriter(VALUE_SCHEMA, False),
}


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data(), entry=st.sampled_from(sorted(ENTRY_POINTS)))
def test_any_options_give_a_config_or_a_clean_option_error(data: st.DataObject, entry: str) -> None:
    options = data.draw(option_dicts(writing=entry in ("writer", "streamWriter")), label="options")
    source = DurableStreamDataSource(CaseInsensitiveDict(options))
    try:
        ENTRY_POINTS[entry](source)
    except OptionError as error:
        text = str(error)
        assert error.option and error.option.lower() in text.lower(), text
        assert error.accepted, text
        assert SECRET not in text and SECRET not in repr(error.__dict__), text
    except DurastreamError as error:  # another of our errors (e.g. the DataFrame cannot be written)
        assert SECRET not in str(error)
    # Anything else (KeyError, TypeError, ValueError, ...) escapes and fails the property.


def test_valid_options_get_past_parsing() -> None:
    """Sanity: plain valid options do parse, so the property above is not vacuous. (Writers then ask the
    server which extensions it has: reaching the network, and failing there, means parsing passed.)"""
    for entry, options in (
        ("reader", {"url": ROOT, "streams": "a,b", "maxBytesPerTrigger": "1m"}),
        ("streamReader", {"url": ROOT, "pattern": "a/*", "startingOffsets": "latest"}),
        ("writer", {"url": ROOT, "stream": "a", "header.Authorization": f"Bearer {SECRET}"}),
        ("streamWriter", {"url": ROOT, "stream": "a", "exactlyOnce": "ordered"}),
    ):
        source = DurableStreamDataSource(CaseInsensitiveDict({**options, "retry.maxAttempts": "1"}))
        try:
            ENTRY_POINTS[entry](source)
        except TransportError as error:
            assert entry in ("writer", "streamWriter") and SECRET not in str(error)


def test_parsed_options_never_show_header_values() -> None:
    """The frozen option objects travel to executors and end up in reprs: no header value shows."""
    import pickle

    from durastream_spark.sink.options import SinkOptions
    from durastream_spark.source.options import SourceOptions

    headers = {
        f"header.{name}": f"{SECRET}-{name}"
        for name in ("Authorization", "Cookie", "X-Api-Key", "Proxy-Authorization", "X-Tenant")
    }
    for parsed in (
        SourceOptions.parse({"url": ROOT, "streams": "a", **headers}),
        SinkOptions.parse({"url": ROOT, "stream": "a", **headers}),
    ):
        for text in (repr(parsed), str(parsed), repr(pickle.loads(pickle.dumps(parsed)))):
            assert SECRET not in text and "***" in text
        assert pickle.loads(pickle.dumps(parsed)).connection.reveal_headers()["Cookie"] == (
            f"{SECRET}-Cookie"
        )
