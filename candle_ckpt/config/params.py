"""Checkpoint hyperparameters: parsing, validation and CLI definitions.

This module turns the ``ckpt_*`` entries of a CANDLE ``gParameters`` dict
into a validated, immutable :class:`CkptConfig`.  It also provides the
CANDLE-style benchmark definitions (:func:`ckpt_defs`), an argparse helper
(:func:`ckpt_parser`) and a table of the parameters for documentation
(:func:`describe_parameters`).

Values may arrive as Python objects or as strings read from configuration
files; both are coerced.  Every rejected value raises :class:`ValueError` or
:class:`TypeError` whose message names the offending ``gParameters`` key.

The module deliberately imports nothing heavier than the standard library so
that it loads in milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
import operator
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CKPT_KEYS",
    "CkptConfig",
    "ckpt_defs",
    "ckpt_parser",
    "describe_parameters",
    "str2bool",
]

_TRUE_STRINGS = frozenset({"true", "1", "yes", "on", "t", "y"})
_FALSE_STRINGS = frozenset({"false", "0", "no", "off", "f", "n"})
_BOOL_ALLOWED = "true/false, yes/no, on/off, t/f, y/n or 1/0"
_NONE_STRINGS = frozenset({"none", ""})
_MAX_REPR = 80


# --------------------------------------------------------------------------
# Parameter specifications (single source of truth)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """Description of one gParameters key.

    Attributes:
        key: The gParameters key.
        field: The matching :class:`CkptConfig` attribute.
        kind: One of ``bool``, ``int``, ``float``, ``choice``, ``str``,
            ``path``, ``text`` (free-form string), ``url`` (``protocol://...``)
            or ``json`` (a JSON object, kept as canonical text).
        default: Default value used when the key is missing or None.
        help: One-line description for ``--help`` and the README.
        allowed: Human-readable description of the accepted values.
        optional: Whether None is a legal value.
        choices: Legal values for ``choice`` parameters.
        minimum: Lower bound for numeric parameters, if any.
        strict: Whether ``minimum`` itself is excluded.
        cli: Whether the key gets a CLI/benchmark definition.
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


_SPECS: tuple[_Spec, ...] = (
    _Spec(
        key="ckpt_restart_mode",
        field="restart_mode",
        kind="choice",
        default="auto",
        help=(
            "Restart behaviour: 'off' never restarts, 'auto' resumes from the "
            "latest valid checkpoint if there is one, 'required' fails if "
            "none can be loaded."
        ),
        allowed="off, auto, required",
        choices=("off", "auto", "required"),
    ),
    _Spec(
        key="ckpt_save_best",
        field="save_best",
        kind="bool",
        default=True,
        help="Also keep the best model so far, judged by ckpt_save_best_metric.",
        allowed="boolean",
    ),
    _Spec(
        key="ckpt_save_best_metric",
        field="save_best_metric",
        kind="str",
        default="val_loss",
        help=("Metric from the Keras epoch logs used to judge the best model, e.g. val_loss."),
        allowed="non-empty string",
    ),
    _Spec(
        key="ckpt_save_best_mode",
        field="save_best_mode",
        kind="choice",
        default="auto",
        help=("Whether a lower ('min') or higher ('max') metric is better; 'auto' infers it from the metric name."),
        allowed="auto, min, max",
        choices=("auto", "min", "max"),
    ),
    _Spec(
        key="ckpt_skip_epochs",
        field="skip_epochs",
        kind="int",
        default=0,
        help="Number of initial epochs during which no checkpoint is written.",
        allowed="integer >= 0",
        minimum=0,
    ),
    _Spec(
        key="ckpt_save_interval",
        field="save_interval",
        kind="int",
        default=1,
        help="Write a checkpoint every N epochs; 0 disables checkpoint saving.",
        allowed="integer >= 0 (0 disables saving)",
        minimum=0,
    ),
    _Spec(
        key="ckpt_checksum",
        field="checksum",
        kind="bool",
        default=True,
        help=("Record a checksum of each checkpoint and verify it before restarting from it."),
        allowed="boolean",
    ),
    _Spec(
        key="ckpt_keep_mode",
        field="keep_mode",
        kind="choice",
        default="linear",
        help=(
            "Retention policy for old checkpoints: 'linear' keeps the newest "
            "ckpt_keep_limit, 'exponential' keeps an exponentially thinned "
            "history, 'all' keeps every checkpoint."
        ),
        allowed="linear, exponential, all",
        choices=("linear", "exponential", "all"),
    ),
    _Spec(
        key="ckpt_keep_limit",
        field="keep_limit",
        kind="int",
        default=1_000_000,
        help=("Maximum number of epoch checkpoints kept on disk; older ones are deleted."),
        allowed="integer > 0",
        minimum=0,
        strict=True,
    ),
    _Spec(
        key="ckpt_directory",
        field="directory",
        kind="path",
        default="./save",
        help="Directory in which checkpoints are written.",
        allowed="non-empty path",
    ),
    _Spec(
        key="ckpt_metadata",
        field="metadata",
        kind="text",
        default=None,
        help=("Free-form string stored with each checkpoint; falls back to CANDLE's metadata parameter."),
        allowed="string or None",
        optional=True,
    ),
    _Spec(
        key="ckpt_save_weights_only",
        field="save_weights_only",
        kind="bool",
        default=False,
        help=(
            "Write only model.weights.h5 (weights and optimizer state, what restart() loads); "
            "False also writes a full model.keras for keras.models.load_model."
        ),
        allowed="boolean",
    ),
    _Spec(
        key="ckpt_restart_epoch",
        field="restart_epoch",
        kind="int",
        default=None,
        help=("Restart from the checkpoint of this epoch instead of the latest one; None means the latest."),
        allowed="integer >= 0 or None",
        optional=True,
        minimum=0,
    ),
    _Spec(
        key="ckpt_on_error",
        field="on_error",
        kind="choice",
        default="raise",
        help=(
            "What to do when writing a checkpoint fails: 'raise' stops training, 'warn' logs a warning and continues."
        ),
        allowed="raise, warn",
        choices=("raise", "warn"),
    ),
    _Spec(
        key="ckpt_async",
        field="async_save",
        kind="bool",
        default=False,
        help=("Write checkpoints in a background thread so that training is not blocked by disk I/O."),
        allowed="boolean",
    ),
    _Spec(
        key="ckpt_async_timeout",
        field="async_timeout",
        kind="float",
        default=600.0,
        help=("Seconds that train end and interpreter exit wait for pending background checkpoint writes."),
        allowed="finite number > 0 (seconds)",
        minimum=0.0,
        strict=True,
    ),
    _Spec(
        key="ckpt_upload_url",
        field="upload_url",
        kind="url",
        default=None,
        help=(
            "fsspec URL (s3://, gs://, file://, memory://...) to which committed "
            "checkpoints are copied in the background; None disables uploads."
        ),
        allowed="URL of the form protocol://path, or None",
        optional=True,
    ),
    _Spec(
        key="ckpt_upload_mode",
        field="upload_mode",
        kind="choice",
        default="every",
        help=("'every' uploads each committed checkpoint; 'end' uploads only best and last when training ends."),
        allowed="every, end",
        choices=("every", "end"),
    ),
    _Spec(
        key="ckpt_upload_options",
        field="upload_options",
        kind="json",
        default=None,
        help=(
            "JSON object of fsspec storage options for ckpt_upload_url, e.g. "
            '\'{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}\'.'
        ),
        allowed="JSON object (string or mapping), or None",
        optional=True,
    ),
    _Spec(
        key="ckpt_best_metric_last",
        field="best_metric_last",
        kind="metric",
        default=None,
        help=(
            "Best value of ckpt_save_best_metric so far, which an epoch must beat to be the new best "
            "(CANDLE scripts set it from restart()'s best_metric_last); None: taken from the checkpoint "
            "restart() loaded, else no best yet."
        ),
        allowed="number (inf allowed) or None",
        optional=True,
    ),
    _Spec(
        key="ckpt_layout",
        field="layout",
        kind="choice",
        default=None,
        help=(
            "'nested': <ckpt_directory>/ckpts/epochs/NNN (Benchmarks master, CandleCheckpointCallback); "
            "'flat': <ckpt_directory>/epochs/NNN (candle_lib develop); None: the API chooses "
            "(CandleCkptKeras flat, the others nested)."
        ),
        allowed="nested, flat, or None",
        optional=True,
        choices=("nested", "flat"),
    ),
    _Spec(
        key="epochs",
        field="epochs",
        kind="int",
        default=None,
        help="Total number of training epochs (CANDLE's standard epochs key).",
        allowed="integer > 0 or None",
        optional=True,
        minimum=0,
        strict=True,
        cli=False,
    ),
)

_SPEC_BY_KEY: dict[str, _Spec] = {spec.key: spec for spec in _SPECS}
_METADATA_FALLBACK_KEY = "metadata"

#: Every gParameters key read by :meth:`CkptConfig.from_params`: all
#: ``ckpt_*`` keys, then CANDLE's ``epochs`` and ``metadata``.
CKPT_KEYS: tuple[str, ...] = (
    *(spec.key for spec in _SPECS),
    _METADATA_FALLBACK_KEY,
)


# --------------------------------------------------------------------------
# Coercion helpers
# --------------------------------------------------------------------------


def _describe(value: object) -> str:
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
    if len(text) > _MAX_REPR:
        text = text[: _MAX_REPR - 3] + "..."
    return text


def _describe_typed(value: object) -> str:
    """Return :func:`_describe` of ``value`` followed by its type name."""
    return f"{_describe(value)} of type {type(value).__name__}"


def _plain_text(value: str) -> str:
    """Return ``value`` as an exact :class:`str`, bypassing subclass hooks."""
    return str.__str__(value)


def _is_none_like(value: object) -> bool:
    """Return True for None and the strings ``"None"``/``"none"``/``""``."""
    if value is None:
        return True
    return isinstance(value, str) and str.lower(str.strip(_plain_text(value))) in _NONE_STRINGS


def _is_none_word(value: object) -> bool:
    """Return True for None and the string ``"None"`` in any case (an empty string is not None here)."""
    return value is None or (isinstance(value, str) and str.lower(str.strip(_plain_text(value))) == "none")


def _check_range(spec: _Spec, key: str, number: float) -> None:
    """Raise ValueError if ``number`` violates the spec's lower bound."""
    if spec.minimum is None:
        return
    if spec.strict and not number > spec.minimum:
        op = ">"
    elif not spec.strict and not number >= spec.minimum:
        op = ">="
    else:
        return
    raise ValueError(f"{key} must be {op} {spec.minimum:g}; got {_describe(number)}")


def _to_bool(spec: _Spec, key: str, value: object) -> bool:
    """Coerce a boolean parameter."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = str.lower(str.strip(_plain_text(value)))
        if text in _TRUE_STRINGS:
            return True
        if text in _FALSE_STRINGS:
            return False
        raise ValueError(f"{key} must be a boolean ({_BOOL_ALLOWED}); got {_describe(value)}")
    if isinstance(value, numbers.Integral):
        number = operator.index(value)
        if number in (0, 1):
            return bool(number)
        raise ValueError(f"{key} must be a boolean ({_BOOL_ALLOWED}); got {_describe(value)}")
    raise TypeError(f"{key} must be a boolean ({_BOOL_ALLOWED}); got {_describe_typed(value)}")


def _integral_float(key: str, number: float, original: object) -> int:
    """Convert a float to int if it is finite and integral."""
    if not math.isfinite(number) or not number.is_integer():
        raise ValueError(f"{key} must be an integer; got {_describe(original)}")
    return int(number)


def _to_int(spec: _Spec, key: str, value: object) -> int:
    """Coerce an integer parameter and check its range."""
    if isinstance(value, bool):
        raise TypeError(f"{key} must be an integer, not a boolean; got {_describe(value)}")
    if isinstance(value, numbers.Integral):
        number = operator.index(value)
    elif isinstance(value, numbers.Real):
        number = _integral_float(key, float(value), value)
    elif isinstance(value, str):
        text = str.strip(_plain_text(value))
        try:
            number = int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                raise ValueError(f"{key} must be an integer; got {_describe(value)}") from None
            number = _integral_float(key, as_float, value)
    else:
        raise TypeError(f"{key} must be an integer; got {_describe_typed(value)}")
    _check_range(spec, key, number)
    return number


def _to_float(spec: _Spec, key: str, value: object) -> float:
    """Coerce a finite float parameter and check its range."""
    if isinstance(value, bool):
        raise TypeError(f"{key} must be a number, not a boolean; got {_describe(value)}")
    if isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"{key} must be a finite number; got {_describe(value)}") from None
    elif isinstance(value, str):
        try:
            number = float(str.strip(_plain_text(value)))
        except ValueError:
            raise ValueError(f"{key} must be a number; got {_describe(value)}") from None
    else:
        raise TypeError(f"{key} must be a number; got {_describe_typed(value)}")
    if not math.isfinite(number):
        raise ValueError(f"{key} must be a finite number; got {_describe(value)}")
    _check_range(spec, key, number)
    return number


def _to_metric(spec: _Spec, key: str, value: object) -> float:
    """Coerce a metric value: any real number, infinities included (CANDLE's "no best yet"), never NaN."""
    if isinstance(value, bool):
        raise TypeError(f"{key} must be a number, not a boolean; got {_describe(value)}")
    if isinstance(value, str):
        try:
            number = float(str.strip(_plain_text(value)))
        except ValueError:
            raise ValueError(f"{key} must be a number (inf allowed); got {_describe(value)}") from None
    elif isinstance(value, numbers.Real):
        number = float(value)
    else:
        raise TypeError(f"{key} must be a number (inf allowed) or None; got {_describe_typed(value)}")
    if math.isnan(number):
        raise ValueError(f"{key} must be a number (inf allowed), not NaN; got {_describe(value)}")
    return number


def _to_choice(spec: _Spec, key: str, value: object) -> str:
    """Coerce a choice parameter (case-insensitive, whitespace-stripped)."""
    allowed = ", ".join(f"'{choice}'" for choice in spec.choices)
    if not isinstance(value, str):
        hint = ""
        if isinstance(value, bool):
            hint = " (quote the value: some config formats read off/on as booleans)"
        raise TypeError(f"{key} must be one of {allowed}; got {_describe_typed(value)}{hint}")
    text = str.lower(str.strip(_plain_text(value)))
    if text not in spec.choices:
        raise ValueError(f"{key} must be one of {allowed}; got {_describe(value)}")
    return text


def _to_str(spec: _Spec, key: str, value: object) -> str:
    """Coerce a non-empty string parameter (surrounding whitespace removed)."""
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a non-empty string; got {_describe_typed(value)}")
    text = str.strip(_plain_text(value))
    if not text:
        raise ValueError(f"{key} must be a non-empty string; got {_describe(value)}")
    return text


def _to_path(spec: _Spec, key: str, value: object) -> str:
    """Coerce a directory parameter given as str or os.PathLike."""
    if isinstance(value, os.PathLike) and not isinstance(value, str):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{key} must be a non-empty path (str or os.PathLike resolving to str); got {_describe_typed(value)}"
        )
    text = _plain_text(value)
    if not str.strip(text):
        raise ValueError(f"{key} must be a non-empty path; got {_describe(value)}")
    if "\x00" in text:
        raise ValueError(f"{key} must not contain NUL characters; got {_describe(value)}")
    return text


_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S")


def _to_url(spec: _Spec, key: str, value: object) -> str:
    """Coerce an fsspec URL: ``protocol://rest``, without surrounding whitespace."""
    if isinstance(value, os.PathLike) and not isinstance(value, str):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a URL string such as 's3://bucket/job'; got {_describe_typed(value)}")
    text = str.strip(_plain_text(value))
    if not _URL_RE.match(text) or "\x00" in text:
        raise ValueError(
            f"{key} must be a URL of the form protocol://path (e.g. s3://bucket/job, "
            f"file:///scratch/job, memory://job); got {_describe(value)}"
        )
    return text


def _to_json(spec: _Spec, key: str, value: object) -> str:
    """Coerce a JSON object given as a string or a mapping to canonical JSON text.

    The config keeps the text (not a dict) so that it stays immutable and hashable.
    """
    if isinstance(value, Mapping):
        try:
            return json.dumps(dict(value), sort_keys=True)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{key} must be JSON-serialisable; {err}") from None
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a JSON object (a string or a mapping); got {_describe_typed(value)}")
    try:
        parsed = json.loads(_plain_text(value))
    except json.JSONDecodeError as err:
        raise ValueError(f"{key} must be a JSON object; {_describe(value)} is not valid JSON ({err})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{key} must be a JSON object ({{...}}); got {_describe(value)}")
    return json.dumps(parsed, sort_keys=True)


def _to_text(spec: _Spec, key: str, value: object) -> str:
    """Coerce a free-form string parameter (kept verbatim)."""
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string or None; got {_describe_typed(value)}")
    return _plain_text(value)


_COERCERS: dict[str, Callable[[_Spec, str, object], Any]] = {
    "bool": _to_bool,
    "int": _to_int,
    "float": _to_float,
    "metric": _to_metric,
    "choice": _to_choice,
    "str": _to_str,
    "path": _to_path,
    "text": _to_text,
    "url": _to_url,
    "json": _to_json,
}


def _coerce(spec: _Spec, value: object, key: str | None = None) -> Any:
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
    if spec.optional and _is_none_like(value):
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


# --------------------------------------------------------------------------
# Configuration object
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CkptConfig:
    """Validated checkpoint settings.

    Every field is validated and normalised on construction (including via
    :meth:`replace`), so an instance always holds clean values.  Build one
    from a CANDLE ``gParameters`` dict with :meth:`from_params`.

    Attributes:
        restart_mode: ``"off"``, ``"auto"`` or ``"required"``.
        save_best: Whether to keep the best model so far.
        save_best_metric: Metric used to judge the best model.
        save_best_mode: ``"auto"``, ``"min"`` or ``"max"``.
        skip_epochs: Number of initial epochs without checkpoints.
        save_interval: Save every N epochs; 0 disables saving.
        checksum: Whether checkpoints are checksummed and verified.
        keep_mode: ``"linear"`` or ``"exponential"`` retention.
        keep_limit: Maximum number of epoch checkpoints kept.
        directory: Checkpoint directory.
        metadata: Free-form string stored with checkpoints, or None.
        save_weights_only: Whether only weights are saved.
        restart_epoch: Epoch to restart from, or None for the latest.
        on_error: ``"raise"`` or ``"warn"`` when a save fails.
        async_save: Whether checkpoints are written in the background.
        async_timeout: Seconds to wait for background writes at exit.
        upload_url: fsspec URL that checkpoints are mirrored to, or None.
        upload_mode: ``"every"`` (each commit) or ``"end"`` (best and last at the end).
        upload_options: fsspec storage options as canonical JSON text, or None.
        best_metric_last: The best value to beat (``ckpt_best_metric_last``), or None.
        layout: ``"nested"`` (``<dir>/ckpts/epochs``) or ``"flat"`` (``<dir>/epochs``).
        epochs: Total number of training epochs, or None if unknown.
    """

    restart_mode: str = "auto"
    save_best: bool = True
    save_best_metric: str = "val_loss"
    save_best_mode: str = "auto"
    skip_epochs: int = 0
    save_interval: int = 1
    checksum: bool = True
    keep_mode: str = "linear"
    keep_limit: int = 1_000_000
    directory: str = "./save"
    metadata: str | None = None
    save_weights_only: bool = False
    restart_epoch: int | None = None
    on_error: str = "raise"
    async_save: bool = False
    async_timeout: float = 600.0
    upload_url: str | None = None
    upload_mode: str = "every"
    upload_options: str | None = None
    best_metric_last: float | None = None
    layout: str = "nested"
    epochs: int | None = None

    def __post_init__(self) -> None:
        """Validate and normalise every field.

        Raises:
            ValueError: A field has an invalid value.
            TypeError: A field has an invalid type.
        """
        for spec in _SPECS:
            value = _coerce(spec, getattr(self, spec.field))
            object.__setattr__(self, spec.field, value)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, require_epochs: bool = False) -> CkptConfig:
        """Build a configuration from a CANDLE ``gParameters`` mapping.

        Missing keys, and keys whose value is None or the string ``"None"``
        (any case: what a command line or config file gives), take their defaults.
        Unknown keys are ignored.  If ``ckpt_metadata`` is missing or
        None-like, CANDLE's ``metadata`` key is used instead.

        Args:
            params: The job's parameters, e.g. ``gParameters`` or
                ``vars(parser.parse_args())``.
            require_epochs: If True, ``epochs`` must be present and not None.

        Returns:
            The validated configuration.

        Raises:
            ValueError: A value is invalid, or ``epochs`` is required but
                missing.  The message names the gParameters key.
            TypeError: A value has an invalid type, or ``params`` is not a
                mapping.
        """
        if not isinstance(params, Mapping):
            hint = ""
            if hasattr(params, "layers") or hasattr(params, "fit"):
                hint = " (a model? the parameter dict comes first: restart(gParameters, model))"
            raise TypeError(
                "gParameters must be a mapping such as the parameter dict (use "
                f"vars(args) for an argparse.Namespace); got {type(params).__name__}{hint}"
            )
        kwargs: dict[str, Any] = {}
        for spec in _SPECS:
            value = params.get(spec.key)
            if not _is_none_word(value):
                kwargs[spec.field] = _coerce(spec, value)
        if _is_none_like(params.get("ckpt_metadata")):
            fallback = params.get(_METADATA_FALLBACK_KEY)
            kwargs["metadata"] = _coerce(
                _SPEC_BY_KEY["ckpt_metadata"],
                fallback,
                key=f"{_METADATA_FALLBACK_KEY} (used because ckpt_metadata is unset)",
            )
        config = cls(**kwargs)
        if require_epochs and config.epochs is None:
            raise ValueError("epochs is required (an integer > 0) but gParameters['epochs'] is missing or None")
        return config

    def replace(self, **changes: Any) -> CkptConfig:
        """Return a copy with some fields changed (and re-validated).

        Args:
            **changes: New values, keyed by field name (not gParameters key).

        Returns:
            The new configuration.

        Raises:
            ValueError: A new value is invalid.
            TypeError: A new value has an invalid type or a name is unknown.
        """
        return dataclasses.replace(self, **changes)

    def to_params(self) -> dict[str, Any]:
        """Return the configuration as a gParameters-style dict.

        The result round-trips: ``CkptConfig.from_params(c.to_params()) == c``.

        Returns:
            A dict keyed by gParameters key (``ckpt_*`` keys and ``epochs``).
        """
        return {spec.key: getattr(self, spec.field) for spec in _SPECS}


