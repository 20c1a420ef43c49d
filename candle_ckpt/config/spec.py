"""One row of the parameter schema (:class:`Spec`), the words a raw value is read with, and its safe reading.

The rows themselves are two tables, one per idea: :mod:`~candle_ckpt.config.checkpoint_keys` (what a checkpoint
holds, when one is saved, which are kept and which one a restart resumes) and
:mod:`~candle_ckpt.config.cluster_keys` (how a job on a preemptible cluster writes and survives);
:mod:`~candle_ckpt.config.schema` joins them.

Reading a raw value (:func:`describe`, :func:`plain_text`, the none and boolean words) never fails.

Values come from users, config files and command lines, and may be hostile
(a ``__repr__`` that raises, a ``str`` subclass with hooks, a huge integer):
everything here works on any object, so error messages can always name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TRUE_STRINGS = frozenset({"true", "1", "yes", "on", "t", "y"})
FALSE_STRINGS = frozenset({"false", "0", "no", "off", "f", "n"})
BOOL_ALLOWED = "true/false, yes/no, on/off, t/f, y/n or 1/0"
NONE_STRINGS = frozenset({"none", ""})
#: The words that turn a feature off (``ckpt_preempt_signals=none``, ``ckpt_deadline=off``,
#: ``ckpt_hang_timeout=off``), case-insensitive.
OFF_WORDS = frozenset({"none", "off", "false", "no", ""})
MAX_REPR = 80


@dataclass(frozen=True)
class Spec:
    """Description of one gParameters key.

    Attributes:
        key: The gParameters key.
        field: The matching :class:`CkptConfig` attribute.
        kind: One of ``bool``, ``int``, ``float``, ``choice``, ``str``,
            ``path``, ``text`` (free-form string), ``url`` (``protocol://...``),
            ``json`` (a JSON object, kept as canonical text), ``steps`` (``auto`` or
            an ``int``) or ``mtbf`` (``auto`` or a ``float``).
        default: Default value used when the key is missing or None.
        help: One-line description for ``--help`` and the README.
        allowed: Human-readable description of the accepted values.
        optional: Whether None is a legal value.
        choices: Legal values for ``choice`` parameters.
        minimum: Lower bound for numeric parameters, if any.
        strict: Whether ``minimum`` itself is excluded.
        cli: Whether the key gets a CLI/benchmark definition.
        maximum: Upper bound (included) for numeric parameters, if any.
        none_is_value: The word ``"none"`` is a value of its own (it turns
            the feature off) rather than "use the default".
    """

    key: str
    field: str
    kind: str
    default: Any
    help: str
    allowed: str
    optional: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    strict: bool = False
    cli: bool = True
    maximum: float | None = None
    none_is_value: bool = False


# -- a raw value, read safely -----------------------------------------------------------------------------------


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
