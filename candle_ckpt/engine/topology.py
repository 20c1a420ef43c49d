"""How the processes of a job write each checkpoint: the engine's one topology object, got from the Group.

Three shapes, each a class with the same four answers (who holds the lock and commits, where a failed
snapshot goes, the epoch commit, the step commit), so that
:class:`~candle_ckpt.engine.engine.CheckpointEngine` has one save path and no branch on a role or a size:

- :class:`Topology` itself: one process, which commits into its store alone.
- :class:`SharedParts` (several JAX processes, ``keras.distribution``): every rank writes its part of the
  same checkpoint and the primary publishes it (:mod:`candle_ckpt.engine.group_commit`); the saves meet, in
  each run's scope of the group (:attr:`Topology.meets`). A rank whose ``ckpt_directory`` is its node's own
  commits its own copy and drains its own part to the persistent tier.
- :class:`MirroredWorkers` (``tf.distribute``, every worker holds every variable): the chief, the group's
  primary, commits alone as one process does; every other worker takes the same snapshot at the same point
  (reading a mirrored variable may be a collective) and writes it into its scratch directory, then removes it
  (:func:`~candle_ckpt.engine.aftercommit.write_scratch`). The saves never meet.

:func:`parts_of` is the topology of a group whose processes each hold a part (a group of one: one process);
:func:`mirrored` the one of ``tf.distribute``'s workers. A topology method is given the engine for its store,
its log and its records (the engine's ``note``, ``records`` and ``own_drain`` are what it calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from candle_ckpt.core.group import SOLO, Group, is_primary
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.aftercommit import part_record, write_scratch
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.group_commit import commit_epoch, commit_step, failed_capture
from candle_ckpt.storage.multipart import NODE_LOCAL


class Topology:
    """One process: it decides, snapshots and commits alone (the base of the other two shapes).

    Attributes:
        group: Where the saves meet (:data:`~candle_ckpt.core.group.SOLO` when they never do); a run puts its
            own scope of the group here while it lasts (:class:`~candle_ckpt.engine.run.TrainingRun`).
        scratch_dir: Where this process writes its scratch copies instead of committing (a non-chief worker),
            else None.
        meets: Whether the saves meet through :attr:`group` (each run gives them its scope of it).
        background_steps: Whether a periodic step checkpoint may be committed on the writer's thread, as an epoch's
            is (one process only: the shapes of several keep their step checkpoints on the training thread).
    """

    meets = False
    background_steps = True
    scratch_dir: str | None = None

    def __init__(self, group: Group = SOLO) -> None:
        self.group = group

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.group!r})"

    @property
    def primary(self) -> bool:
        """This process holds the writer lock, commits, prunes, drains and writes ``ckpt.log``."""
        return True

    def capture(self, capture: Callable[[], Capture]) -> Capture:
        """The snapshot (a failure raises here)."""
        return capture()

    def commit_epoch(self, engine: Any, epoch: int, cap: Capture, template: Sidecar, best_epoch: int | None):
        """Commit ``epoch``: the committed sidecar (the engine records, logs, prunes and drains it), or None when
        this process's share is written and nothing is left for it to do."""
        return engine.store.commit(epoch, cap.files, template, best_epoch=best_epoch)

    def commit_step(self, engine: Any, what: dict[str, Any], cap: Capture, template: Sidecar):
        """Commit a step checkpoint (``what``: epoch, step, reason): ``(what save_step returns, whether the engine
        records, drains and logs it as the committer)``."""
        return engine.store.steps.commit(cap.files, template), True


class SharedParts(Topology):
    """Several processes write each checkpoint together, each its part; the primary publishes it (module docstring)."""

    meets = True
    background_steps = False

    @property
    def primary(self) -> bool:
        return is_primary(self.group)

    def capture(self, capture: Callable[[], Capture]) -> Capture:
        """A failed snapshot goes into the commit, so that every rank raises it and none waits for this one."""
        try:
            return capture()
        except Exception as err:
            return failed_capture(err)

    def commit_epoch(self, engine: Any, epoch: int, cap: Capture, template: Sidecar, best_epoch: int | None):
        start = time.perf_counter()
        side = commit_epoch(engine.store, self.group, epoch, cap, template, best_epoch, engine.note(cap))
        if side is None:  # not the primary: its part is in, the primary did the rest
            engine.records.append(part_record({"epoch": epoch, "reason": template.reason}, cap, start))
            return None
        if not self.primary:  # a node-local rank (its own copy committed): it drains its own part
            engine.own_drain()
        return side

    def commit_step(self, engine: Any, what: dict[str, Any], cap: Capture, template: Sidecar):
        start = time.perf_counter()
        side = commit_step(engine.store, self.group, cap, template, engine.note(cap))
        if self.primary:
            return side, True
        engine.records.append(part_record(what, cap, start))
        if NODE_LOCAL in side.extra and engine.own_drain() is not None:
            engine.remote.step_committed(side)  # its own copy: it drains its own part
        return side, False


class MirroredWorkers(Topology):
    """``tf.distribute``'s workers: the chief commits alone, the others write scratch copies (module docstring).

    Args:
        workers: The workers (the chief is its primary; :attr:`workers`). The saves never meet: :attr:`group` is
            :data:`~candle_ckpt.core.group.SOLO` (a run's preemption agreement meets over the workers all the same).
        scratch_dir: This worker's scratch directory, or None on the chief.
    """

    background_steps = False

    def __init__(self, workers: Group, scratch_dir: str | None) -> None:
        super().__init__(SOLO)
        self.workers, self.scratch_dir = workers, scratch_dir

    def __repr__(self) -> str:
        return f"MirroredWorkers({self.workers!r}, scratch_dir={self.scratch_dir!r})"

    @property
    def primary(self) -> bool:
        return self.scratch_dir is None

    def commit_epoch(self, engine: Any, epoch: int, cap: Capture, template: Sidecar, best_epoch: int | None):
        if self.scratch_dir is None:
            return super().commit_epoch(engine, epoch, cap, template, best_epoch)
        write_scratch(engine.store.fs, self.scratch_dir, epoch, cap, engine.log)
        return None

    def commit_step(self, engine: Any, what: dict[str, Any], cap: Capture, template: Sidecar):
        if self.scratch_dir is None:
            return super().commit_step(engine, what, cap, template)
        write_scratch(engine.store.fs, self.scratch_dir, what["epoch"], cap, engine.log)
        return None, False


def parts_of(group: Group) -> Topology:
    """The topology of ``group`` when each process writes its part (a group of one: one process)."""
    return SharedParts(group) if group.size > 1 else Topology(group)


def mirrored(group: Group, scratch_dir: str) -> MirroredWorkers:
    """The topology of ``tf.distribute``'s workers in ``group``: the primary is the chief; every other worker
    writes its scratch copies into ``scratch_dir``."""
    return MirroredWorkers(group, None if is_primary(group) else scratch_dir)


__all__ = ["MirroredWorkers", "SharedParts", "Topology", "mirrored", "parts_of"]
