"""How a job is told to stop: ``ckpt_preempt_signals`` and ``ckpt_deadline`` (standard library only).

**``ckpt_preempt_signals``**: the signals that ask a job to save and stop.
A value is a comma list of signal names or numbers (``"SIGTERM,SIGUSR1"``,
``"TERM, 10"``), a list or tuple of them, or ``"none"`` (off). It is kept as
a tuple of canonical names (``("SIGTERM", "SIGUSR1")``): hashable, readable
and the same on every platform that has the signals.

**``ckpt_deadline``**: when a job's wall time ends.
Accepted values:

* ``"auto"`` (the default): the scheduler's end time where one provides it
  (Slurm's ``SLURM_JOB_END_TIME``, epoch seconds, set from Slurm 23.02 on;
  before that, in a Slurm job (``SLURM_JOB_ID``), ``scontrol show job`` or
  ``squeue`` is asked once), else no deadline;
* ``"none"`` / ``"off"`` (or ``"false"``, ``"no"``, empty: the words that turn
  ``ckpt_preempt_signals`` off): no deadline;
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
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping

from candle_ckpt.config.spec import OFF_WORDS

_UNCATCHABLE = ("SIGKILL", "SIGSTOP")
SIGNALS_ALLOWED = "comma list of signal names or numbers (e.g. SIGTERM,SIGUSR1), or none"


def _one(item: object, key: str) -> str:
    """The canonical name of one signal given as a name or a number."""
    if isinstance(item, bool):
        raise TypeError(f"{key} must be a {SIGNALS_ALLOWED}; got {item!r}")
    if isinstance(item, numbers.Integral):
        try:
            name = signal.Signals(int(item)).name
        except ValueError:
            raise ValueError(
                f"{key}: {int(item)} is not a signal number on this platform ({SIGNALS_ALLOWED})"
            ) from None
    elif isinstance(item, str):
        text = str.strip(str.__str__(item))
        if text.isdigit():
            return _one(int(text), key)
        name = text.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        if not isinstance(getattr(signal.Signals, name, None), signal.Signals):
            raise ValueError(f"{key}: {text!r} is not a signal name on this platform ({SIGNALS_ALLOWED})")
    else:
        raise TypeError(f"{key} must be a {SIGNALS_ALLOWED}; got {type(item).__name__}")
    if name in _UNCATCHABLE:
        raise ValueError(f"{key}: {name} cannot be caught, so no save can follow it ({SIGNALS_ALLOWED})")
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
        raise TypeError(f"{key} must be a {SIGNALS_ALLOWED}; got {type(value).__name__}")
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


# -- ckpt_deadline ---------------------------------------------------------------------------------------------

DEADLINE_ALLOWED = "auto, none, +SECONDS (from the start), epoch seconds, or an ISO 8601 time"
SCHEDULER_ENV = ("SLURM_JOB_END_TIME",)
#: Where ``auto`` asks Slurm for a job's end time when the environment does not say (Slurm < 23.02).
SLURM_QUERIES = (("scontrol", "show", "job", "{job}"), ("squeue", "-h", "-j", "{job}", "-o", "%e"))
QUERY_TIMEOUT_S = 10.0
_ENDTIME = re.compile(r"(?:^|\s)EndTime=(\S+)")
_asked: dict[str, tuple[float | None, str]] = {}  # job ID -> the answer (Slurm is asked once per process)


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
        raise TypeError(f"{key} must be {DEADLINE_ALLOWED}; got {value!r}")
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"{key} must be {DEADLINE_ALLOWED}; got {value!r}")
        return repr(float(value))
    if not isinstance(value, str):
        raise TypeError(f"{key} must be {DEADLINE_ALLOWED}; got {type(value).__name__}")
    text = str.strip(str.__str__(value))
    low = text.lower()
    if low == "auto":
        return "auto"
    if low in OFF_WORDS:
        return "off"
    if text.startswith("+"):
        seconds = _number(text[1:])
        if seconds is None or seconds < 0:
            raise ValueError(f"{key}: {text!r} must be + followed by a number of seconds >= 0 ({DEADLINE_ALLOWED})")
        return f"+{seconds:g}"
    if _number(text) is not None and _number(text) >= 0:
        return text
    if _iso(text) is not None:
        return text
    raise ValueError(f"{key} must be {DEADLINE_ALLOWED}; got {text!r}")


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
        job = str(env.get("SLURM_JOB_ID", "")).strip()
        if job:
            if job not in _asked:
                _asked[job] = slurm_end_time(job, env)
            return _asked[job]
        return None, "off (no scheduler end time in the environment)"
    if text.startswith("+"):
        return start + float(text[1:]), f"{text} s from the start"
    number = _number(text)
    return (number if number is not None else _iso(text)), "ckpt_deadline"


def parse_slurm_time(text: str) -> float | None:
    """Epoch seconds of a Slurm time printed in UTC (``2026-11-25T18:57:14``); None for ``Unknown`` and the like."""
    try:
        when = _dt.datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return when.replace(tzinfo=_dt.UTC).timestamp()


def _run(argv: list[str], env: Mapping[str, str]) -> str:
    """A Slurm client's stdout, its times in UTC and ISO form (``TZ=UTC``, ``SLURM_TIME_FORMAT=standard``)."""
    child = {**os.environ, **env, "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
    proc = subprocess.run(argv, env=child, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise OSError(f"exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}")
    return proc.stdout


def slurm_end_time(
    job: str, env: Mapping[str, str], run: Callable[[list[str], Mapping[str, str]], str] = _run
) -> tuple[float | None, str]:
    """``(epoch seconds or None, where it came from)``: job ``job``'s end time from ``scontrol``, else ``squeue``.

    Each command runs once with ``TZ=UTC`` so that the printed time is read in
    the zone it was printed in. When neither answers, the source says why.

    Args:
        job: ``SLURM_JOB_ID``.
        env: The environment (``PATH``, ``SLURM_CONF``).
        run: ``run(argv, env)`` returns the command's stdout or raises ``OSError``
            or ``subprocess.SubprocessError`` (tests pass recorded outputs).
    """
    why = []
    for template in SLURM_QUERIES:
        argv = [part.format(job=job) for part in template]
        try:
            out = run(argv, env)
        except (OSError, subprocess.SubprocessError) as exc:
            why.append(f"{argv[0]}: {exc}")
            continue
        match = _ENDTIME.search(out) if argv[0] == "scontrol" else None
        value = parse_slurm_time(match.group(1) if match else out.strip().splitlines()[0] if out.strip() else "")
        if value is not None:
            return value, f"{' '.join(argv)} (SLURM_JOB_END_TIME is unset before Slurm 23.02)"
        why.append(f"{argv[0]}: no end time in {out.strip()[:120]!r}")
    return None, (
        f"off: SLURM_JOB_END_TIME is unset and Slurm did not tell job {job}'s end time ({'; '.join(why)}); "
        "no deadline is watched (pass ckpt_deadline as a time, or use sbatch --signal)"
    )


_warned: set[str] = set()


def unwatched_warning(text: str, source: str) -> str | None:
    """The warning to log when ``auto`` found no end time in a Slurm job: the first time only, else None."""
    if text != "auto" or not source.startswith("off: ") or source in _warned:
        return None
    _warned.add(source)
    return f"ckpt_deadline=auto: {source[5:]}"
