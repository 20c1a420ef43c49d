"""Choose, fetch, verify and load the checkpoint a job resumes from (no Keras here).

The one place that decides which checkpoint a restart loads. Shared by
``restart()`` (``keras_restart.py``, one Keras 3 model), the tf_keras adapter,
the epoch runner (several objects and loop state) and
:class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`. In a job of several
processes the primary makes the choice here once and the others verify exactly that
checkpoint (:mod:`candle_ckpt.engine.group_restore`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, NoValidCheckpoint
from candle_ckpt.core.log import OpsLog, human_bytes, position, transfer_record
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.pending import Pending
from candle_ckpt.storage.store import CheckpointStore


class Chosen(NamedTuple):
    """A verified checkpoint: its epoch, sidecar and the bytes of the files asked for.

    A tuple, so ``epoch, side, contents = select_checkpoint(...)`` also works.
    ``contents`` values are ``bytes`` or read-only mmaps (``mapped=True``).
    """

    epoch: int
    sidecar: Sidecar
    contents: dict[str, Any]


@dataclass
class Resumed:
    """What one restore loaded (:func:`candle_ckpt.engine.restore.restore`), handed to the run through an object.

    ``restart()`` attaches it to the model (:func:`attach_resumed`); the
    run adopts it once when ``fit`` starts (:meth:`~candle_ckpt.engine.run.TrainingRun.adopt`),
    so the call order of ``restart()`` and the callback's creation does not
    matter, and nothing is kept in process-global state.

    Attributes:
        directory: The real path of the ``ckpt_directory`` it came from; a
            callback writing elsewhere ignores it.
        sidecar: The restored checkpoint's sidecar.
        load: The load statistics (see :func:`load_record`).
        pending: What the restore could not apply yet (an optimizer that does
            not exist yet, callback and RNG states): the callback applies it
            when training starts.
        start: This start's breakdown (:mod:`candle_ckpt.engine.restart_history`).
        source: The tier the checkpoint came from: ``"fast"``, or ``"persistent"`` (pulled from it).
    """

    directory: str
    sidecar: Sidecar
    load: dict[str, Any] | None = None
    pending: Pending = field(default_factory=Pending)
    start: dict[str, Any] | None = None
    source: str | None = None

    def serves(self, directory: str) -> bool:
        """True if this record was restored from ``directory``."""
        return self.directory == os.path.realpath(directory)


# An attribute on the model object: its lifetime is the model's.
RESUMED_ATTR = "_candle_ckpt_resumed"


def attach_resumed(model: Any, resumed: Resumed | None) -> None:
    """Attach (or, with None, clear) what a restore loaded into ``model``."""
    # object.__setattr__: bypass Keras's attribute tracking (this is no layer state).
    object.__setattr__(model, RESUMED_ATTR, resumed)


def resumed_of(model: Any, directory: str) -> Resumed | None:
    """The :class:`Resumed` attached to ``model`` by a restore from ``directory``, if any."""
    found = getattr(model, RESUMED_ATTR, None)
    return found if isinstance(found, Resumed) and found.serves(directory) else None


class Adapter(Protocol):
    """What a restore loads into: one model, several objects, or loop state.

    ``reads`` names the files ``restore`` reads; ``capture`` snapshots the
    state for a save (on the training thread).
    """

    reads: Iterable[str]

    def capture(self, cfg: CkptConfig) -> Capture: ...

    def restore(self, chosen: Chosen, log: OpsLog, where: str) -> None: ...


def checkpoint_dir(layout: L.Layout, side: Sidecar) -> str:
    """The directory of the checkpoint ``side`` describes: ``steps/GGG`` for a step checkpoint, else ``epochs/NNN``."""
    return layout.step_dir(side.generation) if side.step is not None else layout.epoch_dir(side.epoch)


def _newest_step(store: CheckpointStore, log: OpsLog, reads: tuple[str, ...], mapped: bool) -> Chosen | None:
    """The newest valid step checkpoint committed after ``last`` (see :mod:`candle_ckpt.storage.steps`)."""
    if not store.steps.generations():
        return None
    last = store.link_epoch("last")
    base = None
    if last is not None:
        try:
            base = store.read_sidecar(last)
        except CheckpointError:
            base = None  # a broken last: any step checkpoint is newer than what the fallback finds

    def report(path: str, why: str) -> None:
        log.warning(f"restart: skipping step checkpoint {path}: {why}")

    found = store.steps.newest_valid(after=base, reads=reads, mapped=mapped, on_problem=report)
    return Chosen(found[0].epoch, *found) if found is not None else None


def select_checkpoint(
    cfg: CkptConfig,
    log: OpsLog,
    *,
    reads: Iterable[str],
    epoch: int | None = None,
    fs=None,
    mapped: bool = False,
    store: CheckpointStore | None = None,
    steps: bool = False,
) -> Chosen | None:
    """Find the checkpoint to resume from: ``ckpt_restart_mode`` / ``ckpt_restart_epoch``.

    With a persistent tier (``cfg.persistent``) the newer of the two tiers'
    newest valid checkpoints is taken, a persistent one pulled into the fast
    tier first (:func:`_newest_of_both_tiers`); an exact ``epoch`` missing
    locally is pulled. Every file's CRC is
    verified; the bytes of the names in ``reads`` are returned so that they
    are read once.

    Args:
        cfg: The job's configuration (restart mode, directory, upload URL).
        log: Where to log what was skipped and why.
        reads: Names of files whose verified bytes are returned.
        epoch: An exact epoch to restore (overrides ``cfg.restart_epoch``).
        fs: File-system operations for a pull from the remote store.
        mapped: Return the files read as read-only mmaps (see ``CheckpointStore.verify``).
        store: The job's own store, when its writer already holds the lock (a
            remote pull then commits through it); None: a store of its own.
        steps: Also consider step checkpoints (``ckpts/steps/GGG``): the newest
            valid one committed after ``last`` wins (its sidecar's ``step`` is
            set). Only for an adapter that resumes mid-epoch; never with an
            exact ``epoch`` / ``ckpt_restart_epoch``.

    Returns:
        None when there is nothing to resume from (and the mode allows it).

    Raises:
        NoValidCheckpoint: ``required`` mode or an exact epoch, and no valid checkpoint.
        LayoutMismatch: ``ckpt_directory`` holds checkpoints in the other layout only.
    """
    if not cfg.restores(epoch):
        return None
    if store is None:
        store = CheckpointStore.of(cfg, fs=fs)
    store.check_layout()  # checkpoints in the other layout: say so rather than start from scratch
    wanted = epoch if epoch is not None else cfg.restart_epoch
    what = f"resume_from_epoch={epoch}" if epoch is not None else f"ckpt_restart_epoch={cfg.restart_epoch}"
    if _nothing_to_resume(cfg, store, log, wanted, what):
        return None
    reads = tuple(reads)
    if wanted is not None:
        return _exact(store, wanted, what, reads, mapped)
    if cfg.persistent:
        return _newest_of_both_tiers(cfg, store, log, reads, mapped, steps)
    if steps:
        chosen = _newest_step(store, log, reads, mapped)
        if chosen is not None:
            return chosen
    return _newest_epoch(cfg, store, log, reads, mapped)


def _nothing_to_resume(cfg: CkptConfig, store: CheckpointStore, log: OpsLog, wanted: int | None, what: str) -> bool:
    """Pull from the remote mirror when nothing is local; True if there is still nothing, and that is allowed.

    Raises:
        NoValidCheckpoint: nothing to resume from, in ``required`` mode or for an exact epoch.
    """
    if cfg.persistent and wanted is not None and wanted not in store.epochs():
        from candle_ckpt.storage.pull import pull_newest

        pull_newest(cfg, store, log, epoch=wanted)
    if cfg.persistent and wanted is None:
        return False  # the tiers are compared in _newest_of_both_tiers
    if store.exists():
        return False
    where = store.layout.root
    if cfg.restart_mode == "required" or wanted is not None:
        mode = f"ckpt_restart_mode={cfg.restart_mode}" if wanted is None else what
        raise NoValidCheckpoint(f"{mode}: no checkpoints in {where}")
    if os.path.isdir(where):  # logging would create the directory otherwise
        log.info(f"restart: no checkpoints in {where}; starting from scratch")
    return True


def _newest_local(
    store: CheckpointStore, log: OpsLog, reads: tuple[str, ...], mapped: bool, steps: bool, problems: list[str]
) -> Chosen | None:
    """The fast tier's newest verified checkpoint (a step checkpoint after ``last`` first), or None."""
    if steps:
        chosen = _newest_step(store, log, reads, mapped)
        if chosen is not None:
            return chosen

    def report(bad_epoch: int, why: str) -> None:
        problems.append(f"epoch {bad_epoch}: {why}")
        log.warning(f"restart: skipping epoch {bad_epoch}: {why}")

    found = store.find_valid(reads=reads, on_problem=report, mapped=mapped) if store.exists() else None
    return Chosen(*found) if found is not None else None


