"""Environment variables for every command-line flag, derived from the argparse definitions.

``--data-dir`` reads ``DURASTREAM_DATA_DIR``, ``--max-body-bytes`` ``DURASTREAM_MAX_BODY_BYTES``: the prefix
``DURASTREAM_`` and the long flag in capitals with ``_`` for ``-``. Nothing lists the flags a second time,
so a flag added to the parser has its variable, and its line in ``--help``, at once.

Precedence: the command line, then the environment, then the built-in default. A flag given on the command
line replaces its variable entirely (also for repeatable flags, whose variable holds comma-separated values).
Values go through the flag's own ``type`` and ``choices``, so they are checked exactly like arguments, and a
bad one is a usage error naming the variable. Flags without a value (``store_true`` and ``--x/--no-x``)
read ``true``/``1``/``yes``/``on`` or ``false``/``0``/``no``/``off``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "DURASTREAM_"
LIST_SEPARATOR = ","
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_EPILOG = (
    "Every flag can also be set with the environment variable shown with it ([env: DURASTREAM_...]); "
    "the command line wins over the environment. Repeatable flags take comma-separated values there. "
    "Sizes (BYTES) take 65536, 512k, 64m or 1g (1k = 1024 bytes)."
)


def variable(action: argparse.Action) -> str:
    """``DURASTREAM_DATA_DIR`` for ``--data-dir``."""
    long = next(flag for flag in action.option_strings if flag.startswith("--"))
    return PREFIX + long[2:].upper().replace("-", "_")


def configurable(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags that take their value from the environment too (all but --help, --version and the
    internal flags hidden from ``--help``: ``--shard-index`` in the environment would turn every server
    started there into one worker of ``--workers N``)."""
    return [
        action
        for action in parser._actions
        if any(flag.startswith("--") for flag in action.option_strings)
        and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
        and action.dest != argparse.SUPPRESS
        and action.help != argparse.SUPPRESS
    ]


def with_environment(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with every flag's variable in its ``--help`` line, and the rules in the epilog."""
    for action in configurable(parser):
        note = f"[env: {variable(action)}]"
        if action.help == argparse.SUPPRESS or note in (action.help or ""):
            continue
        action.help = f"{action.help} {note}" if action.help else note
    if _EPILOG not in (parser.epilog or ""):
        parser.epilog = f"{parser.epilog} {_EPILOG}" if parser.epilog else _EPILOG
    return parser


def parse_with_environment(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, environ: Mapping[str, str]
) -> argparse.Namespace:
    """Parse ``argv``; every flag it does not give comes from ``environ``, else from its default."""
    actions = configurable(parser)
    defaults = {action.dest: action.default for action in actions}
    required = {action.dest: action.required for action in actions}
    # With SUPPRESS as default, argparse leaves a flag that was not given off the namespace entirely,
    # which tells "not given" apart from "given with the default's value". A required flag whose
    # variable is set is not required on the command line.
    for action in actions:
        action.default = argparse.SUPPRESS
        action.required = action.required and variable(action) not in environ
    try:
        args = parser.parse_args(argv)
    finally:
        for action in actions:
            action.default = defaults[action.dest]
            action.required = required[action.dest]
    for action in actions:
        if hasattr(args, action.dest):
            continue
        raw = environ.get(variable(action))
        value = defaults[action.dest] if raw is None else _value(parser, action, raw)
        setattr(args, action.dest, value)
    return args


def _value(parser: argparse.ArgumentParser, action: argparse.Action, raw: str) -> Any:
    name = variable(action)
    if action.nargs == 0:
        text = raw.strip().lower()
        if text not in _TRUE | _FALSE:
            parser.error(f"environment variable {name}: expected true or false, got {raw!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            return text in _TRUE
        return action.const if text in _TRUE else action.default
    if isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+"):
        return [_convert(parser, action, item.strip()) for item in raw.split(LIST_SEPARATOR)]
    return _convert(parser, action, raw)


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, text: str) -> Any:
    name = variable(action)
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        # The flag's own message; like argparse, never the value of a secret (--auth-token's type
        # does not echo the token).
        parser.error(f"environment variable {name}: {exc}")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        parser.error(
            f"environment variable {name}: invalid choice {text!r} (choose from {choices})"
        )
    return value
