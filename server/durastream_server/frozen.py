"""``quick_init``: a frozen slotted dataclass's ``__init__`` without ``object.__setattr__`` per field.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__(self, name,
value)`` (its own ``__setattr__`` refuses): a global look-up, an attribute look-up and a call naming the
field, per field. The bulk requests build several such values per entry (``AppendRequest``,
``AppendEntry``, ``AppendResult``, ``StreamHeader``, ``StreamInfo``, ``CreateResult``: issue 16, a new
stream's server CPU), ~0.6 us each for eight fields. With ``__slots__`` each field is a member
descriptor whose ``__set__`` stores the value directly; bound once, as keyword-only defaults of an
``__init__`` of the same signature, they set the fields in about a third less time
(docs/benchmarks.md, sink "Run 12").

Everything else is the dataclass's own: equality, hashing, ``repr``, ``replace``, and assignment after
``__init__`` still raising ``FrozenInstanceError``. Only plain fields are supported (a default value or
none; no ``default_factory``, no keyword-only fields; ``init=False`` only without a default, for
``__post_init__`` to set, which is called as the dataclass calls it): anything else raises
``TypeError`` at import, so the decorator is never silently wrong.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


def quick_init(cls: type[_T]) -> type[_T]:
    """Replace ``cls.__init__`` (a ``@dataclass(frozen=True, slots=True)``) with one that sets the
    fields through their slot descriptors; same parameters, same defaults, same order."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: quick_init is for @dataclass(frozen=True, slots=True)")
    namespace: dict[str, Any] = {}
    parameters: list[str] = []
    setters: list[str] = []
    body: list[str] = []
    for field in dataclasses.fields(cls):
        name = field.name
        if field.default_factory is not dataclasses.MISSING or field.kw_only is True:
            raise TypeError(f"{cls.__name__}.{name}: quick_init takes plain fields only")
        if not field.init:
            if field.default is not dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{name}: quick_init takes plain fields only")
            continue  # set by __post_init__, as the dataclass's own __init__ leaves it
        if field.default is dataclasses.MISSING:
            parameters.append(name)
        else:
            namespace[f"_default_{name}"] = field.default
            parameters.append(f"{name}=_default_{name}")
        namespace[f"_slot_{name}"] = cls.__dict__[name].__set__
        setters.append(f"_set_{name}=_slot_{name}")
        body.append(f"    _set_{name}(self, {name})")
    if not parameters:
        raise TypeError(f"{cls.__name__}: quick_init needs at least one field")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = (
        f"def __init__(self, {', '.join(parameters)}, *, {', '.join(setters)}) -> None:\n"
        + "\n".join(body)
        + "\n"
    )
    exec(source, namespace)  # noqa: S102 - as dataclasses builds its own __init__
    init = namespace["__init__"]
    if _positional(init) != _positional(cls.__init__):  # e.g. an InitVar, which fields() omits
        raise TypeError(f"{cls.__name__}: quick_init cannot make the same __init__")
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls


def _positional(init: Callable[..., None]) -> list[tuple[str, Any]]:
    """An ``__init__``'s parameters but the keyword-only ones: names and defaults, in order."""
    return [
        (name, parameter.default)
        for name, parameter in inspect.signature(init).parameters.items()
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY
    ]
