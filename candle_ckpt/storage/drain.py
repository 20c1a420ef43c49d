"""The drain: copies committed checkpoints from the fast tier to the persistent tier, in the background.

Driven by the engine (:class:`~candle_ckpt.engine.engine.CheckpointEngine`):
:meth:`Drain.committed` after every epoch commit and :meth:`Drain.step_committed`
after every step commit (a preemption save), both on the writer's thread;
:meth:`Drain.finish` at the end of training and before a preempted process
exits. See docs/campaigns.rst.

* Staging: the checkpoint's files are hard-linked into ``ckpts/.tmp-upload-*``
  (instant; safe against the local prune that may delete the checkpoint before
  it is drained; committed files are never modified in place). One thread
  drains the staged checkpoints in order, so training never waits for it.
* Policy (``ckpt_drain``): ``every`` commit; every ``ckpt_drain_interval``-th
  epoch commit (``interval``); only a preemption save (``preempt``); with all
  three the newest commit is drained at :meth:`Drain.finish` (the end of
  training or a preemption) if it was not yet. ``end``: nothing during
  training, ``best`` and ``last`` at the end.
* Lineage: every checkpoint carries its lineage id. The drain refuses to
  write into a persistent tier whose checkpoints belong to another lineage
  (another run, or the run before a rollback), and never replaces a persistent
  checkpoint by one of a lower generation. Refusals are errors handled by
  ``ckpt_on_error``; the persistent tier is left as it was.
* The persistent tier keeps what the local retention policy keeps (applied to
  its epochs, ``best``/``last``/the new one protected); a step checkpoint is
  removed there once a newer checkpoint is drained.
* A multi-process job whose ``ckpt_directory`` is each node's own disk: every
  rank drains its own part (one archive); the primary writes the manifest and
  the sidecar only once every rank's archive is there, waiting up to
  ``parts_wait_s``; otherwise the checkpoint is not published (an error, as
  any drain failure). Only the primary checks the lineage and prunes.
* Failures are collected and handed to the engine, which applies
  ``ckpt_on_error`` on the training thread. Each drain's bytes, duration,
  lag behind the commit and MB/s go to ``ckpt.log`` and :attr:`Drain.records`.
"""

from __future__ import annotations

import atexit
import functools
import os
import queue
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, LineageConflict
from candle_ckpt.core.group import is_primary_rank
from candle_ckpt.core.layout import EPOCHS, STEPS
from candle_ckpt.core.log import OpsLog, human_bytes, transfer_record
from candle_ckpt.core.retention import prune_plan
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.multipart import NODE_LOCAL
from candle_ckpt.storage.remote import PersistentTier, describe
from candle_ckpt.storage.store import CheckpointStore

#: The exit status of a preempted process whose last save did not reach the persistent tier in time
#: (EX_TEMPFAIL: the checkpoint is only on this node's fast tier).
DRAIN_INCOMPLETE_EXIT = 75


def _kind(side: Sidecar) -> str:
    return EPOCHS if side.step is None else STEPS


def _number(side: Sidecar) -> int:
    return side.epoch if side.step is None else side.generation