# --------------------------------------------------------------------------
# Command-line support
# --------------------------------------------------------------------------


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
    if isinstance(value, str):
        text = str.lower(str.strip(_plain_text(value)))
        if text in _TRUE_STRINGS:
            return True
        if text in _FALSE_STRINGS:
            return False
    raise argparse.ArgumentTypeError(f"Boolean value expected ({_BOOL_ALLOWED}); got {_describe(value)}")


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
    "json": str,
}


def _definition(spec: _Spec) -> dict[str, Any]:
    """Return the CANDLE benchmark definition dict for ``spec``."""
    definition: dict[str, Any] = {
        "name": spec.key,
        "type": _DEF_TYPES[spec.kind],
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
    result.extend(_definition(spec) for spec in _SPECS if spec.cli and spec.key not in present)
    return result


def _normalise_choice(text: str) -> str:
    """Argparse type for choice options: strip and lower-case."""
    return text.strip().lower()


def _optional_int(text: str) -> int | None:
    """Argparse type for optional integers: ``None``/``none``/empty is None."""
    if _is_none_like(text):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {_describe(text)}") from None


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
    for spec in _SPECS:
        if not spec.cli or _has_option(parser, spec.key):
            continue
        kwargs: dict[str, Any] = {"default": spec.default, "help": spec.help}
        if spec.kind == "bool":
            kwargs.update(type=str2bool, nargs="?", const=True, metavar="BOOL")
        elif spec.kind == "choice":
            kwargs.update(type=_normalise_choice, choices=list(spec.choices))
        elif spec.kind == "int" and spec.optional:
            kwargs.update(type=_optional_int, metavar="INT")
        else:
            kwargs["type"] = _DEF_TYPES[spec.kind]
        parser.add_argument(f"--{spec.key}", **kwargs)
    return parser


def describe_parameters() -> list[tuple[str, str, str, str]]:
    """Return documentation rows for every parameter.

    Returns:
        One ``(key, allowed values, default, help)`` tuple per ``ckpt_*``
        key and for ``epochs``, in a stable order.  Defaults are rendered
        as they would be written in a config file (``None`` for unset).
    """
    return [(spec.key, spec.allowed, str(spec.default), spec.help) for spec in _SPECS]