def _newest_of_both_tiers(
    cfg: CkptConfig, store: CheckpointStore, log: OpsLog, reads: tuple[str, ...], mapped: bool, steps: bool
) -> Chosen | None:
    """The newest verified checkpoint of the fast tier (``ckpt_directory``) and the persistent one, by
    (generation, epoch, step); a newer persistent one is fetched into the fast tier first. One log line
    says which tier won and why (docs/campaigns.rst)."""
    from candle_ckpt.storage.pull import pull_first
    from candle_ckpt.storage.remote import PersistentTier, describe, sort_key

    problems: list[str] = []
    local = _newest_local(store, log, reads, mapped, steps, problems)
    fast = f"the fast tier's {describe(local.sidecar)}" if local else f"the fast tier {store.layout.root} (empty)"
    if local is None and problems:
        fast = f"the fast tier {store.layout.root} (nothing valid: {'; '.join(problems)})"
    try:
        tier = PersistentTier.of(cfg)
        found = tier.candidates(lambda path, why: log.warning(f"restart: skipping {path}: {why}"))
    except OSError as err:
        log.warning(f"restart: tier: fast; the persistent tier {cfg.persistent} cannot be read ({err}); using {fast}")
        found, tier = [], None
    newer = [(k, s) for k, s in found if local is None or sort_key(s) > sort_key(local.sidecar)]
    pulled = pull_first(tier, newer, store, log) if newer else None
    if pulled is not None:
        if local is not None:
            close_chosen(local)
        log.info(
            f"restart: tier: persistent: {tier.url} {describe(pulled)} is newer than {fast}; "
            f"fetched into {store.layout.root} and verified"
        )
        store.resync_generation()
        return _newest_local(store, log, reads, mapped, steps, [])
    if tier is not None and local is not None:
        if not found:
            theirs = f"the persistent tier {tier.url} holds no complete checkpoint yet"
        else:
            why = "its newer ones could not be fetched (above)" if newer else "it is not newer"
            theirs = f"{tier.url} has {describe(found[0][1])}; {why}"
        log.info(f"restart: tier: fast: {fast} is the newest valid one ({theirs})")
    if local is None:
        where = f"{store.layout.root} or {cfg.persistent}"
        detail = "; ".join(problems) or "none were found"
        if cfg.restart_mode == "required":
            raise NoValidCheckpoint(f"ckpt_restart_mode=required: no valid checkpoint in {where} ({detail})")
        if os.path.isdir(store.layout.root):
            log.info(f"restart: no valid checkpoint in {where} ({detail}); starting from scratch")
    return local


