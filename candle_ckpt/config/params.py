"""Checkpoint hyperparameters: the validated, immutable :class:`CkptConfig`.

This module turns the ``ckpt_*`` entries of a CANDLE ``gParameters`` dict
into a :class:`CkptConfig`, using the schema (:mod:`candle_ckpt.config.schema`)
and its coercion (:mod:`candle_ckpt.config.coerce`). The argparse and CANDLE
definitions are in :mod:`candle_ckpt.config.cli_args`.

Values may arrive as Python objects or as strings read from configuration
files; both are coerced.  Every rejected value raises :class:`ValueError` or
:class:`TypeError` whose message names the offending ``gParameters`` key.

The entry points' own arguments are checked here too (:func:`require_params`,
:func:`require_model`): the parameter dict and the model told apart, with a
clear ``TypeError``, never an ``AttributeError``.

The module deliberately imports nothing heavier than the standard library so
that it loads in milliseconds.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from candle_ckpt.config.coerce import coerce
from candle_ckpt.config.schema import METADATA_FALLBACK_KEY, SPEC_BY_KEY, SPECS
from candle_ckpt.config.spec import is_none_like, is_none_word


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
        max_no_progress_restarts: Resumes of one checkpoint in a row, each earlier one failing before a commit,
            at which ``restart()`` refuses a crash loop (exit status 65); 0: never.
        on_error: ``"raise"`` or ``"warn"`` when a save fails.
        async_save: Whether checkpoints are written in the background.
        async_timeout: Seconds to wait for background writes at exit.
        upload_url: fsspec URL that checkpoints are mirrored to, or None.
        upload_mode: ``"every"`` (each commit) or ``"end"`` (best and last at the end).
        upload_options: fsspec storage options as canonical JSON text, or None.
        persistent_url: The persistent tier (a path or an fsspec URL), or None (see :attr:`persistent`).
        drain: ``"every"``, ``"interval"``, ``"preempt"``, ``"end"`` or None (see :attr:`drain_policy`).
        drain_interval: With ``drain="interval"``: drain every N-th epoch commit.
        drain_timeout: Seconds a drain may take before the process exits (a preemption save's; at any other
            exit with the run open, the newest commit's).
        best_metric_last: The best value to beat (``ckpt_best_metric_last``), or None.
        layout: ``"nested"`` (``<dir>/ckpts/epochs``) or ``"flat"`` (``<dir>/epochs``).
        compile_cache: ``"auto"``, ``"off"`` or a directory: JAX's persistent compilation cache
            (see :mod:`candle_ckpt.multihost.compile_cache`).
        save_steps: Also save every N steps of an epoch; 0: never; ``"auto"``: chosen as the run goes
            (:mod:`candle_ckpt.engine.interval`).
        mtbf: Mean seconds between failures for ``save_steps="auto"``, or ``"auto"`` (learned).
        preempt_signals: Names of the signals that make ``fit`` save and stop; ``()``: none.
        preempt_exit_code: After a preemption save: ``"signal"`` (exit with 128 + its number),
            ``"return"`` (stop training, ``fit`` returns) or an exit status.
        deadline: ``ckpt_deadline`` as text (see :mod:`candle_ckpt.config.preemption`).
        deadline_margin: Seconds kept in reserve before the deadline.
        hang_timeout: ``ckpt_hang_timeout``: ``"auto"``, seconds, or ``"none"`` (no hang watchdog).
        preempt_check: Deprecated, no effect (a warning says so; the value is still checked).
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
    max_no_progress_restarts: int = 3
    on_error: str = "raise"
    async_save: bool | None = None  # None: "auto" (asynchronous), decided by resolved()
    async_timeout: float = 600.0
    upload_url: str | None = None
    upload_mode: str = "every"
    upload_options: str | None = None
    persistent_url: str | None = None
    drain: str | None = None
    drain_interval: int = 5
    drain_timeout: float = 25.0
    best_metric_last: float | None = None
    layout: str = "nested"
    compile_cache: str = "auto"
    save_steps: int | str = "auto"
    mtbf: float | str = "auto"
    preempt_signals: tuple[str, ...] = ("SIGTERM",)
    preempt_exit_code: int | str = "signal"
    deadline: str = "auto"
    deadline_margin: float = 60.0
    hang_timeout: float | str = "auto"
    preempt_check: int = 1
    epochs: int | None = None

    def __post_init__(self) -> None:
        """Validate and normalise every field.

        Raises:
            ValueError: A field has an invalid value.
            TypeError: A field has an invalid type.
        """
        for spec in SPECS:
            value = coerce(spec, getattr(self, spec.field))
            object.__setattr__(self, spec.field, value)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, require_epochs: bool = False) -> CkptConfig:
        """Build a configuration from a CANDLE ``gParameters`` mapping.

        Missing keys, and keys whose value is None or the string ``"None"``
        (any case: what a command line or config file gives), take their defaults.
        Unknown keys are ignored; an unknown ``ckpt_*`` key (a typo in a
        config file) gets one warning naming the closest known key.  If ``ckpt_metadata`` is missing or
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
        for key in params:
            if isinstance(key, str) and key.startswith("ckpt_") and key not in SPEC_BY_KEY:
                _warn_unknown(key)
        # Said only where a value other than the default was given: a parser's or CANDLE's defaults dict carries it.
        if params.get("ckpt_preempt_check") not in (None, SPEC_BY_KEY["ckpt_preempt_check"].default, "1"):
            _warn_deprecated("ckpt_preempt_check")
        kwargs: dict[str, Any] = {}
        for spec in SPECS:
            value = params.get(spec.key)
            if value is None or (not spec.none_is_value and is_none_word(value)):
                continue
            if spec.optional and spec.default is None and is_none_like(value):
                continue  # '' as well as None: the dataclass default (ckpt_layout's None means "the API chooses")
            kwargs[spec.field] = coerce(spec, value)
        if is_none_like(params.get("ckpt_metadata")):
            fallback = params.get(METADATA_FALLBACK_KEY)
            kwargs["metadata"] = coerce(
                SPEC_BY_KEY["ckpt_metadata"],
                fallback,
                key=f"{METADATA_FALLBACK_KEY} (used because ckpt_metadata is unset)",
            )
        config = cls(**kwargs)
        if require_epochs and config.epochs is None:
            raise ValueError("epochs is required (an integer > 0) but gParameters['epochs'] is missing or None")
        return config

    @property
    def flat(self) -> bool:
        """Whether checkpoints use the ``flat`` layout (the one place ``ckpt_layout`` is read).

        :meth:`candle_ckpt.core.layout.Layout.of` turns this configuration into its paths.
        """
        return self.layout == "flat"

    @property
    def persistent(self) -> str | None:
        """The persistent tier: ``ckpt_persistent_url``, else the deprecated ``ckpt_upload_url``, else None."""
        return self.persistent_url if self.persistent_url is not None else self.upload_url

    @property
    def persistent_key(self) -> str:
        """The parameter that set :attr:`persistent` (named in messages)."""
        return "ckpt_persistent_url" if self.persistent_url is not None else "ckpt_upload_url"

    @property
    def drain_policy(self) -> str:
        """``ckpt_drain``, else the deprecated ``ckpt_upload_mode`` (``every`` or ``end``)."""
        return self.drain if self.drain is not None else self.upload_mode

    def resolved(self) -> CkptConfig:
        """This configuration with ``ckpt_async=auto`` (None) decided: asynchronous, in one process as in many.

        An epoch checkpoint then stalls training for a host copy of the state, not for the write; a save whose copy
        would not fit in the memory left is written synchronously (:func:`candle_ckpt.engine.writer.copy_refused`).
        docs/async.rst says what that trades. A value the user gave is kept.
        """
        return self if self.async_save is not None else self.replace(async_save=True)

    def restores(self, epoch: int | None = None) -> bool:
        """Whether a restart looks for a checkpoint at all.

        ``ckpt_restart_mode=off`` starts from scratch, unless the caller asks for
        an exact ``epoch``: an explicit request is always honoured.
        """
        return self.restart_mode != "off" or epoch is not None

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


