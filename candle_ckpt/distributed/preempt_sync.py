"""Save every worker at the same step when any one is told to stop, then stop or exit.

:class:`PreemptSync` is called once after every training step on every worker
(``JobRunner.step_end``, the tf_keras callback's ``on_train_batch_end``):

1. the local flag: a signal this process caught (the handler only sets a flag)
   or, where the watcher knows a deadline, too little time left;
2. :class:`~candle_ckpt.distributed.agreement.SaveAgreement`: every
   ``ckpt_preempt_check`` steps, one all-reduce of the flags, so all workers
   learn "save now" at the same step;
3. every worker saves that step: the chief commits the mid-epoch checkpoint,
   every other worker writes its scratch copy (the engine's ``scratch_dir``,
   as for epoch checkpoints); the write is joined, so it is durable;
4. then training stops (``ckpt_preempt_exit_code`` None) or the process exits
   with that code, so a requeue script can tell "preempted" from "failed".

Takes an engine and a capture function; imports no adapter.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from candle_ckpt.core.log import OpsLog
from candle_ckpt.distributed.agreement import SaveAgreement


def _signal_numbers(names: Any) -> list[int]:
    if isinstance(names, str):
        names = [n for n in names.replace(",", " ").split() if n]
    found = []
    for name in names or ():
        found.append(int(name) if isinstance(name, int) else int(getattr(signal, str(name).upper())))
    return found


class LocalSignals:
    """This process's preemption flag: set by a signal handler that does nothing else.

    The stand-in for ``engine/preempt.py``'s ``PreemptionWatcher``: it offers
    what :class:`PreemptSync` needs (``arm``, ``disarm``, ``requested()``,
    ``signalled_at``). Handlers are installed only on the main thread and only
    over the default action, so a handler the user installed is kept.
    """

    def __init__(self, signals: Any = ("SIGTERM",)) -> None:
        self.signals = _signal_numbers(signals)
        self.signum: int | None = None
        self.signalled_at: float | None = None  # time.monotonic() of the first signal
        self._installed: dict[int, Any] = {}

    def arm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            if signum not in self._installed and signal.getsignal(signum) in (signal.SIG_DFL, None):
                self._installed[signum] = signal.signal(signum, self._handle)

    def disarm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._installed.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
        self._installed = {}

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum, self.signalled_at = signum, time.monotonic()


def _plain(logs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Batch logs as numbers (tf_keras may hand over tensors: converted only when a save needs them)."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class PreemptSync:
    """Per step: the local flag, the agreement, and the save of the agreed step on every worker.

    Args:
        engine: The job's (or this worker's) ``CheckpointEngine``.
        capture: Returns the :class:`~candle_ckpt.engine.engine.Capture` of the
            state as of now (called on the training thread, at the agreed step).
        agreement: Shared decision across workers.
        watcher: The local flag (``requested()``, ``signalled_at``, ``arm``, ``disarm``).
        ops: Where the save is logged.
        exit_code: None: stop training after the save; an int: exit with it.
        who: How this worker is named in the log (``"worker 1 "``).
    """

    def __init__(
        self,
        engine: Any,
        capture: Callable[[], Any],
        agreement: SaveAgreement,
        watcher: Any,
        ops: OpsLog,
        *,
        exit_code: int | None = None,
        who: str = "",
    ) -> None:
        self.engine, self.capture, self.agreement = engine, capture, agreement
        self.watcher, self.ops = watcher, ops
        self.exit_code = exit_code
        self.who = who
        self.saved_at: tuple[int, int] | None = None  # (epoch, step) of the preemption save
        self.record: dict[str, Any] | None = None

    @property
    def stopped(self) -> bool:
        return self.saved_at is not None

    def step_end(self, epoch: int, step: int, logs: Mapping[str, Any] | None = None) -> bool:
        """One step has ended (``step`` steps done in epoch ``epoch``): True once training must stop.

        Call it on every worker after every step. When the workers agree, the
        step is saved on every worker before this returns; with an exit code
        the process exits here instead (``SystemExit``, after the commit).
        """
        if self.saved_at is not None:
            return True
        if not self.agreement.step_end(self.watcher.requested()):
            return False
        self.saved_at = (epoch, step)
        self._save(epoch, step, _plain(logs))
        if self.exit_code is not None:
            raise SystemExit(self.exit_code)
        return True

    def epoch_end(self, epoch: int, save: Callable[[], Any]) -> bool:
        """After the checkpoint of ``epoch`` completed epochs: True once training must stop.

        For a loop that never calls :meth:`step_end`: a signal is then acted
        on at the epoch end (all workers agree at once). ``save`` saves this
        epoch whatever the policy (it is called only if the workers agree).
        """
        if self.saved_at is not None:
            return True
        if not self.agreement.now(self.watcher.requested()):
            return False
        self.saved_at = (epoch, 0)
        self._save(epoch, 0, {}, save)
        if self.exit_code is not None:
            raise SystemExit(self.exit_code)
        return True

    def _save(self, epoch: int, step: int, logs: dict[str, Any], save: Callable[[], Any] | None = None) -> None:
        start = time.monotonic()
        if save is None:
            commit_step(self.engine, epoch, step, logs, self.capture)
        else:
            save()
        self.engine.finish()  # durable (or its error raised per ckpt_on_error) before we stop
        now = time.monotonic()
        signalled = self.watcher.signalled_at
        self.record = {
            "epoch": epoch,
            "step": step,
            "signal_here": signalled is not None,
            "signal_to_commit_s": round(now - signalled, 6) if signalled is not None else None,
            "save_s": round(now - start, 6),
            "agreement": self.agreement.stats(),
        }
        source = "a signal to this worker" if signalled is not None else "another worker's signal"
        what = f"step {step} of epoch {epoch}" if save is None else f"epoch {epoch}"
        self.ops.info(
            f"preemption: {self.who}saved {what} (after {source}) in {now - start:.3f} s"
            + (f"; {now - signalled:.3f} s after the signal" if signalled is not None else "")
            + (f"; exiting with {self.exit_code}" if self.exit_code is not None else "; stopping training")
        )

    def close(self) -> None:
        self.watcher.disarm()


def commit_step(engine: Any, epoch: int, step: int, logs: dict[str, Any], capture: Callable[[], Any]) -> bool:
    """Save the mid-epoch checkpoint of ``step`` steps into epoch ``epoch`` through ``engine``.

    The chief's engine commits it (``ckpts/steps/``); a non-chief's engine
    (``scratch_dir``) writes its scratch copy. The one place that calls the
    engine's step save.
    """
    from candle_ckpt.distributed.step_fallback import save_step

    return save_step(engine, epoch, step, logs, capture)  # at merge: engine.save_step (issue 16)


def _setting(cfg: Any, params: Mapping[str, Any], field: str, default: Any) -> Any:
    # Until issue 16's parameters are in CkptConfig, read them from the raw parameters.
    if hasattr(cfg, field):
        return getattr(cfg, field)
    value = params.get(f"ckpt_{field}")
    return default if value is None else value


def make_sync(
    cfg: Any,
    engine: Any,
    capture: Callable[[], Any],
    strategy: Any,
    info: Any,
    ops: OpsLog,
    params: Mapping[str, Any] | None = None,
) -> PreemptSync:
    """A :class:`PreemptSync` from the job's configuration and this worker's place in the cluster."""
    params = params or {}
    agreement = SaveAgreement(strategy, info.num_workers, every=cfg.preempt_check)
    watcher = LocalSignals(_setting(cfg, params, "preempt_signals", ("SIGTERM",)))
    exit_code = _setting(cfg, params, "preempt_exit_code", None)
    who = f"worker {info.task_type}:{info.task_id} " if info.num_workers > 1 else ""
    return PreemptSync(
        engine, capture, agreement, watcher, ops, exit_code=None if exit_code is None else int(exit_code), who=who
    )
