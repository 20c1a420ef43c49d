"""``ckpt_preempt_signals``: the signals that ask a job to save and stop (standard library only).

A value is a comma list of signal names or numbers (``"SIGTERM,SIGUSR1"``,
``"TERM, 10"``), a list or tuple of them, or ``"none"`` (off). It is kept as
a tuple of canonical names (``("SIGTERM", "SIGUSR1")``): hashable, readable
and the same on every platform that has the signals.
"""

from __future__ import annotations

import numbers
import signal
from collections.abc import Iterable

OFF_WORDS = frozenset({"none", "off", "false", "no", ""})
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")
ALLOWED = "comma list of signal names or numbers (e.g. SIGTERM,SIGUSR1), or none"


def _one(item: object, key: str) -> str:
    """The canonical name of one signal given as a name or a number."""
    if isinstance(item, bool):
        raise TypeError(f"{key} must be a {ALLOWED}; got {item!r}")
    if isinstance(item, numbers.Integral):
        try:
            name = signal.Signals(int(item)).name
        except ValueError:
            raise ValueError(f"{key}: {int(item)} is not a signal number on this platform ({ALLOWED})") from None
    elif isinstance(item, str):
        text = str.strip(str.__str__(item))
        if text.isdigit():
            return _one(int(text), key)
        name = text.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        if not isinstance(getattr(signal.Signals, name, None), signal.Signals):
            raise ValueError(f"{key}: {text!r} is not a signal name on this platform ({ALLOWED})")
    else:
        raise TypeError(f"{key} must be a {ALLOWED}; got {type(item).__name__}")
    if name in _UNCATCHABLE:
        raise ValueError(f"{key}: {name} cannot be caught, so no save can follow it ({ALLOWED})")
    return name


def parse_signals(value: object, key: str = "ckpt_preempt_signals") -> tuple[str, ...]:
    """Canonical signal names of ``value`` (see the module docstring); ``()`` means off.

    Raises:
        ValueError, TypeError: naming ``key`` and what is allowed.
    """
    if isinstance(value, str):
        text = str.strip(str.__str__(value))
        if text.lower() in OFF_WORDS:
            return ()
        items: Iterable[object] = text.split(",")
    elif isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        items = [value]
    else:
        raise TypeError(f"{key} must be a {ALLOWED}; got {type(value).__name__}")
    names: list[str] = []
    for item in items:
        name = _one(item, key)
        if name not in names:
            names.append(name)
    return tuple(names)


def signal_numbers(names: Iterable[str]) -> tuple[int, ...]:
    """The numbers of canonical signal names (as :func:`parse_signals` returns them)."""
    return tuple(int(getattr(signal.Signals, name)) for name in names)


EXIT_WORDS = ("signal", "return")
EXIT_ALLOWED = "signal (128 + the signal's number), return (fit returns), or an integer 0-255"


def parse_exit_code(value: object, key: str = "ckpt_preempt_exit_code") -> int | str:
    """``ckpt_preempt_exit_code``: ``"signal"``, ``"return"`` or an int 0-255.

    Raises:
        ValueError, TypeError: naming ``key`` and what is allowed.
    """
    if isinstance(value, bool):
        raise TypeError(f"{key} must be {EXIT_ALLOWED}; got {value!r}")
    if isinstance(value, str):
        text = str.strip(str.__str__(value))
        if text.lower() in EXIT_WORDS:
            return text.lower()
        if not text.lstrip("-").isdigit():
            raise ValueError(f"{key} must be {EXIT_ALLOWED}; got {text!r}")
        value = int(text)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"{key} must be {EXIT_ALLOWED}; got {type(value).__name__}")
    number = int(value)
    if number < 0:
        raise ValueError(f"{key} must be >= 0 ({EXIT_ALLOWED}); got {number}")
    if number > 255:
        raise ValueError(f"{key} must be <= 255 ({EXIT_ALLOWED}); got {number}")
    return number
