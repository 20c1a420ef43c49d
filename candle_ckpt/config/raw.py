"""A raw parameter value, read safely: a description that never fails, its plain text, none and boolean words.

Values come from users, config files and command lines, and may be hostile
(a ``__repr__`` that raises, a ``str`` subclass with hooks, a huge integer):
everything here works on any object, so error messages can always name it.
"""

from __future__ import annotations

from candle_ckpt.config.spec import FALSE_STRINGS, MAX_REPR, NONE_STRINGS, TRUE_STRINGS


def describe(value: object) -> str:
    """Return a short, never-failing representation of ``value``.

    Args:
        value: Any object, including ones whose ``__repr__`` raises and
            integers too large for ``repr``.

    Returns:
        The (possibly truncated) repr, or a placeholder naming the type.
    """
    if isinstance(value, int) and value.bit_length() > 256:
        return f"<{type(value).__name__} with {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 -- repr of arbitrary objects may fail
        return f"<unrepresentable {type(value).__name__} object>"
    if not isinstance(text, str):
        return f"<unrepresentable {type(value).__name__} object>"
    if len(text) > MAX_REPR:
        text = text[: MAX_REPR - 3] + "..."
    return text


def describe_typed(value: object) -> str:
    """Return :func:`describe` of ``value`` followed by its type name."""
    return f"{describe(value)} of type {type(value).__name__}"


def plain_text(value: str) -> str:
    """Return ``value`` as an exact :class:`str`, bypassing subclass hooks."""
    return str.__str__(value)


def is_none_like(value: object) -> bool:
    """Return True for None and the strings ``"None"``/``"none"``/``""``."""
    if value is None:
        return True
    return isinstance(value, str) and str.lower(str.strip(plain_text(value))) in NONE_STRINGS


def is_none_word(value: object) -> bool:
    """Return True for None and the string ``"None"`` in any case (an empty string is not None here)."""
    return value is None or (isinstance(value, str) and str.lower(str.strip(plain_text(value))) == "none")


def is_auto_word(value: str) -> bool:
    """Return True for the string ``"auto"`` in any case (an optional boolean's "decide for me")."""
    return str.lower(str.strip(plain_text(value))) == "auto"


def bool_word(value: str) -> bool | None:
    """``True``/``False`` for a boolean word (``yes``, ``off``, ``1`` ...), None for any other text."""
    text = str.lower(str.strip(plain_text(value)))
    if text in TRUE_STRINGS:
        return True
    if text in FALSE_STRINGS:
        return False
    return None
