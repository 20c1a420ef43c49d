"""One save's two inputs: what the adapter captured (:class:`Capture`) and the sidecar the engine starts from; and a
capture held for a save that may come (:class:`HeldStep`: the state before an epoch's last step, while ``fit``
validates).

An adapter's ``capture()`` returns a :class:`Capture` on the training thread;
the engine (:mod:`candle_ckpt.engine.engine`) makes the sidecar of it
(:func:`save_template`) and commits its files (on the writer's thread in async
mode). The store fills in the sidecar's files, the generation and the timings at
the commit; everything else is made here: the epoch, the best so far, the
metrics, the run's elapsed time (carried over a resume), the checkpoint it
resumed from, the snapshot's own ``extra``, the load and drain statistics, the
job's epoch limit and the lineage.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.policy import BestState
from candle_ckpt.core.sidecar import Sidecar, clean_logs
from candle_ckpt.storage.store import FileSpec

__all__ = ["HOLD_FROM_S", "Capture", "HeldStep", "epoch_limit", "new_lineage", "save_template"]


@dataclass
class Capture:
    """What an adapter captured on the training thread for one save."""

    files: list[FileSpec]
    model_file: str
    nbytes: int
    snapshot_s: float = 0.0
    keras_version: str | None = None
    backend: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # A multi-process save: parts(work_dir) writes this process's part; ``files`` are the primary's own.
    parts: Callable[[str], Any] | None = None
    sharding: dict[str, str] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)  # kept in a sharded checkpoint's manifest
    # Set when an asynchronous save could not copy the state (it would not fit in host memory): the files write
    # from the live variables, so the engine commits this one before training goes on, and says why, once.
    inline_why: str | None = None


def new_lineage() -> str:
    """A fresh lineage id (docs/campaigns.rst): a run that resumed none, or rolled back to an exact epoch."""
    return uuid.uuid4().hex[:16]


def epoch_limit(cfg: CkptConfig) -> dict[str, Any]:
    """The job's epoch limit (``gParameters["epochs"]``), kept so that ``candle-ckpt campaign`` tells a run
    that has reached it (done) from one still training, from its newest sidecar alone."""
    epochs = cfg.epochs
    return {"epochs": epochs} if isinstance(epochs, int) and not isinstance(epochs, bool) else {}


def save_template(
    cfg: CkptConfig,
    epoch: int,
    cap: Capture,
    logs: Mapping[str, Any],
    reason: str,
    best: BestState,
    *,
    mode: str,
    elapsed: float,
    resumed: Sidecar | None,
    io: dict[str, Any],
    lineage: str,
) -> Sidecar:
    """The sidecar of a save of ``epoch``, before the store fills in its files, generation and timings
    (``mode``: the best metric's direction; ``io``: the load and last drain records)."""
    return Sidecar(
        epoch=epoch,
        generation=0,
        model_file=cap.model_file,
        files={},
        save_best_metric=cfg.save_best_metric,
        best_metric_last=best.value,
        best_epoch=best.epoch,
        save_best_mode=mode,
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        time_elapsed=round(elapsed, 3),
        metadata=cfg.metadata,
        logs=clean_logs(logs),
        reason=reason,
        resumed_from=resumed.epoch if resumed else None,
        keras_version=cap.keras_version,
        backend=cap.backend,
        extra={**cap.extra, **({"io": io} if io else {}), **epoch_limit(cfg)},
        lineage=lineage,
    )


# A shorter window between the last step and the epoch's checkpoint is waited for: at most seconds, well within any
# scheduler's grace (Slurm's KillWait: 30 s), and no copy is paid for. A longer one is worth a copy per epoch.
HOLD_FROM_S = 5.0

# save_step(epoch, step, logs, capture, reason): the run's commit of a step checkpoint.
StepSaver = Callable[[int, int, Mapping[str, Any], Callable[..., Any], str], Any]


class HeldStep:
    """The state before an epoch's last step, held while ``fit`` validates: a stop request then costs a step, not the
    epoch.

    A request after an epoch's last training step is answered by the epoch's checkpoint, once ``fit``'s validation and
    every callback's ``on_epoch_end`` are done: a step checkpoint of the last step would resume into an epoch with no
    step left (Keras leaves its logs without the training metrics; JAX's ``fit`` raises). A validation longer than the
    scheduler's grace period (Slurm's ``KillWait``: 30 s) so lost the epoch's training to the kill that followed.

    So at the epoch's second-to-last call of the training step, the run takes that step checkpoint's files as an owned
    copy (a memory copy, as an asynchronous save takes) and holds it. A request seen at a batch of the validation is
    answered at once: the held files are committed as the step checkpoint of the step before the last, and the run
    stops. The rerun trains the last step again, validates, and ends bit-identical. The copy is dropped at the epoch's
    end.

    It is held when all of these hold: the epoch validates (:attr:`validates`, the front end's answer); one process
    (the processes of a group would have to agree at validation batches, which nothing makes them count alike: they
    answer at the epoch's end, as before); a run that watches for requests; an epoch of known steps; and this run's
    last window from a validating epoch's last step to its checkpoint (validation and the other callbacks'
    ``on_epoch_end``) took :data:`HOLD_FROM_S` or more, or none was measured yet (the run's first validating epoch).
    A window shorter than that is answered at its end, as before, at no cost.

    Args:
        on: Whether this run may hold one at all: its front end answers at validation batches
            (:meth:`~candle_ckpt.engine.run.TrainingRun.validation_batch_end`) and the job is one process.
    """

    def __init__(self, on: bool) -> None:
        self.on = on
        self._held: tuple[int, int, dict[str, Any], Any] | None = None  # epoch, step, logs, the capture
        self._prev = 0  # the step of the epoch's previous call (0: none yet), for steps_per_execution
        self._last_at: float | None = None  # when the epoch's last step ended
        self.window_s: float | None = None  # the last window from the last step to the epoch's checkpoint
        self.validates: Callable[[int], bool] | None = None  # which epochs (0-based) fit validates (None: none)

    @property
    def held(self) -> tuple[int, int] | None:
        """``(epoch, step)`` of the copy held now, or None."""
        return self._held[:2] if self._held is not None else None

    def after_step(
        self, epoch: int, step: int, of: int | None, logs: Mapping[str, Any], capture: Callable[..., Any], last: bool
    ) -> None:
        """After the call of the training step that ended at ``step`` (1-based) of ``of`` steps: hold the copy when
        the next call is the epoch's last; at the last, start timing the window."""
        per = step - self._prev if 0 < self._prev < step else 1
        self._prev = step
        if last:  # the window is timed in epochs that validate only: another's is no measure of a validation
            self._last_at, self._prev = time.monotonic() if self._validates(epoch) else None, 0
            return
        if not self.on or not isinstance(of, int) or step + per < of or not self._validates(epoch):
            return
        if self.window_s is not None and self.window_s < HOLD_FROM_S:
            return
        self._held = (epoch, step, dict(logs), capture(copy=True))

    def _validates(self, epoch: int) -> bool:
        return self.validates is not None and self.validates(epoch)

    def epoch_end(self) -> None:
        """The epoch's checkpoint is due: the copy is dropped and the window measured."""
        self._held, self._prev = None, 0
        if self._last_at is not None:
            self.window_s, self._last_at = time.monotonic() - self._last_at, None

    def drop(self) -> None:
        """The run ended: nothing is held past it."""
        self._held, self._prev, self._last_at = None, 0, None

    def answer(self, due: Callable[[int, int, Callable[[str], Any]], bool], save_step: StepSaver) -> bool:
        """At a batch of the validation: with a copy held, ``due(epoch, step, save)`` (the controller's) saves it
        and returns True when a request is due. True once training must stop; False with nothing held."""
        if self._held is None:
            return False
        epoch, step, logs, cap = self._held
        stop = due(epoch, step, lambda reason: save_step(epoch, step, logs, lambda copy=False: cap, reason))
        if stop:
            self._held = None
        return stop