_UNREPORTED: list[str] = []  # warnings about the dict, waiting for the log of the object that reads it


@functools.cache  # one warning per key and process
def _warn_deprecated(key: str) -> None:
    """Say once that ``key`` no longer does anything (its value is still checked, so old configs stay valid).

    Queued in :data:`_UNREPORTED` like the unknown-key warning, so it is written like every other line.
    """
    _UNREPORTED.append(
        f"{key} is deprecated and has no effect: no process talks on a training step any more (docs/preemption.rst)"
    )


@functools.cache  # one warning per key and process, however many objects read the dict
def _warn_unknown(key: str) -> None:
    """Warn that ``key`` is no ``ckpt_*`` parameter, naming the closest one.

    The configuration knows no log: the warning waits in :data:`_UNREPORTED` until the object that
    read the dict (callback, ``restart()``, ``JobRunner``) opens its log (:class:`candle_ckpt.core.log.OpsLog`),
    which writes it like every other line: in ``ckpt.log`` and, timestamped, on the console.
    """
    close = difflib.get_close_matches(key, [spec.key for spec in SPECS], n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "the keys are listed in docs/parameters.rst"
    _UNREPORTED.append(f"unknown parameter {key} is ignored; {hint}")


def take_unreported() -> list[str]:
    """The warnings about parameter dicts not written yet, removed from the queue (each is written once)."""
    taken = list(_UNREPORTED)
    del _UNREPORTED[: len(taken)]
    return taken


# -- the entry points' arguments --------------------------------------------------------------------------------


def require_model(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` looks like a Keras model (it has ``layers`` and ``built``).

    Args:
        value: What the caller passed as the model.
        where: The call and argument, e.g. ``"restart(gParameters, model): model"``.
    """
    if isinstance(value, Mapping):
        raise TypeError(
            f"{where} must be a Keras model; got a {type(value).__name__} (the parameter dict? "
            "it goes in the other argument: restart(gParameters, model), CandleCkptKeras(gParameters), "
            "ckpt.restart(model))"
        )
    if not (hasattr(value, "layers") and hasattr(value, "built")):
        raise TypeError(f"{where} must be a Keras model; got {type(value).__name__}")


def require_params(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` is a mapping (the ``gParameters`` dict)."""
    if isinstance(value, Mapping):
        return
    hint = " (a model? the parameter dict goes here, the model elsewhere)" if hasattr(value, "layers") else ""
    raise TypeError(f"{where} must be the parameter dict (a mapping); got {type(value).__name__}{hint}")
