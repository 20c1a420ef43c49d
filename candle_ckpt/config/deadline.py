"""``ckpt_deadline``: when a job's wall time ends (standard library only).

Accepted values:

* ``"auto"`` (the default): the scheduler's end time where one provides it
  (Slurm's ``SLURM_JOB_END_TIME``, epoch seconds), else no deadline;
* ``"none"`` / ``"off"``: no deadline;
* ``"+SECONDS"``: that many seconds after the callback is created (``"+3600"``);
* an absolute time: epoch seconds (``1767225600``) or ISO 8601
  (``"2026-01-01T00:00:00+00:00"``; without a zone it is local time).

:func:`parse_deadline` validates and keeps the text (a frozen config holds
text); :func:`resolve_deadline` turns it into epoch seconds when the job starts.
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
from collections.abc import Mapping

ALLOWED = "auto, none, +SECONDS (from the start), epoch seconds, or an ISO 8601 time"
SCHEDULER_ENV = ("SLURM_JOB_END_TIME",)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _iso(text: str) -> float | None:
    try:
        return _dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_deadline(value: object, key: str = "ckpt_deadline") -> str:
    """The canonical text of a deadline: ``auto``, ``off``, ``+S`` or the absolute time as given.

    Raises:
        ValueError, TypeError: naming ``key`` and what is allowed.
    """
    if isinstance(value, bool):
        raise TypeError(f"{key} must be {ALLOWED}; got {value!r}")
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"{key} must be {ALLOWED}; got {value!r}")
        return repr(float(value))
    if not isinstance(value, str):
        raise TypeError(f"{key} must be {ALLOWED}; got {type(value).__name__}")
    text = str.strip(str.__str__(value))
    low = text.lower()
    if low == "auto":
        return "auto"
    if low in ("none", "off", ""):
        return "off"
    if text.startswith("+"):
        seconds = _number(text[1:])
        if seconds is None or seconds < 0:
            raise ValueError(f"{key}: {text!r} must be + followed by a number of seconds >= 0 ({ALLOWED})")
        return f"+{seconds:g}"
    if _number(text) is not None and _number(text) >= 0:
        return text
    if _iso(text) is not None:
        return text
    raise ValueError(f"{key} must be {ALLOWED}; got {text!r}")


def resolve_deadline(text: str, start: float, env: Mapping[str, str]) -> tuple[float | None, str]:
    """``(epoch seconds or None, where it came from)`` for a canonical deadline.

    Args:
        text: What :func:`parse_deadline` returned.
        start: Epoch seconds that ``+SECONDS`` counts from.
        env: The environment (``os.environ``) for ``auto``.
    """
    if text == "off":
        return None, "off"
    if text == "auto":
        for name in SCHEDULER_ENV:
            value = _number(str(env.get(name, "")).strip())
            if value is not None and value > 0:
                return value, name
        return None, "off (no scheduler end time in the environment)"
    if text.startswith("+"):
        return start + float(text[1:]), f"{text} s from the start"
    number = _number(text)
    return (number if number is not None else _iso(text)), "ckpt_deadline"
