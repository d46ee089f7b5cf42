"""docs/options.md is generated from the option parsers and must stay equal to the generator's output.

Regenerate with ``python -m durastream_spark.docs --output docs/options.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durastream_spark import docs
from durastream_spark.options import CONNECTION_KEYS, HEADER_PREFIX
from durastream_spark.sink import options as sink_options
from durastream_spark.source.options import SOURCE_KEYS

OPTIONS_MD = Path(__file__).resolve().parents[2] / "docs" / "options.md"


def documented_headings() -> set[str]:
    return set(re.findall(r"^### `([^`]+)`$", OPTIONS_MD.read_text(encoding="utf-8"), re.MULTILINE))


def test_options_md_is_up_to_date() -> None:
    assert OPTIONS_MD.read_text(encoding="utf-8") == docs.render(), (
        "docs/options.md is out of date: run `python -m durastream_spark.docs --output docs/options.md`"
    )


def test_every_key_the_parsers_accept_has_a_section() -> None:
    accepted = set(docs.accepted_keys(docs.SOURCE)) | set(docs.accepted_keys(docs.SINK))
    # The parsers' own key sets as well, in case a key were accepted without being listed.
    declared = (
        set(CONNECTION_KEYS)
        | set(SOURCE_KEYS)
        | set(sink_options.SINK_KEYS)
        | set(sink_options.SPARK_PASSTHROUGH_KEYS)
        | {HEADER_PREFIX + "<Name>"}
    )
    assert declared <= accepted
    assert not accepted - documented_headings()


def test_every_example_is_accepted_and_every_bad_value_refused() -> None:
    for doc in docs.documented():
        docs.check_example(doc)  # raises OptionError if the example is refused
        if doc.bad is not None:
            error = docs.bad_value_error(doc)
            assert error is not None and error.option.lower() == (doc.bad_key or doc.key).lower()


def test_a_new_option_without_documentation_fails_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sink_options, "SINK_KEYS", sink_options.SINK_KEYS | {"compressionLevel"})
    with pytest.raises(docs.UndocumentedOption, match="compressionLevel"):
        docs.render()


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "options.md"
    stale.write_text("# Options\n", encoding="utf-8")
    assert docs.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert docs.main(["--check", str(OPTIONS_MD)]) == 0