def close_chosen(chosen: Chosen) -> None:
    """Close what a choice opened (its read-only maps) when it is not loaded after all."""
    for data in chosen.contents.values():
        if hasattr(data, "close"):
            data.close()


def _exact(store: CheckpointStore, wanted: int, what: str, reads: tuple[str, ...], mapped: bool) -> Chosen:
    """The exact epoch asked for (``what`` says by which parameter), verified, or NoValidCheckpoint."""
    if wanted not in store.epochs():
        raise NoValidCheckpoint(f"{what}: no checkpoint {store.layout.epoch_dir(wanted)}")
    try:
        side, contents = store.verify(wanted, reads=reads, mapped=mapped)
    except CheckpointError as err:
        raise NoValidCheckpoint(f"{what}: checkpoint is not valid: {err}") from None
    return Chosen(wanted, side, contents)


def _newest_epoch(
    cfg: CkptConfig, store: CheckpointStore, log: OpsLog, reads: tuple[str, ...], mapped: bool
) -> Chosen | None:
    """The newest valid epoch checkpoint (``last`` first, then by generation); each one skipped is logged."""
    where = store.layout.root
    problems: list[str] = []

    def report(bad_epoch: int, why: str) -> None:
        problems.append(f"epoch {bad_epoch}: {why}")
        log.warning(f"restart: skipping epoch {bad_epoch}: {why}")

    found = store.find_valid(reads=reads, on_problem=report, mapped=mapped)
    if found is None:
        detail = "; ".join(problems) or "none were found"
        if cfg.restart_mode == "required":
            raise NoValidCheckpoint(f"ckpt_restart_mode=required: no valid checkpoint in {where} ({detail})")
        if problems:
            log.warning(f"restart: no valid checkpoint in {where} ({detail}); starting from scratch")
        else:  # an empty store (e.g. just opened by this job's writer) is not a problem
            log.info(f"restart: no checkpoints in {where}; starting from scratch")
        return None
    return Chosen(*found)


