"""``restart()`` of a multi-process job: is ``ckpt_directory`` shared, or each node's own? And, when each node's own,
which tier and which checkpoint every process restores (docs/campaigns.rst, "Multi-process jobs on node-local disks").

One meeting answers both (:meth:`~candle_ckpt.core.group.Group.collect`, then the primary's word):

1. every process writes a marker with a fresh token into its ``ckpt_directory`` and posts the token with its
   inventory: the names of the checkpoints it holds (``epoch:N``, ``step:G``: two directory listings);
2. the primary looks for every token's marker in its own directory. All seen: the directory is shared, and
   the primary says ``shared`` (the choose-verify-load of :mod:`~candle_ckpt.engine.group_restore` follows, as
   before). Only its own: each process has its own directory, and the primary decides at once:

   * the **fast** tier's candidate is the newest checkpoint (generation, epoch, step) that EVERY process
     holds; the **persistent** tier's is its newest complete one (a sidecar); the newer wins, the fast tier
     on a tie. One log line says which and why (``restart: tier: ...``), naming the processes that lack a
     copy;
3. every process verifies its own files of that checkpoint (size and CRC32), after fetching them from the
   persistent tier if that tier won (its archive and the manifest, committed into its ``ckpt_directory``
   under the same generation); the processes ``exchange`` the outcome, and if one failed the primary rejects
   that choice and decides again from the same inventories, every process with it.

A mix (some processes share the primary's directory, others do not) is refused on every process; so is a
directory of each process's own under ``tf.distribute`` (``node_local=False``: only the chief commits, so the
others hold no copy) once there is something to restore.

Each meeting point is bounded by ``timeout_s`` (:func:`~candle_ckpt.engine.group_commit.group_timeout` by default).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, NoValidCheckpoint
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.resume import Chosen
from candle_ckpt.storage.store import CheckpointStore

MARK = ".candle-restore-"
SHARED = "shared"

# verify(said) -> Chosen: this process's files of the checkpoint ``said`` ("epoch:E:G" / "step:E:G"), verified.
Verify = Callable[[str], Chosen]


def _store(cfg: CkptConfig) -> CheckpointStore:
    return CheckpointStore(cfg.directory, checksum=cfg.checksum, flat=cfg.flat)


def _inventory(store: CheckpointStore) -> list[str]:
    return [f"epoch:{e}" for e in store.epochs()] + [f"step:{g}" for g in store.steps.generations()]


def _sort_key(side: Sidecar) -> tuple[int, int, int]:
    from candle_ckpt.storage.remote import sort_key  # noqa: PLC0415 (fsspec only with a persistent tier)

    return sort_key(side)


def _describe(side: Sidecar) -> str:
    from candle_ckpt.storage.remote import describe  # noqa: PLC0415

    return describe(side)


def _names(have: set[str]) -> list[str]:
    """``{"epoch:3", "step:7"}`` as ``["epochs/003", "steps/007"]``, in order."""
    pairs = sorted((kind, int(number)) for kind, number in (ident.split(":") for ident in have))
    return [L.checkpoint_name(kind, number) for kind, number in pairs]


class _Decision:
    """The primary's choice among the fast tiers every process holds and the persistent tier."""

    def __init__(self, cfg: CkptConfig, log: OpsLog, haves: list[set[str]], steps: bool, wanted: int | None) -> None:
        self.cfg, self.log, self.haves, self.steps, self.wanted = cfg, log, haves, steps, wanted
        self.rejected: set[str] = set()
        self.store = _store(cfg)
        self.persistent: list[tuple[str, Sidecar]] = []
        self.tier = None
        if cfg.persistent:
            from candle_ckpt.storage.remote import PersistentTier  # noqa: PLC0415

            try:
                self.tier = PersistentTier.of(cfg)
                self.persistent = self.tier.candidates(lambda p, why: log.warning(f"restart: skipping {p}: {why}"))
            except OSError as err:
                log.warning(f"restart: the persistent tier {cfg.persistent} cannot be read ({err})")

    def _fits(self, side: Sidecar, kind: str) -> bool:
        if kind == "step" and (not self.steps or self.wanted is not None):
            return False
        return self.wanted is None or (kind == "epoch" and side.epoch == self.wanted)

    def _local(self) -> list[tuple[str, Sidecar]]:
        common = set.intersection(*self.haves) - self.rejected
        found = []
        for ident in common:
            kind, number = ident.split(":")
            try:
                n = int(number)
                side = self.store.read_sidecar(n) if kind == "epoch" else self.store.steps.read_sidecar(n)
            except CheckpointError:
                continue
            if self._fits(side, kind):
                found.append((kind, side))
        return sorted(found, key=lambda item: _sort_key(item[1]), reverse=True)

    def _fast_words(self, best: tuple[str, Sidecar] | None) -> str:
        if best is not None:
            return f"the fast tiers' {_describe(best[1])}, held by every process"
        lacking = [f"process {r}: {', '.join(_names(h)) or 'nothing'}" for r, h in enumerate(self.haves)]
        return f"the fast tiers, where no checkpoint is held by every process ({'; '.join(lacking)})"

    def choose(self) -> str:
        """``local KIND EPOCH GENERATION``, ``persistent KIND EPOCH GENERATION`` or ``none``, and one log line."""
        local = self._local()
        best = local[0] if local else None
        remote = [
            (kind, s)
            for kind, s in self.persistent
            if self._fits(s, "epoch" if s.step is None else "step")
            and f"persistent:{kind}:{s.generation}" not in self.rejected
        ]
        newest = remote[0] if remote else None
        fast = self._fast_words(best)
        if newest is not None and (best is None or _sort_key(newest[1]) > _sort_key(best[1])):
            side = newest[1]
            self.log.info(
                f"restart: tier: persistent: {self.tier.url} {_describe(side)} is newer than {fast}; every process "
                "fetches its part into its own ckpt_directory and verifies it"
            )
            return f"persistent {'epoch' if side.step is None else 'step'} {side.epoch} {side.generation}"
        if best is not None:
            kind, side = best
            if self.tier is not None:
                theirs = f"{self.tier.url} has {_describe(newest[1])}; it is not newer" if newest else (
                    f"the persistent tier {self.tier.url} holds no complete checkpoint")  # fmt: skip
                self.log.info(f"restart: tier: fast: {fast} is the newest valid one ({theirs})")
            return f"local {kind} {side.epoch} {side.generation}"
        where = f"the processes' ckpt_directory{' or ' + self.cfg.persistent if self.cfg.persistent else ''}"
        if self.cfg.restart_mode == "required" or self.wanted is not None:
            raise NoValidCheckpoint(f"no checkpoint to restore in {where} ({fast})")
        self.log.info(f"restart: no checkpoint every process can restore in {where} ({fast}); starting from scratch")
        return "none"

    def reject(self, choice: str) -> None:
        tier, kind, epoch, generation = choice.split()
        if tier == "local":
            self.rejected.add(f"{kind}:{epoch if kind == 'epoch' else generation}")
        else:
            self.rejected.add(f"persistent:{'epochs' if kind == 'epoch' else 'steps'}:{generation}")


