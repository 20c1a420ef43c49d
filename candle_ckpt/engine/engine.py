"""Turn "an epoch has ended" into policy, snapshot, commit and prune; and take a step checkpoint.

Shared by :class:`~candle_ckpt.keras.callback.CandleCheckpointCallback` and the
epoch runner, so both have the same guarantees. Knows nothing about Keras:
the caller passes a ``capture`` function that returns the files to write.

The engine makes the sidecar of each save (:meth:`CheckpointEngine.template`).
A commit that fails on the writer's thread is wrapped in a
:class:`~candle_ckpt.engine.writer.SaveFailure`, so the training thread learns which
epoch failed. A step (mid-epoch) checkpoint (:meth:`CheckpointEngine.save_step`) goes
to ``ckpts/steps/GGG`` after the write in flight (the order is kept): a preemption's
at once, a periodic one as an epoch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.group import SOLO, Group
from candle_ckpt.core.log import OpsLog, position
from candle_ckpt.core.policy import BestState
from candle_ckpt.core.retention import retention_policy
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.aftercommit import prune_after_commit, report_summary, save_record, saved_line, supersede_steps
from candle_ckpt.engine.capture import Capture, new_lineage, save_template
from candle_ckpt.engine.decision import Decision, DecisionContext, SaveDecisionPolicy, hang_timeout
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.on_error import failed_at_exit, save_failed, upload_failed
from candle_ckpt.engine.restart_history import current_start, record_failure
from candle_ckpt.engine.topology import MirroredWorkers, Topology, parts_of
from candle_ckpt.engine.watchdog import watched
from candle_ckpt.engine.writer import SaveFailure, inline_write_message, make_writer, slow_writer_message
from candle_ckpt.storage.store import CheckpointStore


class CheckpointEngine:
    """The save side of one job on one ``ckpt_directory``.

    Creating it validates the directory (writable, not locked by another
    process) and removes a crashed writer's leftovers, so problems surface
    at creation and not at epoch 50. Whether an epoch is saved is asked of
    its :class:`~candle_ckpt.engine.decision.SaveDecisionPolicy` (``policy``). How
    the job's processes write each checkpoint is its ``topology``
    (:mod:`candle_ckpt.engine.topology`): every process decides and snapshots in
    lockstep (same policy, same async order: wait, snapshot, submit); the topology
    says who commits, prunes and uploads, and what the others write.

    Args:
        cfg: The job's configuration, ``ckpt_async`` resolved by the front end that captures.
        log: The job's log.
        fs: The file-system seam of the store.
        topology: How the processes write each checkpoint (default: ``group``'s parts, one process for SOLO).
        group, scratch_dir: The shorthands of a topology: ``group`` alone, its processes each write their part
            (:func:`~candle_ckpt.engine.topology.parts_of`); a ``scratch_dir``, a non-chief worker of
            ``tf.distribute`` that writes its scratch copies there
            (:class:`~candle_ckpt.engine.topology.MirroredWorkers`).
    """

    def __init__(
        self,
        cfg: CkptConfig,
        log: OpsLog,
        *,
        fs=None,
        scratch_dir: str | None = None,
        group: Group = SOLO,
        topology: Topology | None = None,
    ) -> None:
        # ckpt_async=auto is decided by the front end that captures (CkptConfig.resolved): the capture's copy and
        # the writer must agree. An undecided None is falsy here and there alike: synchronous, uncopied.
        self.cfg = cfg
        if topology is None:
            topology = MirroredWorkers(group, scratch_dir) if scratch_dir is not None else parts_of(group)
        self.topology = topology
        self.policy = SaveDecisionPolicy(cfg)
        # Checkpointing off writes nothing at all: not even ckpt.log.
        self.log = log if not self.policy.off or topology.scratch_dir is not None else OpsLog(None, log.logger)
        self.store = CheckpointStore.of(cfg, fs=fs)
        self.open()
        self.retention = retention_policy(cfg.keep_mode, cfg.keep_limit)
        self.adopt_resumed(None)  # what a restart restored comes through adopt_resumed, never a process global
        self.writer = make_writer(cfg.async_save, cfg.async_timeout, log.write, self._exit_error)
        self.records: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.preempt: dict[str, Any] | None = None  # the preemption save of this run (stats()["preempt"])
        self._submitted: tuple[int, int, float] | None = None  # (epoch, bytes, perf_counter) of the last submit
        self._said: set[str] = set()  # what is said once per engine: "slow" (the writer), "inline" (no copy)
        self.start_time = time.time()
        # Called with each committed sidecar (writer's thread, after the prune): the drain to the persistent tier.
        self.after_commit: list[Callable[[Sidecar], None]] = []
        self.remote = None
        # The step interval of a multi-process job (engine.step_plan): the primary's word (note_out()) travels with
        # each commit's outcome; every rank hears it (_heard) and adopts it (agreed) at a point every rank passes
        # alike: after a save's wait for the write in flight, or after a synchronous commit.
        self.note_out: Callable[[float], str] | None = None  # given the cost of the commit in progress
        self._heard, self.agreed = "", ""
        self.step_interval: dict[str, Any] | None = None  # stats()["steps"], kept by the step plan
        self.drained: bool | None = None  # did the last finish() see every drain complete (None: no persistent tier)
        if topology.primary:
            self.own_drain()

    @property
    def group(self) -> Group:
        """Where the saves meet (the topology's group; a run puts its scope here while it lasts)."""
        return self.topology.group

    @group.setter
    def group(self, group: Group) -> None:
        self.topology.group = group

    @property
    def scratch_dir(self) -> str | None:
        """A non-chief worker's scratch directory (it never opens, commits to, prunes or uploads the store)."""
        return self.topology.scratch_dir

    def own_drain(self) -> Any:
        """This process's drain to the persistent tier, made the first time (None without a persistent tier):
        the primary's, made at once; a node-local rank's, for its own part, at its first commit there."""
        if self.remote is None and self.cfg.persistent:
            from candle_ckpt.storage.drain import Drain

            at_exit = self.writer.join_at_exit if self.writer.is_async else None  # the write in flight first
            self.remote = Drain(self.cfg, self.store, self.log, self.retention.select, group_timeout(), at_exit)
            self.after_commit.append(self.remote.committed)
        return self.remote

    def adopt_resumed(self, resumed: Sidecar | None, load: dict[str, Any] | None = None) -> None:
        """Continue from the checkpoint a restart loaded: best-tracking, elapsed
        time, load statistics, and protection of that checkpoint from pruning."""
        self.resumed = resumed
        self.load = load
        # The lineage of this run's checkpoints (docs/campaigns.rst): the resumed one's, unless this is a
        # rollback to an exact epoch; otherwise a new one, made at the first save.
        inherit = resumed is not None and resumed.lineage is not None and self.cfg.restart_epoch is None
        self.lineage = resumed.lineage if inherit else None
        if resumed is not None:  # it may have been pulled into this store after the store was opened
            self.store.continue_at(resumed.generation + 1)
        self.policy.resume(resumed)
        self.time_base = float(resumed.time_elapsed or 0.0) if resumed is not None else 0.0

    def save(
        self, epoch: int, logs: Mapping[str, Any], capture: Callable[[], Capture], *, reason: str | None = None
    ) -> bool:
        """Save ``epoch`` if the policy says so (``reason`` forces it, unless checkpointing is off).

        In async mode the order is: surface the previous write's error, wait
        for the write in flight (the wait is recorded in ``stats()``), take
        the snapshot with ``capture`` on this thread, hand the commit to the
        writer. Waiting *before* the snapshot keeps at most one snapshot alive.

        Returns True if a save was started. With ``ckpt_on_error=raise`` a
        failure (of this save, or of the previous async one) raises
        :class:`CheckpointSaveError`; with ``warn`` it is logged.
        """
        logs = dict(logs or {})
        self._check_writer()  # a finished async job's failure surfaces at the next epoch end
        self._check_remote()
        decision = self._ask(epoch, logs, reason)
        if decision.reason is None and not decision.ask_again:
            return False
        try:
            self._wait_for_writer(epoch)
        except TimeoutError as err:  # the previous write hangs: skip this save, memory stays bounded
            self._failed(epoch, err)
            return False
        self._adopt()
        if self._check_writer() or decision.ask_again:  # a failed write sets best tracking back: ask again
            decision = self._ask(epoch, logs, reason)
        if decision.reason is None:
            return False
        reason, best = decision.reason, decision.best
        try:
            cap = self.topology.capture(capture)
            template = self.template(epoch, cap, logs, reason, best)
            self.policy.submitted(best)
            self._submitted = (epoch, cap.nbytes, time.perf_counter())
            self._say_inline(epoch, cap)
            commit = lambda: self._commit(epoch, lambda: self._commit_now(epoch, cap, template, best))  # noqa: E731
            if self.writer.is_async and cap.inline_why is None:
                self.writer.submit(commit, label=f"the checkpoint write of epoch {epoch}")
            else:  # synchronous, or written from the variables (no copy): committed before training goes on
                commit()
                self._adopt()
        except SaveFailure as failure:
            self._failed(failure.epoch, failure.err)
            return False
        except Exception as err:
            self._failed(epoch, err)
            return False
        return True

    def _ask(self, epoch: int, logs: Mapping[str, Any], forced: str | None) -> Decision:
        """The policy's decision for ``epoch``, in the writer's present state."""
        context = DecisionContext(forced=forced, saving_in_progress=self.writer.in_flight())
        return self.policy.should_save(epoch, logs, context)

    def template(self, epoch: int, cap: Capture, logs: Mapping[str, Any], reason: str, best: BestState) -> Sidecar:
        """The sidecar of a save, before the store fills in its files, generation and timings."""
        if self.lineage is None:
            self.lineage = new_lineage()
        io = {"load": self.load} if self.load is not None else {}
        if self.remote is not None and self.remote.records:
            io["last_upload"] = self.remote.records[-1]
        elapsed = self.time_base + time.time() - self.start_time
        return save_template(
            self.cfg, epoch, cap, logs, reason, best,
            mode=self.policy.mode, elapsed=elapsed, resumed=self.resumed, io=io, lineage=self.lineage,
        )  # fmt: skip

    def save_step(
        self,
        epoch: int,
        step: int,
        logs: Mapping[str, Any],
        capture: Callable[..., Capture],
        reason: str,
        *,
        background: bool = False,
    ) -> Sidecar | None:
        """Commit the step checkpoint of ``step`` steps into the epoch after ``epoch`` (completed epochs).

        Args:
            epoch: Completed epochs (the sidecar's ``epoch``, as ``initial_epoch`` takes it).
            step: Training steps done in the current epoch (the sidecar's ``step``).
            logs: The latest batch logs (kept in the sidecar; best tracking is not touched).
            capture: Returns the :class:`~candle_ckpt.engine.capture.Capture` (called on this thread; with
                ``copy=True`` for a periodic one that may be written in the background).
            reason: Recorded in the sidecar: ``"SIGTERM"``, ``"deadline"``, ``"steps"``...
            background: A periodic one: with asynchronous writes in one process, committed on the writer's thread
                unless the capture could not copy (``inline_why``), as an epoch's is.

        Returns:
            The committed sidecar (on every process of a multi-process JAX job), or None when nothing was
            committed here and now: a non-chief worker (it writes its scratch copy only), a commit handed to the
            writer, or a failure under ``ckpt_on_error=warn`` (:meth:`~.topology.Topology.commit_step`).

        Raises:
            CheckpointSaveError: the save (or the previous async one) failed and ``ckpt_on_error=raise``.
        """
        self._check_writer()
        try:
            self.writer.wait()  # the write in flight commits first: generations stay in commit order
        except TimeoutError as err:
            self._failed(epoch, err)
            return None
        self._adopt()
        self._check_writer()
        what = {"epoch": epoch, "step": step, "reason": reason}
        background = background and self.writer.is_async and self.topology.background_steps
        try:
            cap = self.topology.capture((lambda: capture(copy=True)) if background else capture)
            template = replace(self.template(epoch, cap, logs, reason, self.policy.best), step=step)
            self._say_inline(epoch, cap)
            if background and cap.inline_why is None:
                job = lambda: self._commit(epoch, lambda: self._commit_step(what, cap, template))  # noqa: E731
                self.writer.submit(job, label=f"the step checkpoint at {position(epoch, step)}")
                self._submitted = None  # an epoch end that waits for a step's write is not told the writer is slow
                return None
            side = self._commit_step(what, cap, template)
            self._adopt()
        except Exception as err:
            self._failed(epoch, err)
            return None
        return side

    def _commit_step(self, what: dict[str, Any], cap: Capture, template: Sidecar) -> Sidecar | None:
        side, committer = self.topology.commit_step(self, what, cap, template)
        if committer:
            self.records.append(save_record(what, cap, side))
            if self.remote is not None:
                self.remote.step_committed(side)
            self.log.info(saved_line(what, side))
        return side

    def note(self, cap: Capture) -> tuple[Callable[[], str], Callable[[str], None]] | None:
        """The word this commit carries to every rank (the primary's, see ``note_out``: asked once the checkpoint is
        published, with what it cost so far) and where every rank hears it."""
        if self.note_out is None:
            return None
        began, out = time.perf_counter(), self.note_out

        def heard(word: str) -> None:
            self._heard = word

        return (lambda: out(cap.snapshot_s + time.perf_counter() - began), heard)

    def _adopt(self) -> None:
        """Every rank passes here alike (no write of its own in flight): the last commit's word is agreed now."""
        self.agreed = self._heard

    def _wait_for_writer(self, epoch: int) -> None:
        """Wait for the write in flight; the first time training has to wait for it, say so (once)."""
        busy, start = self.writer.in_flight(), time.perf_counter()
        self.writer.wait()
        if busy and "slow" not in self._said and self._submitted is not None:
            self._said.add("slow")
            self.log.warning(slow_writer_message(epoch, *self._submitted, start, time.perf_counter()))

    def _check_writer(self) -> bool:
        """Surface a finished async job's failure; True if one was reported (warn mode)."""
        try:
            self.writer.check()
        except SaveFailure as failure:
            self._failed(failure.epoch, failure.err)
            return True
        return False

    def _exit_error(self, err: BaseException) -> None:
        """The last async write failed and the process is exiting: log it, loudly."""
        epoch, cause = (err.epoch, err.err) if isinstance(err, SaveFailure) else (None, err)
        failed_at_exit(self.log, self.errors, epoch, cause)

    def _say_inline(self, epoch: int, cap: Capture) -> None:  # a copy that did not fit: written inline, said once
        if cap.inline_why and self.writer.is_async and "inline" not in self._said:
            self._said.add("inline")
            self.log.warning(inline_write_message(epoch, cap.inline_why))

    def _commit(self, epoch: int, commit: Callable[[], Any]) -> None:
        """Run ``commit`` (on the writer's thread, or inline), its failure marked with ``epoch``."""
        try:
            commit()
        except BaseException as err:
            raise SaveFailure(epoch, err) from err

    def _commit_now(self, epoch: int, cap: Capture, template: Sidecar, best: BestState) -> None:
        best_epoch = best.epoch if self.cfg.save_best else None
        side = self.topology.commit_epoch(self, epoch, cap, template, best_epoch)
        self.policy.committed(best)
        if side is None:  # this process's share (its part, its scratch copy) is written: nothing else is its
            return
        what = {"epoch": epoch, "reason": template.reason}
        self.records.append(save_record(what, cap, side))
        supersede_steps(self.store, self.log, epoch)
        self.log.info(saved_line(what, side))
        prune_after_commit(self.store, self.cfg, self.log, self.retention, [self.resumed.epoch] if self.resumed else [])
        for hook in self.after_commit:
            hook(side)

    def _check_remote(self) -> None:
        for err in self.remote.take_errors() if self.remote is not None else []:
            upload_failed(self.cfg.on_error, self.log, self.errors, err)

    def _failed(self, epoch: int, err: BaseException) -> None:
        self.policy.failed(epoch)  # that best was never written: track against the durable one
        save_failed(self.cfg.on_error, self.log, self.errors, epoch, err, self.store.layout.root)

    def finish(self, timeout: float | None = None, drain_s: float | None = None) -> None:
        """Wait for the write in flight, then for the drain (up to ``drain_s``, default the write's timeout);
        surface their errors per ``ckpt_on_error``. :attr:`drained` says whether the drain completed."""
        self.writer.join(timeout)
        self._check_writer()
        if self.remote is not None:
            wait = drain_s if drain_s is not None else self.cfg.async_timeout if timeout is None else timeout
            self.drained = self.remote.finish(wait)
            self._check_remote()

    def open(self) -> None:
        """Take the directory's writer lock again, e.g. for a second ``fit`` (no-op if held): the topology's primary
        only, and not with checkpointing off (``ckpt_save_interval=0``). Watched (phase ``open``): a mount that
        stopped answering ends the process with 124, as in a run."""
        if self.topology.primary and not self.policy.off:
            with watched(hang_timeout(self.cfg), self.store.layout.log, "open", record_failure):
                self.store.open_for_write()

    def close(self, timeout: float | None = None) -> None:
        """Release the writer lock once no write is in flight; never raises.

        A failed write was logged where it failed and is raised by
        :meth:`finish`; here it only must not keep the directory locked. A
        write still running after the timeout keeps the lock: a writer exists.
        """
        if not self.writer.join(timeout):
            self.log.warning(f"{self.store.layout.root}: the writer lock stays held while the write in flight runs")
            return
        if self.remote is not None:
            self.remote.finish(self.cfg.async_timeout if timeout is None else timeout)
        self.store.close()

    def stats(self) -> dict[str, Any]:
        """Every save (bytes, durations, MB/s), the load of a resume, every upload, errors."""
        return {
            "saves": list(self.records),
            "load": self.load,
            "uploads": list(self.remote.records) if self.remote is not None else [],
            "errors": list(self.errors),
            "writer_wait_s": list(self.writer.wait_s),
            "async": self.writer.is_async,
            "preempt": self.preempt,
            "steps": self.step_interval,
            "start": current_start(),  # this process's start: imports, restore (choose, verify, read), first step
        }

    def report(self) -> None:
        """Log a summary of this run's checkpoints (CANDLE's ``report_final``)."""
        self.finish()
        self.log.info(report_summary(self.records, self.policy.best, self.errors))
