"""The time-based options (``startingTimestamp``, ``startingOffsetsByTimestamp``, ``endingTimestamp``,
``endingOffsetsByTimestamp``, ``startingOffsetsByTimestampStrategy``): parsed once, errors naming the option
and the accepted forms. Resolution against the server is in ``test_timestamps.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durastream_spark.errors import OptionError
from durastream_spark.source.offsets import (
    EARLIEST,
    LATEST,
    SourceOffset,
    SpecificSpec,
    TimestampSpec,
)
from durastream_spark.source.options import SourceOptions
from durastream_spark.source.stream import initial_offset
from durastream_spark.source.timestamps import ACCEPTED, at_timestamp, parse_instant, timestamp_of

URL = "http://127.0.0.1:4437/v1/stream"


def parse(**options: str) -> SourceOptions:
    return SourceOptions.parse({"url": URL, **options})


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1700000000000", 1_700_000_000_000),
        (" 0 ", 0),
        ("-1000", -1000),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000_000),
        ("2023-11-14T22:13:20.250z", 1_700_000_000_250),
        ("2023-11-14T22:13:20.000001+00:00", 1_700_000_000_001),  # rounded up to whole ms
    ],
)
def test_instants_in_both_forms(text: str, ms: int) -> None:
    assert parse(streams="a", startingTimestamp=text).starting == TimestampSpec(ms)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("2023-11-14T22:13:20", "has no zone"),
        ("2023-11-14", "is not an instant"),
        ("yesterday", "is not an instant"),
        ("1.5e12", "is not an instant"),
        ("2023-13-40T00:00:00Z", "is not ISO-8601 text"),
        ("99999999999999999", "is not an instant"),
    ],
)
def test_bad_instants_name_the_option_and_the_accepted_forms(text: str, fragment: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse(streams="a", startingTimestamp=text)
    assert caught.value.option == "startingTimestamp"
    assert ACCEPTED in str(caught.value) and fragment in str(caught.value)


@given(st.integers(-(2**53) + 1, 2**53 - 1))
def test_epoch_milliseconds_round_trip_through_the_symbolic_value(ms: int) -> None:
    assert parse_instant("startingTimestamp", None, str(ms)) == ms
    assert timestamp_of(at_timestamp(ms)) == ms


def test_per_stream_instants_merge_with_starting_offsets() -> None:
    options = parse(
        streams="a,b,c",
        startingOffsetsByTimestamp='{"a": 1700000000000, "b": "2023-11-14T22:13:20Z"}',
        startingOffsets='{"c": "latest"}',
    )
    assert options.starting == SpecificSpec(
        (
            ("a", at_timestamp(1_700_000_000_000)),
            ("b", at_timestamp(1_700_000_000_000)),
            ("c", LATEST),
        ),
        unlisted=EARLIEST,
    )
    assert options.starting_time_option == "startingOffsetsByTimestamp"
    assert initial_offset(options) == SourceOffset.of(
        {"a": at_timestamp(1_700_000_000_000), "b": at_timestamp(1_700_000_000_000), "c": LATEST}
    )


def test_a_pattern_starts_every_stream_at_the_instant() -> None:
    options = parse(pattern="ev/*", startingTimestamp="5")
    start = initial_offset(options)
    assert start == SourceOffset((), at_timestamp(5))
    assert SourceOffset.from_json(start.json()) == start  # Spark hands it back as JSON
    assert not start.concrete


@pytest.mark.parametrize(
    ("options", "option", "fragment"),
    [
        (
            {"startingTimestamp": "1", "startingOffsetsByTimestamp": '{"a": 1}'},
            "startingTimestamp",
            "not both",
        ),
        (
            {"startingTimestamp": "1", "startingOffsets": "latest"},
            "startingTimestamp",
            "would be ignored",
        ),
        (
            {"startingOffsetsByTimestamp": '{"a": 1}', "startingOffsets": '{"a": "latest"}'},
            "startingOffsetsByTimestamp",
            "in both options",
        ),
        ({"startingOffsetsByTimestamp": '{"x": 1}'}, "startingOffsetsByTimestamp", "'x'"),
        ({"startingOffsetsByTimestamp": "[1]"}, "startingOffsetsByTimestamp", "JSON object"),
        ({"startingOffsetsByTimestamp": '{"a": true}'}, "startingOffsetsByTimestamp", "stream 'a'"),
        (
            {"startingOffsetsByTimestamp": '{"a": "soon"}'},
            "startingOffsetsByTimestamp",
            "stream 'a'",
        ),
        (
            {"startingTimestamp": "10", "endingTimestamp": "5"},
            "endingTimestamp",
            "end before it starts",
        ),
        (
            {"startingOffsetsByTimestampStrategy": "latest"},
            "startingOffsetsByTimestampStrategy",
            "ignored",
        ),
        (
            {"startingTimestamp": "1", "startingOffsetsByTimestampStrategy": "earliest"},
            "startingOffsetsByTimestampStrategy",
            "'error', 'latest'",
        ),
        (
            {"endingOffsetsByTimestamp": '{"a": 1}', "endingTimestamp": "2"},
            "endingTimestamp",
            "not both",
        ),
    ],
)
def test_refused_combinations_name_the_option(
    options: dict[str, str], option: str, fragment: str
) -> None:
    with pytest.raises(OptionError) as caught:
        parse(streams="a", **options)
    assert caught.value.option == option
    assert fragment in str(caught.value)


def test_did_you_mean_for_a_misspelt_time_option() -> None:
    with pytest.raises(OptionError, match="did you mean 'startingTimestamp'"):
        parse(streams="a", startingTimestamps="1")