def _bound(timeout_s: float | None) -> float:
    return group_timeout() if timeout_s is None else timeout_s


def meet(
    cfg: CkptConfig,
    log: OpsLog,
    group: Group,
    name: str,
    *,
    steps: bool,
    wanted: int | None,
    timeout_s: float | None = None,
    node_local: bool = True,
) -> tuple[str, _Decision | None]:
    """Steps 1 and 2 of the module docstring: ``("shared", None)``, or the node-local choice and, on the primary,
    the decision (to decide again after a rejection).

    ``node_local=False`` (``tf.distribute``, where only the chief commits): directories of each process's own
    are refused when the primary's holds a checkpoint or the persistent tier does (the others could not read
    it; as before this protocol, when a worker's verification of the chief's choice failed), and otherwise
    lead to ``none`` (a start from scratch) or, in ``required`` mode, the error.

    Raises:
        NoValidCheckpoint: the processes neither all share one directory nor each have their own, or the
            primary found nothing to restore in ``required`` mode, or (``node_local=False``) the directories
            are each process's own and there is something to restore (on every process).
    """
    bound = _bound(timeout_s)
    if not cfg.restores(wanted):  # nothing is restored (the same on every process): no meeting, nothing written
        return SHARED, None
    root = cfg.directory
    os.makedirs(root, exist_ok=True)
    token = uuid.uuid4().hex[:16]
    marker = os.path.join(root, MARK + token)
    open(marker, "wb").close()
    decision: list[_Decision] = []

    def decide() -> str:
        read = [json.loads(p) for p in posts]
        seen = [r for r, p in enumerate(read) if os.path.exists(os.path.join(root, MARK + p["token"]))]
        if len(seen) == group.size:
            return SHARED
        if seen != [0]:
            raise NoValidCheckpoint(
                f"ckpt_directory {root!r}: processes {seen} share it, the others do not; give every process its "
                "own node-local directory, or all one shared directory"
            )
        decision.append(_Decision(cfg, log, [set(p["have"]) for p in read], steps, wanted))
        if not node_local and (read[0]["have"] or decision[0].persistent):
            raise NoValidCheckpoint(
                f"ckpt_directory {root!r} is not shared: no other worker sees the chief's marker in it; under "
                "tf.distribute only the chief commits, so every worker must read the chief's checkpoints: give "
                "every worker one ckpt_directory on a file system they all share"
            )
        return decision[0].choose()

    try:
        posts = group.collect(f"{name}/tiers", json.dumps({"token": token, "have": _inventory(_store(cfg))}),
                              bound)  # fmt: skip
        word = primary_says(group, f"{name}/tiers", decide if is_primary(group) else None, bound)
    finally:
        os.unlink(marker)
    return word, decision[0] if decision else None


