"""One training run's lifecycle, owned in one place for every front end.

A *run* is one ``fit`` (the Keras 3 callback, the tf_keras callback) or one ``train()`` (``JobRunner``). Its front
end knows the framework: how to capture a model, where its callback list and input are, what a step and an epoch end
are. :class:`TrainingRun` knows everything else, the same way for all three:

- **the writer lock**: taken at :meth:`TrainingRun.begin`, released at :meth:`TrainingRun.end` once the last
  write has landed, or by the fit guard when ``fit`` raised (:mod:`candle_ckpt.engine.fit_port`);
- **the group of the run**: a fresh scope of the job's :class:`~candle_ckpt.core.group.Group` per run (its
  meetings and keys, deleted by the last meeting at the end), which the saves and the preemption agreement meet in;
- **the one preemption controller**, built from that group
  (:class:`~candle_ckpt.engine.preempt_control.PreemptionController` with a
  :class:`~candle_ckpt.engine.notice.NoticeAgreement`), asked after every step and epoch end (alone, without a
  deadline: an epoch end only once a request is pending);
- **every signal handler and the hang watchdog**, through the process's one owner
  (:class:`~candle_ckpt.engine.signals.SignalOwner`): held from ``restart()``
  (:func:`~candle_ckpt.engine.signals.hold_signals`), the
  run's lease from ``begin`` to the end (the watcher's signals, SIGTERM as ``SystemExit`` with asynchronous
  writes, the :class:`~candle_ckpt.engine.watchdog.Watchdog` told of every step, save and meeting: exit 124
  on a hang), every handler back in one teardown;
- **the end of a preemption save**: the controller saves and tells the run, which makes the write durable,
  records it and exits (:func:`~candle_ckpt.engine.preempt.finish_preempted`);
- **the Ctrl-C line** at exit (:class:`~candle_ckpt.engine.interrupt.InterruptNotice`);
- **resume adoption and the parked state**: what the restore driver (:func:`~candle_ckpt.engine.restore.restore`)
  resumed is adopted here and only here (:func:`adopt`), once, and the state it could not apply yet (the
  optimizer's, the training state) is handed out once;
- **the first step's time**: the first step of the process (or the first epoch end of a loop that reports no step)
  completes the start's breakdown (:func:`~candle_ckpt.engine.restart_history.first_step`).

Fit's plumbing (epoch order, finished-run rule, first epoch) goes through the framework's port, once for every front
end (:mod:`candle_ckpt.engine.fit_port`). The front ends call, in this order: :meth:`~TrainingRun.begin`, then per step
:meth:`~TrainingRun.step_end` (per validation batch :meth:`~TrainingRun.validation_batch_end`) and per epoch
:meth:`~TrainingRun.epoch_end`, then :meth:`~TrainingRun.end` (``ok=False`` when the loop raised and the front end
sees it, as ``JobRunner`` does). A :class:`~candle_ckpt.engine.preempt.PreemptExit` or an error in a save ends the
run on the spot, before it propagates.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.group import SOLO, Group, scoped
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine import restart_history
from candle_ckpt.engine.capture import Capture, HeldStep
from candle_ckpt.engine.decision import checkpointing_off, hang_timeout
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.fit_port import FitGuard, FitPlumbing, FitPort
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.interrupt import InterruptNotice
from candle_ckpt.engine.notice import NoticeAgreement
from candle_ckpt.engine.pending import ParkedOptimizer
from candle_ckpt.engine.preempt import PreemptExit, Saved, finish_preempted
from candle_ckpt.engine.preempt_control import PreemptionController
from candle_ckpt.engine.resume import Resumed, checkpoint_dir, resumed_of
from candle_ckpt.engine.signals import Lease, SignalOwner, process_signals
from candle_ckpt.engine.step_plan import StepPlan
from candle_ckpt.engine.watchdog import Watchdog, WatchedGroup

Capturer = Callable[..., Capture]  # a step checkpoint's is called with copy= (CheckpointEngine.save_step)


def adopt(engine: CheckpointEngine, resumed: Resumed) -> None:
    """The one adoption of a resumed checkpoint: the engine continues from it (best tracking, lineage, elapsed
    time, no prune of it). :class:`TrainingRun` calls it once per resume; ``WorkerTrainingState``, Keras 2's
    run-less API, when its own ``restore()`` loads one."""
    engine.adopt_resumed(resumed.sidecar, resumed.load)


class TrainingRun:
    """The lifecycle of one training run (one ``fit`` or ``train()``), the same for every front end.

    Args:
        cfg: The job's configuration, ``ckpt_async`` resolved (:meth:`CkptConfig.resolved`).
        engine: The run's :class:`~candle_ckpt.engine.engine.CheckpointEngine`; made, and closed (the lock
            let go), by the front end before the first run.
        log: The job's log.
        group: The job's processes (SOLO: one). Each run meets in a fresh scope of it.
        scope: The scope's name (``"fit"``), or None when ``group`` is the run's own scope already.
        who: How this process is named in the preemption line of a job of several (``"worker worker:1"``);
            None: ``"process R"``, its rank in ``group``.
        step_saves: Whether this loop takes ``ckpt_save_steps``'s periodic step checkpoints.
        port: The framework's :class:`~candle_ckpt.engine.fit_port.FitPort` (a ``fit``'s callback list, epoch
            hooks, first epoch, who stopped it; and the fit guard); None: no guard, the front end calls
            :meth:`end` from its own ``finally``.
        on_release: The front end's own release (its hooks, stdout), run with the lock's.
        where: The front end's probe for the watchdog: ``"input"`` while the training thread waits in its
            framework's input pipeline, else None.
        signals: The signal owner (this process's, :func:`~candle_ckpt.engine.signals.process_signals`).
    """

    def __init__(
        self,
        cfg: CkptConfig,
        engine: CheckpointEngine,
        log: OpsLog,
        *,
        group: Group = SOLO,
        scope: str | None = "fit",
        who: str | None = None,
        step_saves: bool = False,
        port: FitPort | None = None,
        on_release: Callable[[], None] | None = None,
        where: Callable[[], str | None] | None = None,
        signals: SignalOwner | None = None,
    ) -> None:
        self.cfg, self.engine, self.log = cfg, engine, log
        self.group, self._scope = group, scope
        self.fit_group: Group = SOLO  # this run's scope of the group, between begin() and the end
        self._meets = engine.topology.meets  # the engine's saves meet in the run's scope (JAX's part-per-process)
        name = who if who is not None else f"process {group.rank}"
        steps = StepPlan(cfg, engine, step_saves and not checkpointing_off(cfg))
        who = f"{name} " if group.size > 1 else ""
        self.controller = PreemptionController(
            cfg, log, who=who, steps=steps, save_cost=self._longest_save, on_saved=self._saved
        )
        self.held = HeldStep(False)  # the state before an epoch's last step, while fit validates (if turned on)
        self.signals = signals if signals is not None else process_signals()
        self._lease: Lease | None = None  # what the signal owner holds for this run, between begin and the end
        self._guard = FitGuard(self._release) if port is not None else None
        self.fit = FitPlumbing(port, log)  # fit's epoch order, the finished rule, the first epoch (engine/fit_port)
        self._interrupt = InterruptNotice(log, engine.store, self._settle)
        self._on_release = on_release
        self.resumed: Resumed | None = None  # what restart() restored, once adopted
        self.watchdog = Watchdog(
            hang_timeout(cfg), Layout.of(cfg).log, restart_history.record_failure,
            who=f"{name} of {group.size}" if group.size > 1 else "", where=where, saves=self._longest_save,
        )  # fmt: skip
        self._logs_start = engine.topology.primary  # this process logs the start's line

    # -- what the front ends read --------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether anything happens per step (preemption or hangs watched, or periodic step checkpoints)."""
        return self.controller.enabled or self.watchdog.on

    @property
    def stopped(self) -> bool:
        """True once a preemption save stopped this run."""
        return self.controller.saved_at is not None

    @property
    def saved_at(self) -> tuple[int, int] | None:
        """``(epoch, steps done)`` of this run's preemption save, else None."""
        return self.controller.saved_at

    # -- resume --------------------------------------------------------------------------------------------
    def adopt(self, model: Any) -> Resumed | None:
        """What ``restart()`` attached to ``model`` for this directory, adopted (:meth:`adopt_resumed`); returned."""
        return self.adopt_resumed(resumed_of(model, self.cfg.directory))

    def adopt_resumed(self, resumed: Resumed | None) -> Resumed | None:
        """Adopt ``resumed`` (None: nothing new) once: a second call with the same one changes nothing."""
        if resumed is not None and resumed is not self.resumed:
            self.resumed = resumed
            adopt(self.engine, resumed)
        return self.resumed

    @property
    def where(self) -> str:
        """The resumed checkpoint's directory, or "" before any resume."""
        return checkpoint_dir(self.engine.store.layout, self.resumed.sidecar) if self.resumed is not None else ""

    def take_parked(self, apply_optimizer: Callable[[ParkedOptimizer, str], None]) -> bytes | None:
        """Hand out what the restore parked, once: the optimizer's state is applied now through
        ``apply_optimizer(parked, where)`` (``restart()`` ran before ``compile()``; the optimizer exists now),
        and the training state is returned, for the front end to put back before the first epoch."""
        if self.resumed is None:
            return None
        pending = self.resumed.pending
        parked = pending.take_optimizer()
        if parked is not None:
            apply_optimizer(parked, self.where)
            self.log.info(f"restart: applied the optimizer state of {self.where} ({len(parked.values)} variables)")
        return pending.take_train_state()

    def finished(self, ended: tuple[str, int] | None, epochs: Any, **how: Any) -> bool:
        """Whether this run reruns a finished one (:mod:`candle_ckpt.engine.finished`'s rule, for every front end):
        said in one line; a ``fit`` (``model=``) then runs no epoch, else it trains
        (:meth:`~candle_ckpt.engine.fit_port.FitPlumbing.trains`). ``ended``, ``epochs`` and ``how`` (``model``,
        ``call``, ``limit``): as :meth:`~candle_ckpt.engine.fit_port.FitPlumbing.stop_if_finished`."""
        done = self.fit.stop_if_finished(
            self.resumed, self.where, ended=ended, epochs=epochs, restart_epoch=self.cfg.restart_epoch, **how
        )
        if not done and how.get("model") is not None:
            self.fit.trains(how["model"], self.resumed, self.cfg.directory, self.where)
        return done

    # -- the run -------------------------------------------------------------------------------------------
    def begin(self, callback: Any = None, *, model: Any = None, resumed: Resumed | None = None) -> Any:
        """The run starts: the fit guard (``callback``: the callback whose hook calls us now, found in its
        ``fit`` by the port), the writer lock, the run's scope of the group, then every signal handler and the
        watchdog (the signal owner's lease); last, what ``restart()`` attached to ``model`` (or ``resumed``) is
        adopted. Returns the fit's ``CallbackList`` (None: not found, or no ``fit``), for the front end to use in
        this hook only: its death ends the guarded fit."""
        found = self.fit.find(callback)
        if self._guard is not None and callback is not None:
            self._guard.arm(found)  # first: an earlier fit's release (if under way) ends here
        restart_history.run_began()  # with no restart() before it, this process's start is timed from here
        self.engine.open()
        if self.group.size > 1:
            self.fit_group = scoped(self.group, self._scope) if self._scope else self.group
            self.watchdog.among(self.fit_group)  # a hang is said to the others (engine/hang_notice.py)
            if self.watchdog.on:  # the training thread's meetings are the watchdog's phase "meeting"
                self.fit_group = WatchedGroup(self.fit_group, self.watchdog)
            if self._meets:
                self.engine.group = self.fit_group
        agreement = None
        if self.fit_group.size > 1 and self.controller.enabled:  # nothing is said on a step unless one asks to stop
            agreement = NoticeAgreement(self.fit_group, timeout_s=group_timeout())
        self.controller.arm(agreement)  # first: a signal held since restart() is told to the agreement at once
        # SIGTERM has one owner: the watcher when it is a preemption signal; else, with asynchronous writes, it
        # becomes SystemExit (the exit hook commits the write in flight). The watchdog is armed last.
        writer = self.engine.writer
        on_exit = (lambda signum: setattr(writer, "exit_signal", signum)) if writer.is_async else None
        watcher = self.controller.watcher
        self._lease = self.signals.watch(watcher.signals, watcher.notice, on_exit=on_exit, watchdog=self.watchdog)
        self.controller.watched(self._lease)
        self._interrupt.arm()  # Ctrl-C: the KeyboardInterrupt is the user's; at exit, ckpt.log says what is committed
        self.adopt_resumed(resumed if model is None else resumed_of(model, self.cfg.directory))
        return found.callback_list if found is not None else None

    def step_end(
        self, epoch: int, step: int, logs: Mapping[str, Any], capture: Capturer, *, last: bool = False, of=None
    ) -> bool:
        """After step ``step`` (1-based) of epoch index ``epoch`` (``of`` steps, None: unknown): True once training must
        stop. ``capture`` takes the step checkpoint's files (called only when one is saved); ``last``: the epoch's last
        step (a request there is answered by the epoch's checkpoint, or in its validation: engine/capture.py HeldStep).

        Raises:
            PreemptExit: the preemption checkpoint is committed and the process exits (the run has ended).
        """
        self.watchdog.last = time.monotonic()  # progress: the watchdog's one cost per step
        restart_history.first_step(self.log, self._logs_start)
        with self._ended_by_errors():
            save = partial(self._save_step, epoch, step, logs, capture)
            stop = self.controller.step_end(epoch, step, save, last=last, of=of)
            if not stop and self.controller.watching:
                self.held.after_step(epoch, step, of, logs, capture, last)
            return stop

    def validation_batch_end(self) -> bool:
        """After a batch of ``fit``'s validation: progress, and a stop request answered by the state held before
        the epoch's last step (:class:`~candle_ckpt.engine.capture.HeldStep`); True once training must stop."""
        self.watchdog.beat()
        with self._ended_by_errors():
            return self.held.answer(self.controller.during_validation, self._save_step)

    def _save_step(self, epoch: int, step: int, logs, capture: Capturer, reason: str, background=False) -> Any:
        """Commit the step checkpoint of ``step`` (``capture``'s files; ``background``: a periodic one)."""
        with self.watchdog.phase_of("save"):
            side = self.engine.save_step(epoch, step, logs, capture, reason, background=background)
        if self.engine.records:
            restart_history.committed()  # this start made progress (once: a progress record)
        return side

    def epoch_end(self, done: int, logs: Mapping[str, Any], capture: Capturer, *, last_epoch: bool) -> bool:
        """After ``done`` completed epochs: save it if the policy says so, then True once training must stop.

        ``last_epoch``: the job is done (a stop request is then only logged).

        Raises:
            PreemptExit: as :meth:`step_end`.
            CheckpointSaveError: the save failed with ``ckpt_on_error=raise`` (the run has ended).
        """
        self.held.epoch_end()
        if self.controller.saved_at is not None:
            return True  # a step checkpoint stopped this run in the middle of the epoch: this is no epoch's end
        restart_history.first_step(self.log, self._logs_start)  # a loop that reports no step: its first epoch
        with self._ended_by_errors():
            with self.watchdog.phase_of("save"):
                saved = self.engine.save(done, logs, capture)
            if self.engine.records:
                restart_history.committed()  # this start made progress (once: a progress record)

            def force(reason: str) -> bool:
                with self.watchdog.phase_of("save"):
                    return self.engine.save(done, logs, capture, reason=reason)

            if self.controller.watcher.pending is None and not self.controller.asks_each_epoch:
                return False  # one process, no deadline, no request: the controller has nothing to ask
            return self.controller.epoch_end(done, saved, force, last_epoch=last_epoch)

    def end(self, ok: bool = True) -> None:
        """The run ended: the last write lands (its error raised when ``ok``, else only logged: the loop's own
        error is the one to see), the handlers come back, the group meets a last time, the lock is let go.

        ``ok=False``: the loop raised (``JobRunner``'s ``finally``). Safe to call after the run ended already.
        """
        if self._guard is not None:
            self._guard.disarm()
        ended = False
        try:
            if ok:
                with self.watchdog.phase_of("save"):
                    self.engine.finish()  # joins the writer; raises its error with ckpt_on_error=raise
            else:
                try:
                    with self.watchdog.phase_of("save"):
                        self.engine.finish()
                except Exception as err:
                    self.log.warning(f"while stopping after an error: {err}")
            ended = ok or self.stopped  # every rank ended alike (or all were preempted at one step): they meet again
        finally:
            self._end_signals(watchdog=False)  # the watchdog still watches the last meetings: stopped at release
            if ok:
                self._interrupt.fit_returned()
            self.controller.close(ended=ended)
            if ended:
                self._close_group()
            self._release()

    def close(self) -> None:
        """Let go of the writer lock now (it is let go at the end of every run anyway)."""
        if self._guard is not None:
            self._guard.disarm()
        self._release()

    # -- how a run ends otherwise ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _ended_by_errors(self) -> Iterator[None]:
        """A PreemptExit (the checkpoint committed, the process exits), any error in a step or an epoch end (a failed
        save) or a Ctrl-C that Python dropped (raised first) ends the run there, before it propagates."""
        try:
            if self._interrupt.dropped is not None:  # a Ctrl-C Python dropped in a finalizer: raised here, now
                self._interrupt.raise_dropped()
            yield
        except PreemptExit:
            self._exit()
            raise
        except BaseException:
            self._failed()
            raise

    def _exit(self) -> None:
        """A preemption checkpoint is committed and the process exits: give the signals and the lock back."""
        self._end_signals()
        self.controller.close()
        self._close_group()
        self.close()

    def _failed(self) -> None:
        """A save failed (``ckpt_on_error=raise``) and the loop stops without its end: the signals come back now;
        the lock too, unless a write is in flight (the fit guard then waits for it, on its own thread: this one
        must unwind, so that a SIGTERM's exit hook can commit that write)."""
        self._end_signals()
        self.controller.close(ended=False)
        if not self.engine.writer.in_flight():
            self.close()

    def _close_group(self) -> None:
        """The run ended alike on every process: the last meeting deletes every key of its scope."""
        group, self.fit_group = self.fit_group, SOLO
        if self._meets:
            self.engine.group = self.group
        group.close(group_timeout())

    def _end_signals(self, watchdog: bool = True) -> None:
        """Every handler back and (with ``watchdog``) the watchdog stopped, in one teardown (the run's lease)."""
        if self._lease is not None:
            self.signals.end(self._lease, watchdog=watchdog)

    def _saved(self, saved: Saved) -> None:
        """The controller saved the preemption checkpoint: durable (drained within its budget), recorded in
        ``stats()["preempt"]`` and said; then the process exits (:class:`PreemptExit`) unless told to return."""
        with self.watchdog.phase_of("save"):
            drain_s = self.controller.drain_budget()
            finish_preempted(saved, self.engine, self.cfg.preempt_exit_code, self.log, self.controller.who, drain_s)

    def _longest_save(self) -> float:
        """The longest of the engine's last saves (snapshot and write), in seconds: auto's measure of a save."""
        return max((r["snapshot_s"] + r["save_s"] for r in self.engine.records[-3:]), default=0.0)

    def _settle(self) -> None:
        """Before the Ctrl-C line: the write in flight ends as the writer's own exit hook ends it (its 'exit:
        waiting up to' line, the bounded join, its error handled), so that the line names what is committed."""
        writer = self.engine.writer
        if hasattr(writer, "join_at_exit"):
            writer.join_at_exit()
        else:
            writer.join(self.cfg.async_timeout)

    def _release(self) -> None:
        """Let go of what the run held: the signals and the watchdog (from any thread: the main thread puts the
        handlers back), the front end's hooks, and the writer lock (after the last write)."""
        if self._lease is not None:
            self.signals.release(self._lease)  # the watchdog stops; the main thread puts the handlers back
        self.held.drop()
        self._interrupt.unhook()
        self.fit.release()  # the fit's epoch hooks and first epoch are its own again
        if self._on_release is not None:
            self._on_release()
        self.engine.close()
