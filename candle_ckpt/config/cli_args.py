"""Command-line support: CANDLE-style benchmark definitions (:func:`ckpt_defs`), an
argparse helper (:func:`ckpt_parser`), :func:`str2bool` and the parameter table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from candle_ckpt.config.coerce import coerce
from candle_ckpt.config.schema import SPECS
from candle_ckpt.config.spec import BOOL_ALLOWED, Spec, bool_word, describe, is_auto_word, is_none_like, is_none_word


def str2bool(value: str | bool) -> bool:
    """Convert a command-line string to a boolean (CANDLE's argparse helper).

    Args:
        value: A bool (returned unchanged) or a string such as ``"true"``,
            ``"no"`` or ``"1"`` (case-insensitive, surrounding whitespace
            ignored).

    Returns:
        The boolean value.

    Raises:
        argparse.ArgumentTypeError: The value is not a recognised boolean.
    """
    if isinstance(value, bool):
        return value
    word = bool_word(value) if isinstance(value, str) else None
    if word is not None:
        return word
    raise argparse.ArgumentTypeError(f"Boolean value expected ({BOOL_ALLOWED}); got {describe(value)}")


def str2bool_or_auto(value: str | bool) -> bool | None:
    """:func:`str2bool`, or None for ``auto`` (an optional boolean such as ``ckpt_async``: decided later)."""
    if isinstance(value, str) and is_auto_word(value):
        return None
    try:
        return str2bool(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"Boolean value or auto expected ({BOOL_ALLOWED}, auto); got {describe(value)}"
        ) from None


def _arg_type(spec: Spec) -> Callable[[str], Any]:
    """The argparse/CANDLE type of ``spec``'s flag."""
    return str2bool_or_auto if spec.kind == "bool" and spec.optional else _DEF_TYPES[spec.kind]


_DEF_TYPES: dict[str, Callable[[str], Any]] = {
    "bool": str2bool,
    "int": int,
    "float": float,
    "metric": float,
    "choice": str,
    "str": str,
    "path": str,
    "text": str,
    "url": str,
    "location": str,
    "cache": str,
    "json": str,
    "signals": str,
    "exit": str,
    "deadline": str,
    "steps": str,
    "mtbf": str,
    "timeout": str,
}


def _definition(spec: Spec) -> dict[str, Any]:
    """Return the CANDLE benchmark definition dict for ``spec``."""
    definition: dict[str, Any] = {
        "name": spec.key,
        "type": _arg_type(spec),
        "default": spec.default,
        "help": spec.help,
    }
    if spec.choices:
        definition["choices"] = list(spec.choices)
    return definition


def ckpt_defs(defs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Return benchmark definitions extended with the ``ckpt_*`` parameters.

    The definitions follow CANDLE's ``additional_definitions`` style, e.g.
    ``{"name": "ckpt_keep_mode", "type": str, "default": "linear",
    "choices": ["linear", "exponential"], "help": "..."}``.  Booleans use
    :func:`str2bool` as their type.

    Args:
        defs: Existing definitions, or None for none.  Not modified.

    Returns:
        A new list: ``defs`` followed by one fresh dict for every
        ``ckpt_*`` key whose name is not already defined in ``defs``.
    """
    result = list(defs) if defs is not None else []
    present = {d["name"] for d in result if isinstance(d, Mapping) and isinstance(d.get("name"), str)}
    result.extend(_definition(spec) for spec in SPECS if spec.cli and spec.key not in present)
    return result


def _normalise_choice(text: str) -> str:
    """Argparse type for choice options: strip and lower-case."""
    return text.strip().lower()


def _optional_int(text: str) -> int | None:
    """Argparse type for optional integers: ``None``/``none``/empty is None."""
    if is_none_like(text):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {describe(text)}") from None


def _has_option(parser: argparse.ArgumentParser, name: str) -> bool:
    """Return True if ``parser`` already has ``--name`` or a ``name`` dest."""
    if f"--{name}" in parser._option_string_actions:
        return True
    return any(action.dest == name for action in parser._actions)


def ckpt_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one ``--ckpt_*`` option per :func:`ckpt_defs` definition.

    Boolean options accept an optional value: ``--ckpt_save_best`` alone
    means True, ``--ckpt_save_best false`` means False.  Choice options are
    case-insensitive.  ``--ckpt_restart_epoch none`` gives None.  Options
    (or destinations) that the parser already has are left untouched.

    Args:
        parser: The parser to extend.

    Returns:
        The same parser, for chaining.
    """
    for spec in SPECS:
        if not spec.cli or _has_option(parser, spec.key):
            continue
        kwargs: dict[str, Any] = {"default": spec.default, "help": spec.help}
        if spec.kind == "bool":
            kwargs.update(type=_arg_type(spec), nargs="?", const=True, metavar="BOOL")
        elif spec.kind == "choice":
            kwargs.update(type=_normalise_choice, choices=list(spec.choices))
        elif spec.kind == "int" and spec.optional:
            kwargs.update(type=_optional_int, metavar="INT")
        else:
            kwargs["type"] = _checked(spec, _DEF_TYPES[spec.kind])
        parser.add_argument(f"--{spec.key}", **kwargs)
    return parser


def _checked(spec: Spec, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: ``convert``, then the parameter's own check, so that a bad flag is argparse's
    one-line error (exit status 2) naming the key and what is allowed, not a traceback later."""

    def check(text: str) -> Any:
        if is_none_word(text) and not spec.none_is_value:
            return None  # the default, as CkptConfig.from_params reads it
        try:  # the parameter's own check first: a flag gets the sentence a gParameters value gets
            coerced = coerce(spec, text)
        except (TypeError, ValueError) as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        try:
            value = convert(text)
        except (TypeError, ValueError):
            return coerced  # "3.0" for an int key: what from_params makes of it
        try:
            coerce(spec, value)
        except (TypeError, ValueError) as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return value

    check.__name__ = spec.kind  # argparse names the type in some messages
    return check