def load_chosen(
    cfg: CkptConfig, log: OpsLog, adapter: Adapter, chosen: Chosen, verify_s: float, who: str = ""
) -> dict[str, Any]:
    """Load ``chosen`` through ``adapter``, then record and log the restore.

    Unmaps the files read afterwards and returns the load statistics; the
    caller hands them on in a :class:`Resumed` (see :func:`attach_resumed`).
    """
    where = checkpoint_dir(L.Layout.of(cfg), chosen.sidecar)
    start = time.perf_counter()
    try:
        adapter.restore(chosen, log, where)
    finally:
        for data in chosen.contents.values():
            if hasattr(data, "close"):
                data.close()  # unmap now rather than at garbage collection
    record = load_record(chosen.sidecar, verify_s, time.perf_counter() - start)
    record.update(getattr(adapter, "read_stats", None) or {})  # a process of a group: what it read itself
    log_resumed(log, L.Layout.of(cfg), chosen.sidecar, record, who)
    return record


def load_record(side: Sidecar, verify_s: float, load_s: float) -> dict[str, Any]:
    """The statistics of one restore: bytes, read+verify and load durations, MB/s."""
    return transfer_record(side.total_bytes, {"epoch": side.epoch}, verify_s=verify_s, load_s=load_s)


def log_resumed(log: OpsLog, layout: L.Layout, side: Sidecar, record: dict[str, Any], who: str = "") -> None:
    path = checkpoint_dir(layout, side)
    at = f"after {position(side.epoch)}" if side.step is None else position(side.epoch, side.step)
    log.info(
        f"restart: {who + ' ' if who else ''}resumed from {path} ({at}, "
        f"generation {side.generation}); "
        f"{human_bytes(record.get('read_bytes', record['bytes']))} read and verified in {record['verify_s']:.3f} s, "
        f"loaded in {record['load_s']:.3f} s ({record['mb_per_s']:.1f} MB/s)"
    )
