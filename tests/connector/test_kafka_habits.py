"""Options of Spark's Kafka connector get a pointer to ours ("this is 'streams' here"), not a bare "unknown".

The "did you mean" answer for a misspelt option of ours stays as it was.
"""

from __future__ import annotations

import pytest

from durastream_spark import options as options_module
from durastream_spark.errors import OptionError
from durastream_spark.options import KafkaEquivalent
from durastream_spark.sink.options import SinkOptions
from durastream_spark.source.options import SourceOptions

URL = "http://127.0.0.1:4437/v1/stream"
SOURCE = {"url": URL}
SINK = {"url": URL}


def refused(parse, options: dict[str, str]) -> OptionError:
    with pytest.raises(OptionError) as caught:
        parse(options)
    return caught.value


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        ("subscribe", "events,clicks", '.option("streams", "events,clicks")'),
        ("SubscribePattern", "events.*", '.option("pattern", "events/*")'),
        ("assign", '{"events":[0,1]}', '.option("streams", "events/a,events/b")'),
        ("topic", "events", '.option("streams", "events")'),
        ("maxOffsetsPerTrigger", "1000", '.option("maxMessagesPerTrigger", "1000")'),
        ("minOffsetsPerTrigger", "100", '.option("minMessagesPerTrigger", "100")'),
        (
            "kafka.bootstrap.servers",
            "broker:9092",
            '.option("url", "http://<host>:4437/v1/stream")',
        ),
    ],
)
def test_source_names_our_option_and_how_to_write_it(key: str, value: str, fix: str) -> None:
    error = refused(SourceOptions.parse, {**SOURCE, key: value})
    target = fix.split('"')[1]
    first_line = str(error).splitlines()[0]
    assert first_line.startswith(
        f"Option '{key}' is Spark's Kafka connector's; here it is '{target}'"
    )
    assert first_line.endswith(fix + ".")
    assert error.option == key


def test_sink_topic_is_stream() -> None:
    error = refused(SinkOptions.parse, {**SINK, "topic": "clicks"})
    assert str(error).startswith(
        "Option 'topic' is Spark's Kafka connector's; here it is 'stream' "
    )
    assert '.option("stream", "clicks")' in str(error)


@pytest.mark.parametrize(
    ("parse", "base"),
    [(SourceOptions.parse, {**SOURCE, "streams": "a"}), (SinkOptions.parse, SINK)],
    ids=["source", "sink"],
)
def test_kafka_client_settings_point_at_url_and_credentials_without_echoing(parse, base) -> None:
    secret = 'org.apache.kafka.common.security.plain.PlainLoginModule password="hunter2";'
    error = refused(parse, {**base, "kafka.sasl.jaas.config": secret})
    text = str(error)
    assert text.startswith("Option 'kafka.sasl.jaas.config' is a Kafka client setting;")
    assert "'url'" in text and "'tokenFile'" in text and "'header.Authorization'" in text
    assert "hunter2" not in text and "hunter2" not in repr(error.__dict__)


def test_patterns_and_assignments_are_not_echoed_as_if_they_were_ours() -> None:
    # A Kafka regex is not a glob: the fix shows a glob, never the regex as a pattern value.
    error = refused(SourceOptions.parse, {**SOURCE, "subscribePattern": "events-[0-9]+"})
    assert "events-[0-9]+" not in str(error)
    assert "not a regex" in str(error)


def test_an_equivalent_this_side_lacks_falls_back_to_did_you_mean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = {**options_module.KAFKA_EQUIVALENTS}
    table["maxratepertrigger"] = KafkaEquivalent(("noSuchOptionOfOurs",), "nothing")
    monkeypatch.setattr(options_module, "KAFKA_EQUIVALENTS", table)
    error = refused(SourceOptions.parse, {**SOURCE, "streams": "a", "maxRatePerTrigger": "5"})
    assert str(error).startswith("Unknown option 'maxRatePerTrigger'; ")


def test_misspelt_options_still_get_did_you_mean() -> None:
    error = refused(SourceOptions.parse, {**SOURCE, "streams": "a", "maxMessagePerTrigger": "5"})
    assert str(error).startswith(
        "Unknown option 'maxMessagePerTrigger'; did you mean 'maxMessagesPerTrigger'? "
    )
    error = refused(SinkOptions.parse, {**SINK, "maxBytesPerReqest": "4m"})
    assert "did you mean 'maxBytesPerRequest'?" in str(error)
