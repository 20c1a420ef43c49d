"""Turn a ``ckpt_*`` value (a Python object or a string from a config file) into a clean one.

Every rejected value raises :class:`ValueError` or :class:`TypeError` whose
message names the offending ``gParameters`` key and what is allowed.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from candle_ckpt.config.preemption import parse_deadline, parse_exit_code, parse_signals
from candle_ckpt.config.spec import (
    BOOL_ALLOWED,
    FALSE_STRINGS,
    OFF_WORDS,
    TRUE_STRINGS,
    Spec,
    bool_word,
    describe,
    describe_typed,
    is_auto_word,
    is_none_like,
    plain_text,
)


def must_be(spec: Spec, key: str) -> str:
    """The one sentence start for a rejected value of an integer key: ``ckpt_keep_limit must be an integer > 0``.

    Every way of giving the value (a dict entry, a config-file string, a ``--ckpt_*`` flag) says the
    same, naming what is allowed (the schema's ``allowed``)."""
    return f"{key} must be an {spec.allowed}" if spec.kind == "int" else f"{key} must be {spec.allowed}"


def _check_range(spec: Spec, key: str, number: float) -> None:
    """Raise ValueError if ``number`` violates the spec's bounds."""
    if spec.kind in ("int", "steps"):
        low_ok = spec.minimum is None or (number > spec.minimum if spec.strict else number >= spec.minimum)
        if not low_ok or (spec.maximum is not None and not number <= spec.maximum):
            raise ValueError(f"{must_be(spec, key)}; got {describe(number)}")
        return
    if spec.maximum is not None and not number <= spec.maximum:
        raise ValueError(f"{key} must be <= {spec.maximum:g} ({spec.allowed}); got {describe(number)}")
    if spec.minimum is None:
        return
    if spec.strict and not number > spec.minimum:
        op = ">"
    elif not spec.strict and not number >= spec.minimum:
        op = ">="
    else:
        return
    raise ValueError(f"{key} must be {op} {spec.minimum:g}; got {describe(number)}")


def _to_bool(spec: Spec, key: str, value: object) -> bool | None:
    """Coerce a boolean parameter (an optional one also takes ``auto``: None, decided later)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = bool_word(value)
        if word is not None:
            return word
        if spec.optional and is_auto_word(value):
            return None
        also = " or auto" if spec.optional else ""
        raise ValueError(f"{key} must be a boolean ({BOOL_ALLOWED}){also}; got {describe(value)}")
    if isinstance(value, numbers.Integral):
        number = operator.index(value)
        if number in (0, 1):
            return bool(number)
        raise ValueError(f"{key} must be a boolean ({BOOL_ALLOWED}); got {describe(value)}")
    raise TypeError(f"{key} must be a boolean ({BOOL_ALLOWED}); got {describe_typed(value)}")


def _integral_float(spec: Spec, key: str, number: float, original: object) -> int:
    """Convert a float to int if it is finite and integral."""
    if not math.isfinite(number) or not number.is_integer():
        raise ValueError(f"{must_be(spec, key)}; got {describe(original)}")
    return int(number)


def _to_int(spec: Spec, key: str, value: object) -> int:
    """Coerce an integer parameter and check its range."""
    if isinstance(value, bool):
        raise TypeError(f"{must_be(spec, key)}, not a boolean; got {describe(value)}")
    if isinstance(value, numbers.Integral):
        number = operator.index(value)
    elif isinstance(value, numbers.Real):
        number = _integral_float(spec, key, float(value), value)
    elif isinstance(value, str):
        text = str.strip(plain_text(value))
        try:
            number = int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                raise ValueError(f"{must_be(spec, key)}; got {describe(value)}") from None
            number = _integral_float(spec, key, as_float, value)
    else:
        raise TypeError(f"{must_be(spec, key)}; got {describe_typed(value)}")
    _check_range(spec, key, number)
    return number


def _to_float(spec: Spec, key: str, value: object) -> float:
    """Coerce a finite float parameter and check its range."""
    if isinstance(value, bool):
        raise TypeError(f"{key} must be a number, not a boolean; got {describe(value)}")
    if isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"{key} must be a finite number; got {describe(value)}") from None
    elif isinstance(value, str):
        try:
            number = float(str.strip(plain_text(value)))
        except ValueError:
            raise ValueError(f"{key} must be a number; got {describe(value)}") from None
    else:
        raise TypeError(f"{key} must be a number; got {describe_typed(value)}")
    if not math.isfinite(number):
        raise ValueError(f"{key} must be a finite number; got {describe(value)}")
    _check_range(spec, key, number)
    return number


def _to_metric(spec: Spec, key: str, value: object) -> float:
    """Coerce a metric value: any real number, infinities included (CANDLE's "no best yet"), never NaN."""
    if isinstance(value, bool):
        raise TypeError(f"{key} must be a number, not a boolean; got {describe(value)}")
    if isinstance(value, str):
        try:
            number = float(str.strip(plain_text(value)))
        except ValueError:
            raise ValueError(f"{key} must be a number (inf allowed); got {describe(value)}") from None
    elif isinstance(value, numbers.Real):
        number = float(value)
    else:
        raise TypeError(f"{key} must be a number (inf allowed) or None; got {describe_typed(value)}")
    if math.isnan(number):
        raise ValueError(f"{key} must be a number (inf allowed), not NaN; got {describe(value)}")
    return number


def _to_choice(spec: Spec, key: str, value: object) -> str:
    """Coerce a choice parameter (case-insensitive, whitespace-stripped)."""
    allowed = ", ".join(f"'{choice}'" for choice in spec.choices)
    if not isinstance(value, str):
        hint = ""
        if isinstance(value, bool):
            hint = " (quote the value: some config formats read off/on as booleans)"
        raise TypeError(f"{key} must be one of {allowed}; got {describe_typed(value)}{hint}")
    text = str.lower(str.strip(plain_text(value)))
    if text not in spec.choices:
        raise ValueError(f"{key} must be one of {allowed}; got {describe(value)}")
    return text


def _to_str(spec: Spec, key: str, value: object) -> str:
    """Coerce a non-empty string parameter (surrounding whitespace removed)."""
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a non-empty string; got {describe_typed(value)}")
    text = str.strip(plain_text(value))
    if not text:
        raise ValueError(f"{key} must be a non-empty string; got {describe(value)}")
    return text


def _to_path(spec: Spec, key: str, value: object) -> str:
    """Coerce a directory parameter given as str or os.PathLike."""
    if isinstance(value, os.PathLike) and not isinstance(value, str):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{key} must be a non-empty path (str or os.PathLike resolving to str); got {describe_typed(value)}"
        )
    text = plain_text(value)
    if not str.strip(text):
        raise ValueError(f"{key} must be a non-empty path; got {describe(value)}")
    if "\x00" in text:
        raise ValueError(f"{key} must not contain NUL characters; got {describe(value)}")
    return text


_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S")


def _to_url(spec: Spec, key: str, value: object) -> str:
    """Coerce an fsspec URL: ``protocol://rest``, without surrounding whitespace."""
    if isinstance(value, os.PathLike) and not isinstance(value, str):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a URL string such as 's3://bucket/job'; got {describe_typed(value)}")
    text = str.strip(plain_text(value))
    if not _URL_RE.match(text) or "\x00" in text:
        raise ValueError(
            f"{key} must be a URL of the form protocol://path (e.g. s3://bucket/job, "
            f"file:///scratch/job, memory://job); got {describe(value)}"
        )
    return text


def _to_location(spec: Spec, key: str, value: object) -> str:
    """Coerce a place that is either an fsspec URL (``protocol://path``) or a file-system path."""
    if isinstance(value, str) and "://" in plain_text(value):
        return _to_url(spec, key, value)
    return str.strip(_to_path(spec, key, value))


def _to_cache(spec: Spec, key: str, value: object) -> str:
    """Coerce ``ckpt_compile_cache``: ``auto`` (also a true word), ``off`` (also a false word), or a path."""
    if isinstance(value, bool):
        return "auto" if value else "off"
    if isinstance(value, str):
        word = str.lower(str.strip(plain_text(value)))
        if word == "auto" or word in TRUE_STRINGS:
            return "auto"
        if word in FALSE_STRINGS:
            return "off"
    return str.strip(_to_path(spec, key, value))


def _to_json(spec: Spec, key: str, value: object) -> str:
    """Coerce a JSON object given as a string or a mapping to canonical JSON text.

    The config keeps the text (not a dict) so that it stays immutable and hashable.
    """
    if isinstance(value, Mapping):
        try:
            return json.dumps(dict(value), sort_keys=True)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{key} must be JSON-serialisable; {err}") from None
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a JSON object (a string or a mapping); got {describe_typed(value)}")
    try:
        parsed = json.loads(plain_text(value))
    except json.JSONDecodeError as err:
        raise ValueError(f"{key} must be a JSON object; {describe(value)} is not valid JSON ({err})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{key} must be a JSON object ({{...}}); got {describe(value)}")
    return json.dumps(parsed, sort_keys=True)


def _to_text(spec: Spec, key: str, value: object) -> str:
    """Coerce a free-form string parameter (kept verbatim)."""
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string or None; got {describe_typed(value)}")
    return plain_text(value)


def _auto_or(inner: Callable[[Spec, str, object], Any]) -> Callable[[Spec, str, object], Any]:
    """A coercion that also takes the word ``auto`` (kept as ``"auto"``); its errors name both choices."""

    def coerce_auto(spec: Spec, key: str, value: object) -> Any:
        if isinstance(value, str) and is_auto_word(value):
            return "auto"
        try:
            return inner(spec, key, value)
        except (TypeError, ValueError) as err:  # the same sentence, naming auto too; what was got as the inner said
            said = str(err)
            got = said[said.index("; got ") :] if "; got " in said else f"; got {describe_typed(value)}"
            raise type(err)(f"{key} must be {spec.allowed}{got}") from None

    return coerce_auto


def _to_timeout(spec: Spec, key: str, value: object) -> float | str:
    """Coerce ``auto``, ``none`` (or another of :data:`OFF_WORDS`: off, false, no, empty) or a number of seconds
    > 0 (``ckpt_hang_timeout``)."""
    if isinstance(value, str):
        word = str.lower(str.strip(plain_text(value)))
        if word == "auto":
            return "auto"
        if word in OFF_WORDS:
            return "none"  # a word, not None: None in a parameter dict means "the default" (auto)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f"{key} must be {spec.allowed}; got {describe_typed(value)}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{key} must be {spec.allowed}; got {describe(value)}") from None
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{key} must be {spec.allowed}; got {describe(value)}")
    return number


_COERCERS: dict[str, Callable[[Spec, str, object], Any]] = {
    "bool": _to_bool,
    "int": _to_int,
    "float": _to_float,
    "metric": _to_metric,
    "choice": _to_choice,
    "str": _to_str,
    "path": _to_path,
    "text": _to_text,
    "url": _to_url,
    "location": _to_location,
    "cache": _to_cache,
    "json": _to_json,
    "steps": _auto_or(_to_int),
    "mtbf": _auto_or(_to_float),
    "signals": lambda spec, key, value: parse_signals(value, key),
    "exit": lambda spec, key, value: parse_exit_code(value, key),
    "deadline": lambda spec, key, value: parse_deadline(value, key),
    "timeout": _to_timeout,
}


def coerce(spec: Spec, value: object, key: str | None = None) -> Any:
    """Validate and normalise one value according to ``spec``.

    Args:
        spec: The parameter specification.
        value: The raw value.
        key: Name to use in error messages; defaults to ``spec.key``.

    Returns:
        The normalised value.

    Raises:
        ValueError: The value has an acceptable type but is out of range,
            not a recognised word, or otherwise invalid.
        TypeError: The value has an unacceptable type.
    """
    key = spec.key if key is None else key
    if spec.optional and is_none_like(value):
        return None
    if value is None:
        raise TypeError(f"{key} must not be None ({spec.allowed})")
    try:
        return _COERCERS[spec.kind](spec, key, value)
    except Exception as exc:
        # Our own errors already name the key; anything else (a hostile
        # __index__, __float__ or __fspath__, a recursion error, ...) is
        # converted so that callers only ever see ValueError/TypeError.
        if isinstance(exc, (TypeError, ValueError)) and key in _safe_message(exc):
            raise
        invalid = isinstance(exc, (ValueError, ArithmeticError))
        error_type = ValueError if invalid else TypeError
        raise error_type(f"{key}: cannot interpret value of type {type(value).__name__} ({spec.allowed})") from exc


def _safe_message(exc: BaseException) -> str:
    """Return ``str(exc)``, or an empty string if that fails."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 -- an exception's __str__ may fail too
        return ""
    return message if isinstance(message, str) else ""
