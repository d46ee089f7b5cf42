"""``frozen.quick_init``: a frozen slotted dataclass's faster ``__init__`` is the same ``__init__``
(parameters, defaults, ``__post_init__``), the value stays frozen, and shapes it cannot copy are
refused at import instead of being built wrong."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from durastream_server.engine.api import AppendRequest, CreateResult, StreamInfo
from durastream_server.frozen import quick_init
from durastream_server.storage.records import AppendEntry, ProducerTuple, StreamHeader


def _plain(cls: type) -> type:
    """The same fields as a dataclass of the standard ``__init__`` (the reference)."""
    fields = [
        (f.name, f.type, dataclasses.field(default=f.default, init=f.init))
        if f.default is not dataclasses.MISSING or not f.init
        else (f.name, f.type)
        for f in dataclasses.fields(cls)
    ]
    return dataclasses.make_dataclass(f"Plain{cls.__name__}", fields, frozen=True, slots=True)


@pytest.mark.parametrize(
    "cls", [AppendRequest, StreamInfo, CreateResult, StreamHeader, AppendEntry]
)
def test_the_quick_init_takes_what_the_dataclass_init_takes(cls: type) -> None:
    ours = [
        (name, p.default)
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind is not inspect.Parameter.KEYWORD_ONLY
    ]
    reference = [
        (name, p.default) for name, p in inspect.signature(_plain(cls).__init__).parameters.items()
    ]
    assert ours == reference


def test_values_are_equal_hashable_frozen_and_post_initialised() -> None:
    producer = ProducerTuple("p", 1, 2)
    request = AppendRequest("s/1", "application/json", b"[1]", producer=producer, key="k")
    assert request == AppendRequest(
        path="s/1", content_type="application/json", body=b"[1]", producer=producer, key="k"
    )
    assert hash(request) == hash(dataclasses.replace(request))
    assert (request.close, request.stream_seq, request.refuse_forgotten) == (False, None, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.path = "other"  # type: ignore[misc]
    entry = AppendEntry(7, (b"ab", b"c"), 5)
    assert (entry.size, entry.end) == (3, 10)  # __post_init__ ran
    assert dataclasses.replace(entry, messages=(b"x",)).size == 1
    with pytest.raises(TypeError):
        AppendRequest("s/1", "text/plain")  # body is required, as before


def test_shapes_it_cannot_copy_are_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        items: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

        def __post_init__(self, b: int) -> None:
            pass

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    for cls in (Factory, WithInitVar, NoSlots, NotFrozen):
        with pytest.raises(TypeError):
            quick_init(cls)