def take(cfg: CkptConfig, log: OpsLog, group: Group, choice: str, verify: Verify) -> Chosen:
    """This process's files of ``choice``, verified; fetched from the persistent tier first if it was chosen."""
    tier, kind, epoch, generation = choice.split()
    said = f"{kind}:{epoch}:{generation}"
    if tier == "persistent":
        try:
            return verify(said)  # this process's copy may be the same checkpoint already
        except (CheckpointError, OSError):
            from candle_ckpt.storage.pull import pull_part  # noqa: PLC0415

            pull_part(cfg, log, kind, int(epoch), int(generation), group.rank, group.size)
    return verify(said)


def primary_says(group: Group, key: str, decide: Callable[[], str] | None, timeout_s: float | None = None) -> str:
    """The primary's ``decide()`` at ``key``, on every process (``decide`` is the primary's; None elsewhere).

    Raises:
        NoValidCheckpoint: the primary could not decide (its error is told to the others first, so none waits).
    """
    word, bound = None, _bound(timeout_s)
    if decide is not None:
        try:
            word = decide()
        except Exception as err:
            group.broadcast(key, f"error:{err}", bound)
            raise
    word = group.broadcast(key, word, bound)
    if word.startswith("error:"):
        raise NoValidCheckpoint(f"the primary (process 0) could not choose a checkpoint: {word[6:]}")
    return word


def verify_together(
    group: Group, log: OpsLog, key: str, verify: Callable[[], Chosen], timeout_s: float | None = None
) -> tuple[Chosen | None, list[str]]:
    """``verify()`` on this process, then every process's outcome (``exchange`` at ``key``): the checkpoint and
    no reasons when every process verified its files, else None and every failure (this process's files closed).
    """
    chosen, failure = None, ""
    try:
        chosen = verify()
    except (CheckpointError, ValueError, OSError, KeyError) as err:  # told to the others: all load, or none
        failure = f"process {group.rank}: {err}"
        log.warning(f"restart: {failure}; every process falls back together")
    reasons = [r for r in group.exchange(key, failure, _bound(timeout_s)) if r]
    if reasons and chosen is not None:
        for data in chosen.contents.values():
            if hasattr(data, "close"):
                data.close()
        chosen = None
    return chosen, reasons


def agree_node_local(
    cfg: CkptConfig,
    log: OpsLog,
    group: Group,
    name: str,
    choice: str,
    decision: _Decision | None,
    verify: Verify,
    timeout_s: float | None = None,
) -> Chosen | None:
    """Step 3 of the module docstring, from the primary's first ``choice``: the checkpoint every process verified
    (the same on every process), or None when there is none."""
    for attempt in range(1 << 30):
        if attempt:
            decide = decision.choose if decision else None
            choice = primary_says(group, f"{name}/nl/{attempt}/choice", decide, timeout_s)
        if choice == "none":
            return None
        key = f"{name}/nl/{attempt}/verified"
        chosen, reasons = verify_together(group, log, key, lambda c=choice: take(cfg, log, group, c, verify), timeout_s)
        if not reasons:
            return chosen
        if decision is not None:
            decision.log.warning(f"restart: {choice.split()[0]} {choice.split()[1]} rejected: {'; '.join(reasons)}")
            decision.reject(choice)
    return None
