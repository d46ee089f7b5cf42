"""Offsets as pure values: the checkpoint JSON round trip, symbolic initial offsets, user specs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durastream_spark.errors import OptionError
from durastream_spark.source.offsets import (
    DEFAULT_KEY,
    EARLIEST,
    LATEST,
    EarliestSpec,
    LatestSpec,
    SourceOffset,
    SpecificSpec,
    is_token,
    normalize_path,
    offset_after,
    parse_offset_spec,
)

T1 = "0000000000000000_0000000000000010"
T2 = "0000000000000000_0000000000000200"

paths = st.from_regex(r"[a-z][a-z0-9]{0,5}(/[a-z0-9]{1,4}){0,2}", fullmatch=True)
tokens = st.integers(0, 10**12).map(lambda n: f"{0:016d}_{n:016d}")


@given(st.dictionaries(paths, st.one_of(tokens, st.just(EARLIEST)), max_size=6))
def test_json_round_trip_is_exact_and_canonical(mapping: dict[str, str]) -> None:
    offset = SourceOffset.of(mapping)
    text = offset.json()
    assert SourceOffset.from_json(text) == offset
    assert json.loads(text) == mapping
    # Spark compares offsets by their JSON text: the same content must always give the same text.
    assert SourceOffset.of(dict(reversed(list(mapping.items())))).json() == text
    assert list(offset.to_dict()) == sorted(mapping)


def test_checkpoint_json_is_readable_path_to_offset() -> None:
    offset = SourceOffset.of({"events/b": T2, "events/a": T1})
    assert offset.json() == f'{{"events/a":"{T1}","events/b":"{T2}"}}'
    assert offset.concrete


def test_initial_latest_marker_round_trips_and_is_not_a_stream() -> None:
    offset = SourceOffset((), LATEST)
    assert offset.to_dict() == {DEFAULT_KEY: LATEST}
    parsed = SourceOffset.from_dict({DEFAULT_KEY: LATEST, "a": T1})
    assert parsed.default == LATEST and parsed.paths == ("a",)
    assert parsed.start_of("new") == LATEST and parsed.start_of("a") == T1
    assert not parsed.concrete
    with pytest.raises(ValueError, match="stream path is empty"):
        normalize_path(DEFAULT_KEY.strip("/").replace("default", ""))


@pytest.mark.parametrize(
    "document, message",
    [
        ([T1], "JSON object"),
        ({"a": 5}, "offset string"),
        ({"a": "0 1"}, "invalid offset"),
        ({DEFAULT_KEY: "x"}, "must be"),
    ],
)
def test_malformed_offsets_are_refused_with_a_reason(document, message) -> None:
    with pytest.raises(ValueError, match=message):
        SourceOffset.from_dict(document)


def test_offset_order_is_lexicographic_with_earliest_first() -> None:
    assert offset_after(T2, T1) and not offset_after(T1, T2) and not offset_after(T1, T1)
    assert offset_after(T1, EARLIEST) and not offset_after(EARLIEST, T1)
    assert is_token(T1) and not is_token(EARLIEST) and not is_token("now") and not is_token("a b")


def test_starting_offsets_forms() -> None:
    assert parse_offset_spec("startingOffsets", None, ending=False) == EarliestSpec()
    assert parse_offset_spec("startingOffsets", " LATEST ", ending=False) == LatestSpec()
    spec = parse_offset_spec(
        "startingOffsets",
        json.dumps({"/a/": T1, "b": "earliest", "c": "latest", "d": "-1"}),
        ending=False,
    )
    assert isinstance(spec, SpecificSpec)
    assert dict(spec.offsets) == {"a": T1, "b": EARLIEST, "c": LATEST, "d": EARLIEST}
    assert spec.value_for("unlisted") == EARLIEST


def test_ending_offsets_forms() -> None:
    assert parse_offset_spec("endingOffsets", None, ending=True) == LatestSpec()
    spec = parse_offset_spec("endingOffsets", json.dumps({"a": T2}), ending=True)
    assert isinstance(spec, SpecificSpec) and spec.value_for("other") == LATEST


@pytest.mark.parametrize(
    "raw, ending, reason",
    [
        ("yesterday", False, None),
        ("{not json", False, "not valid JSON"),
        ("[1]", False, None),
        ('{"a": 5}', False, "must be a JSON string"),
        ('{"a": "now"}', False, "not an offset the server could have returned"),
        ('{"a//b": "latest"}', False, "empty"),
        ("{}", False, "names no stream"),
        ("earliest", True, "cannot end at 'earliest'"),
        ('{"a": "earliest"}', True, "cannot end at 'earliest'"),
    ],
)
def test_bad_specs_name_option_value_and_accepted(raw: str, ending: bool, reason) -> None:
    option = "endingOffsets" if ending else "startingOffsets"
    with pytest.raises(OptionError) as caught:
        parse_offset_spec(option, raw, ending=ending)
    text = str(caught.value)
    assert option in text and "Accepted:" in text and repr(raw) in text
    if reason:
        assert reason in text


# ---- the compact form (offset_codec.py) -------------------------------------------------------------------


def many(count: int, *, other: dict[str, str] | None = None) -> dict[str, str]:
    offsets = {f"sessions/u{i:06d}": f"{0:016d}_{i * 37:016d}" for i in range(count)}
    return {**offsets, **(other or {})}


def test_above_a_hundred_streams_the_offset_is_compact_and_exact() -> None:
    mapping = many(150, other={"other/a": EARLIEST, "other/b": "opaque-token_9"})
    offset = SourceOffset.of(mapping, batch_ms=1700000000000)
    document = offset.to_dict()
    assert set(document) == {"v", "n", "z", "/batchTimeMs"} and document["n"] == 152
    assert len(json.dumps(document)) < len(json.dumps(mapping)) / 3
    parsed = SourceOffset.from_json(json.dumps(document))
    assert parsed == offset and parsed.as_dict() == mapping and parsed.batch_ms == 1700000000000
    # Equal content, equal text (Spark compares offsets as text), whatever the insertion order.
    assert SourceOffset.of(
        dict(reversed(list(mapping.items()))), batch_ms=1700000000000
    ).json() == (offset.json())
    assert SourceOffset.of(many(100)).to_dict() == many(100)  # up to 100: readable as before


def test_old_readable_checkpoints_of_many_streams_still_parse() -> None:
    mapping = many(500)
    parsed = SourceOffset.from_dict(mapping)  # what main wrote for 500 streams
    assert parsed.as_dict() == mapping and "z" in parsed.to_dict()
    assert SourceOffset.from_dict(parsed.to_dict()) == parsed


def test_updated_replaces_and_drops_without_touching_the_rest() -> None:
    start = SourceOffset.of(many(200))
    end = start.updated({"sessions/u000007": T2, "sessions/u000008": None, "new/x": T1})
    assert end.get("sessions/u000007") == T2 and "sessions/u000008" not in end
    assert end.get("new/x") == T1 and len(end) == 200
    assert start.get("sessions/u000008") is not None  # the start is unchanged
    assert end.get("sessions/u000009") == start.get("sessions/u000009")


@pytest.mark.parametrize(
    "document, message",
    [
        ({"v": 3, "n": 1, "z": ""}, "version 3"),
        ({"v": 2, "n": 1}, "'z'"),
        ({"v": 2, "n": 1, "z": "not base64!"}, "does not decode"),
    ],
)
def test_a_damaged_compact_offset_is_refused_with_a_reason(document, message) -> None:
    with pytest.raises(ValueError, match=message):
        SourceOffset.from_dict(document)


def test_a_copied_compact_offset_works_as_starting_offsets() -> None:
    offset = SourceOffset.of(many(120))
    spec = parse_offset_spec("startingOffsets", offset.json(), ending=False)
    assert isinstance(spec, SpecificSpec) and dict(spec.offsets) == many(120)


def test_the_compact_text_is_computed_once_per_positions() -> None:
    """Spark sees each end twice (without and with its batch time) and hands it back as start: the
    compressed text of 100,000 streams is the costly part, so copies share it instead of redoing it."""
    offset = SourceOffset.of(many(300))
    packed = offset.to_dict()["z"]
    timed = offset.with_batch_ms(1700000000000)
    assert timed.to_dict()["z"] is packed and timed.to_dict()["/batchTimeMs"] == "1700000000000"
    parsed = SourceOffset.from_json(timed.json())
    assert parsed == timed and parsed.raw is offset.raw  # not decoded again
    assert parsed.same_positions(offset)


def test_a_batch_end_re_encodes_only_the_streams_that_moved(monkeypatch) -> None:
    """At 100,000 streams one json.dumps of the whole map cost 0.1-0.2 s per batch; the member texts
    are handed on from start to end and only the changed ones are written again."""
    from durastream_spark.source import offset_codec

    written: list[str] = []
    real = offset_codec.entry_text
    monkeypatch.setattr(
        offset_codec, "entry_text", lambda path, value: written.append(path) or real(path, value)
    )
    start = SourceOffset.of(many(1000))
    start.to_dict()
    assert len(written) == 1000  # the first offset of a run encodes every stream once
    written.clear()
    end = start.updated({"sessions/u000003": T2, "sessions/u000004": None}).with_batch_ms(17)
    end.to_dict()
    assert written == ["sessions/u000003"]
    written.clear()
    back = SourceOffset.from_json(end.json())  # Spark hands the end back as the next start
    after = back.updated({"sessions/u000005": T1})
    after.to_dict()
    assert written == ["sessions/u000005"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b/\u00e9", 'q"uote', "back\\slash", "z/9", "sessions/u000001"]),
            st.one_of(st.none(), st.integers(0, 10**12), st.sampled_from(["-1", "opaque_7"])),
        ),
        max_size=30,
    )
)
def test_handed_on_member_texts_give_exactly_the_text_of_the_whole_map(steps) -> None:
    """Spark compares offsets by their text: the incremental text must be json.dumps's, byte for
    byte, after any mix of moves, drops and new streams (non-ASCII, quotes, backslashes)."""
    from durastream_spark.source.offset_codec import compact_document, decode_value

    offset = SourceOffset.of(many(150))
    offset.to_dict()
    for path, value in steps:
        offset = offset.updated({path: None if value is None else decode_value(value)})
        if len(offset) > 100:
            assert offset.to_dict()["z"] == compact_document(offset.raw, {})["z"]
    assert SourceOffset.from_json(offset.json()) == offset