class Drain:
    """Drains committed checkpoints of ``store`` to the persistent tier on one background thread.

    Args:
        cfg: The job's configuration (persistent URL, options, ``ckpt_drain*``).
        store: The fast tier.
        log: ``ckpt.log``.
        select: The retention policy's ``select(epochs, protected)``, applied to the persistent epochs.
        parts_wait_s: A node-local job's primary: how long it waits for the other ranks' parts.
        before_exit: Run at interpreter exit before :meth:`at_exit` (the asynchronous writer's join).
    """

    def __init__(
        self,
        cfg: CkptConfig,
        store: CheckpointStore,
        log: OpsLog,
        select: Callable[[list[int], set[int]], set[int]],
        parts_wait_s: float = 300.0,
        before_exit: Callable[[], None] | None = None,
    ) -> None:
        self.cfg, self.store, self.log, self.select = cfg, store, log, select
        # At interpreter exit, after before_exit (the async writer's commit in flight): at_exit (hook registered
        # after the writer's, so run before it).
        self.before_exit = before_exit
        atexit.register(functools.partial(_at_exit, weakref.ref(self)))
        self.parts_wait_s = parts_wait_s
        self.tier = PersistentTier.of(cfg)
        self.policy = cfg.drain_policy
        self.records: list[dict[str, Any]] = []
        self._queue: queue.Queue = queue.Queue()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._epoch_commits = 0
        self._latest: Sidecar | None = None  # the newest commit of this run (epoch or step)
        self._queued: set[tuple[str, int, int]] = set()  # (kind, number, generation) staged or drained
        self._committed_at: dict[int, float] = {}  # generation -> when the fast tier committed it
        # What the persistent tier holds, learnt by one listing at the first drain, then kept up to date.
        self._known: dict[tuple[str, int], Sidecar] | None = None
        self._refused: str | None = None
        self._said: int | None = None  # the generation whose completion was last logged
        self._finished: int | None = None  # the newest generation a finish() was given (at_exit leaves it be)

    # -- called on the writer's thread -------------------------------------------
    def committed(self, side: Sidecar) -> None:
        """After an epoch commit: note it; drain it if the policy says so."""
        self._note(side)
        self._epoch_commits += 1
        if self.policy == "every" or (self.policy == "interval" and self._epoch_commits % self.cfg.drain_interval == 0):
            self._enqueue(side)

    def step_committed(self, side: Sidecar) -> None:
        """After a step commit (``ckpt_save_steps`` or a preemption save): note it; ``every`` drains it now."""
        self._note(side)
        if self.policy == "every":
            self._enqueue(side)

    def _note(self, side: Sidecar) -> None:
        self._latest = side
        self._committed_at[side.generation] = time.time()

    def _enqueue(self, side: Sidecar) -> None:
        ident = (_kind(side), _number(side), side.generation)
        if ident in self._queued:
            return
        start = time.perf_counter()
        try:
            stage = self._stage(side)
        except Exception as err:  # reported through ckpt_on_error, never breaks the commit
            self._record_error(RuntimeError(f"{describe(side)}: cannot stage for the drain: {err}"))
            return
        self._queued.add(ident)
        self._queue.put((side, stage, time.perf_counter() - start))
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="candle_ckpt-drain", daemon=True)
                self._thread.start()

    def _stage(self, side: Sidecar) -> str:
        lay = self.store.layout
        src = lay.epoch_dir(side.epoch) if side.step is None else lay.step_dir(side.generation)
        name = f".tmp-upload-{_kind(side)}-{L.epoch_name(_number(side))}-{uuid.uuid4().hex[:8]}"
        stage = os.path.join(lay.ckpts, name)
        os.makedirs(stage)
        for name in os.listdir(src):
            try:
                os.link(os.path.join(src, name), os.path.join(stage, name))
            except OSError:  # no hard links here: copy instead
                shutil.copy2(os.path.join(src, name), os.path.join(stage, name))
        return stage

    # -- the drain thread -----------------------------------------------------------
    def _run(self) -> None:
        while True:
            # One daemon thread for the life of the drain: an idle wait costs nothing, and a
            # checkpoint cut off by interpreter exit is never visible (sidecar last).
            side, stage, stage_s = self._queue.get()
            try:
                self._drain(side, stage, stage_s)
            except BaseException as err:
                self._record_error(err if isinstance(err, Exception) else RuntimeError(repr(err)))
                self.log.warning(f"drain: {describe(side)} to {self.tier.url} failed: {err}")
            finally:
                shutil.rmtree(stage, ignore_errors=True)
                self._queue.task_done()

    def _drain(self, side: Sidecar, stage: str, stage_s: float) -> None:
        with open(os.path.join(stage, L.SIDECAR), "rb") as f:  # the committed sidecar, exactly
            side = Sidecar.from_json(f.read(), source=os.path.join(stage, L.SIDECAR))
        if self._refused is not None:
            return
        node = side.extra.get(NODE_LOCAL)
        rank = node.get("rank", 0) if isinstance(node, dict) else 0
        if is_primary_rank(rank):
            self._check_lineage(side)
        before = dict(self.tier.counts)
        start = time.perf_counter()
        if node is None:
            nbytes = self.tier.put(_kind(side), side, stage)
        else:
            nbytes = self._put_node_local(side, stage, rank, int(node["processes"]))
        self._record(side, nbytes, start, stage_s, before)
        if is_primary_rank(rank):
            self._prune(side)

    def _put_node_local(self, side: Sidecar, stage: str, rank: int, processes: int) -> int:
        """A node-local job's checkpoint: this rank's archive; the primary then waits (bounded) until every rank's
        archive is listed, and only then writes the manifest and the sidecar (docs/campaigns.rst)."""
        nbytes = self.tier.put_part(_kind(side), side, stage, rank)
        if not is_primary_rank(rank):
            return nbytes
        deadline, delay = time.monotonic() + self.parts_wait_s, 0.05
        while missing := self.tier.missing_parts(_kind(side), side, processes):
            if time.monotonic() >= deadline:
                raise CheckpointError(
                    f"{describe(side)} is not published in {self.tier.url}: the parts of processes {missing} did not "
                    f"arrive within {self.parts_wait_s:g} s (no sidecar there: restart() does not see it)"
                )
            time.sleep(delay)
            delay = min(2 * delay, 2.0)
        return nbytes + self.tier.publish_parts(_kind(side), side, stage)

    def _record(self, side: Sidecar, nbytes: int, start: float, stage_s: float, before: dict[str, int]) -> None:
        done = time.time()
        elapsed = max(time.perf_counter() - start, 1e-9)
        if self._known is not None:
            self._known[(_kind(side), _number(side))] = side
        committed_at = self._committed_at.get(side.generation)
        ops = {k: v - before.get(k, 0) for k, v in self.tier.counts.items() if v - before.get(k, 0)}
        rec = transfer_record(
            nbytes,
            {
                "epoch": side.epoch,
                "step": side.step,
                "generation": side.generation,
                "url": self.tier.url_of(_kind(side), _number(side)),
                "ops": ops,
            },
            upload_s=elapsed,
        )
        # The stall (staging, on the writer's thread) and the lag behind the fast tier's commit.
        rec["stage_s"] = round(stage_s, 6)
        rec["lag_s"] = round(done - committed_at, 6) if committed_at is not None else None
        self.records.append(rec)
        self.log.info(
            f"drain: {describe(side)} to {rec['url']}: {human_bytes(nbytes)} in {elapsed:.3f} s "
            f"({rec['mb_per_s']:.1f} MB/s)"
        )

    def _check_lineage(self, side: Sidecar) -> None:
        """Refuse to write over another lineage, or over a newer copy of the same checkpoint."""
        if self._known is None:
            self._known = {}
            for kind in (EPOCHS, STEPS):
                for number in self.tier.numbers(kind):
                    try:
                        self._known[(kind, number)] = self.tier.read_sidecar(kind, number)
                    except CheckpointError:
                        continue  # an incomplete drain: nothing to protect
        foreign = sorted(
            (s for s in self._known.values() if s.lineage is not None and side.lineage not in (None, s.lineage)),
            key=lambda s: s.generation,
        )
        same = self._known.get((_kind(side), _number(side)))
        why = None
        if foreign:
            why = (
                f"it holds {describe(foreign[-1])} of lineage {foreign[-1].lineage}, and this run is lineage "
                f"{side.lineage}"
            )
        elif same is not None and same.generation > side.generation:
            why = f"it holds a newer {describe(same)} of this lineage than {describe(side)}"
        if why is not None:
            self._refused = (
                f"{self.cfg.persistent_key} {self.tier.url}: {why}; refusing to overwrite it (nothing is drained "
                f"from now on; resume from it, or give this run its own {self.cfg.persistent_key})"
            )
            raise LineageConflict(self._refused)

    def _prune(self, drained: Sidecar) -> None:
        epochs = sorted(n for kind, n in self._known if kind == EPOCHS)
        links = (self.store.link_epoch("best"), self.store.link_epoch("last"))
        protected = [e for e in links if e is not None]
        if drained.step is None:
            protected.append(drained.epoch)
        _, doomed = prune_plan(epochs, self.select, protected)
        gone = [(EPOCHS, e) for e in doomed]
        # A step checkpoint is superseded by any newer drained checkpoint.
        gone += [(k, n) for (k, n), s in self._known.items() if k == STEPS and s.generation < drained.generation]
        for kind, number in gone:
            self.tier.remove(kind, number)
            self._known.pop((kind, number), None)
            self.log.info(f"drain: pruned {kind} {L.epoch_name(number)} from {self.tier.url}")

    def _record_error(self, err: BaseException) -> None:
        with self._lock:
            self._errors.append(err)

    # -- called on the training thread -----------------------------------------------
    def take_errors(self) -> list[BaseException]:
        """Return and forget the drain errors collected so far."""
        with self._lock:
            errors, self._errors = self._errors, []
        return errors

    def finish(self, timeout: float, exiting: bool = False) -> bool:
        """Drain what the policy leaves for the end, wait up to ``timeout`` s, and log whether it completed.

        ``every``, ``interval`` and ``preempt``: the newest commit (the last
        save, or a preemption save) if it was not drained yet. ``end``: best and
        last. ``exiting``: the process ends once this returns (said if the drain is not complete).

        Returns:
            True if every queued checkpoint reached the persistent tier in time.
        """
        self._finished = self._latest.generation if self._latest is not None else None
        for side in self._final_sides():
            self._enqueue(side)
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        latest = self._latest
        if self._queue.unfinished_tasks:
            self.log.warning(
                f"drain: NOT complete after {timeout:g} s: {describe(latest) if latest else 'a checkpoint'} is not "
                f"yet in the persistent tier {self.tier.url} "
                + (
                    "and this process exits now: a restart elsewhere resumes the newest checkpoint there"
                    if exiting
                    else "(the drain goes on while this process lives)"
                )
            )
            return False
        if latest is not None and self._said != latest.generation and self._refused is None:
            self._said = latest.generation
            drained = any(r["generation"] == latest.generation for r in self.records)
            if drained or self.policy == "end":
                self.log.info(f"drain: complete: {describe(latest)} is in the persistent tier {self.tier.url}")
        return self._refused is None

    def at_exit(self, timeout: float) -> None:
        """The process is exiting with a commit no :meth:`finish` was given (``fit`` ended by an uncaught error, a
        ``SystemExit``, a signal that is no preemption): drain as :meth:`finish` does, up to ``timeout`` s, saying so.
        Without this the drain's daemon thread dies with the process, and the next node resumes an older checkpoint
        (or none) from the persistent tier."""
        if self.before_exit is not None:
            self.before_exit()
        latest = self._latest
        if latest is None or self._finished == latest.generation or self._refused is not None:
            return
        self.log.info(
            f"exit: draining {describe(latest)} to {self.tier.url} before this process exits "
            f"(up to {timeout:g} s, ckpt_drain_timeout)"
        )
        self.finish(timeout, exiting=True)

    def _final_sides(self) -> list[Sidecar]:
        if self.policy != "end":
            return [self._latest] if self._latest is not None else []
        sides = []
        for name in ("best", "last"):
            epoch = self.store.link_epoch(name)
            if epoch is None:
                continue
            try:
                sides.append(self.store.read_sidecar(epoch))
            except CheckpointError as err:
                self._record_error(err)
        return sorted(sides, key=lambda s: s.generation)

    def stats(self) -> list[dict[str, Any]]:
        return list(self.records)


__all__ = ["DRAIN_INCOMPLETE_EXIT", "Drain"]


def _at_exit(ref: weakref.ref) -> None:
    drain = ref()
    if drain is not None:
        drain.at_exit(drain.cfg.drain_timeout)
