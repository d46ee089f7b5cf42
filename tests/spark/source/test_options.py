"""``SourceOptions.parse``: every option validated once, errors naming option, value and accepted values."""

from __future__ import annotations

import pytest

from durastream_spark.errors import OptionError
from durastream_spark.source.offsets import LatestSpec, SpecificSpec
from durastream_spark.source.options import DEFAULT_MAX_BYTES_PER_PARTITION, SourceOptions

URL = "http://127.0.0.1:4437/v1/stream"


def parse(**options: str) -> SourceOptions:
    return SourceOptions.parse({"url": URL, **options})


def test_defaults() -> None:
    options = parse(streams="a, /b/c/ ")
    assert options.selection.streams == ("a", "b/c")
    assert options.fail_on_data_loss is True
    assert options.max_messages_per_trigger is None and options.max_bytes_per_trigger is None
    assert options.max_bytes_per_partition == DEFAULT_MAX_BYTES_PER_PARTITION
    assert options.ending == LatestSpec() and not options.ending_given


def test_every_option_parses() -> None:
    options = SourceOptions.parse(
        {
            "URL": URL,
            "Pattern": "events/**",
            "startingOffsets": '{"events/x/y": "latest"}',
            "maxmessagespertrigger": "100",
            "maxBytesPerTrigger": "64m",
            "failOnDataLoss": "FALSE",
            "minPartitions": "8",
            "maxBytesPerPartition": "1g",
            "maxMessagesPerPartition": "5000",
            "fallback.pinPrefix": "/pins/",
            "fallback.pinTtl": "2h",
            "header.X-Team": "analytics",
        }
    )
    assert options.selection.pattern == "events/**"
    assert isinstance(options.starting, SpecificSpec)
    assert options.max_messages_per_trigger == 100
    assert options.max_bytes_per_trigger == 64 * 2**20
    assert options.fail_on_data_loss is False
    assert options.min_partitions == 8
    assert options.max_bytes_per_partition == 2**30
    assert options.max_messages_per_partition == 5000
    assert options.pin_prefix == "pins" and options.pin_ttl_seconds == 7200
    assert options.connection.header_names == ("X-Team",)


@pytest.mark.parametrize(
    "options, option, fragment",
    [
        ({}, "streams", "exactly one of"),
        ({"streams": "a", "pattern": "b/*"}, "streams", "'pattern' is set too"),
        ({"streams": "a,,b"}, "streams", "an empty entry"),
        ({"streams": "a,a"}, "streams", "listed twice"),
        ({"streams": "a/../b"}, "streams", "'..'"),
        ({"pattern": "a/x**"}, "pattern", "whole path segment"),
        ({"streams": "a", "maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger", "from 1"),
        ({"streams": "a", "maxBytesPerTrigger": "ten"}, "maxBytesPerTrigger", "unit"),
        ({"streams": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss", "true or false"),
        ({"streams": "a", "minPartitions": "-1"}, "minPartitions", "from 1"),
        ({"streams": "a", "maxBytesPerPartition": "10"}, "maxBytesPerPartition", ">= 1024"),
        ({"streams": "a", "startingOffsets": '{"b": "latest"}'}, "startingOffsets", "'b'"),
        ({"pattern": "x/*", "startingOffsets": '{"y/z": "latest"}'}, "startingOffsets", "match"),
        ({"streams": "a", "fallback.pinTtl": "5s"}, "fallback.pinTtl", "from 60000"),
        ({"streams": "a", "maxMessagePerTrigger": "5"}, "maxMessagePerTrigger", "did you mean"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict, option: str, fragment: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse(**options)
    assert caught.value.option == option
    assert option in str(caught.value) and fragment in str(caught.value)


def test_options_pickle_and_hide_secrets() -> None:
    import pickle

    options = parse(streams="a", **{"header.Authorization": "Bearer s3cret"})
    assert pickle.loads(pickle.dumps(options)) == options
    assert "s3cret" not in repr(options)
