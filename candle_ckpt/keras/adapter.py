"""The Keras 3 adapter: a model captured into a checkpoint, and a checkpoint restored into it.

:func:`capture_model` builds the :class:`~candle_ckpt.engine.capture.Capture` of a
model's host snapshot (``model.keras`` or ``model.weights.h5``);
:class:`KerasModelAdapter` is what ``restart()`` and
:class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState` hand the engine
(an :class:`~candle_ckpt.engine.resume.Adapter`). Its ``restore`` loads a verified
checkpoint, all or nothing (:mod:`candle_ckpt.keras.preflight`), from our own
format, a sharded one or ECP-CANDLE's ``model.h5``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from candle_ckpt.config.params import CkptConfig, require_model
from candle_ckpt.core import layout as L
from candle_ckpt.core.candle_sidecar import CandleSidecar
from candle_ckpt.core.errors import ModelMismatch, NoValidCheckpoint
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.pending import ParkedOptimizer, Pending
from candle_ckpt.keras import internals
from candle_ckpt.keras.candle_h5 import restore_candle_h5
from candle_ckpt.keras.plan import make_plan
from candle_ckpt.keras.preflight import (
    build_optimizer,
    check_model,
    late_optimizers,
    load_when_built,
    read_optimizer_state,
)
from candle_ckpt.keras.state import KERAS_VERSION, ModelState, backend_name
from candle_ckpt.keras.train_state import TRAIN_STATE_FILE
from candle_ckpt.multihost.load import load_sharded
from candle_ckpt.multihost.save import train_state_part
from candle_ckpt.storage.keras_archive import weights_member_range, write_keras_archive
from candle_ckpt.storage.sharded import MANIFEST
from candle_ckpt.storage.store import FileSpec


def capture_model(state: ModelState, cfg: CkptConfig, extra: dict | None = None) -> Capture:
    """Snapshot ``state`` on this thread; the returned files write from the snapshot.

    Async saves copy the state (training goes on during the write); sync
    saves write straight from the variables, which no step can change before
    the write is done, so they copy nothing.

    The state is written once: ``model.keras`` (a full model, loadable with
    ``keras.models.load_model``, whose weights member ``restart()`` reads in
    place) or, with ``ckpt_save_weights_only``, ``model.weights.h5``.
    """
    start = time.perf_counter()
    snap = state.snapshot(copy=cfg.async_save)
    if cfg.save_weights_only:
        model_file, write = L.WEIGHTS_FILE, snap.write_h5
    else:
        config_json, metadata_json = state.full_model_parts()

        def write(f) -> None:
            write_keras_archive(f, snap.write_h5, config_json, metadata_json)

        model_file = L.MODEL_FILE
    files = [FileSpec(model_file, write)]
    if snap.extra:
        files.append(FileSpec(L.EXTRA_FILE, snap.write_extra))
    return Capture(
        files=files,
        model_file=model_file,
        nbytes=snap.nbytes,
        snapshot_s=time.perf_counter() - start,
        keras_version=KERAS_VERSION,
        backend=backend_name(),
        extra=dict(extra or {}),
        inline_why=snap.inline_why,
    )


class KerasModelAdapter:
    """Capture and restore one Keras 3 model (a :class:`~candle_ckpt.engine.resume.Adapter`):
    used by ``restart()`` and :class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`."""

    # A sharded checkpoint (written by several processes) restores here too: its manifest and process 0's state.
    reads = (L.MODEL_FILE, L.WEIGHTS_FILE, L.EXTRA_FILE, TRAIN_STATE_FILE, MANIFEST, train_state_part(0))

    def __init__(self, model) -> None:
        require_model(model, "model")
        self.state = ModelState(model)
        # State restore() could not apply yet: it waits for fit (see candle_ckpt.engine.pending).
        self.pending = Pending()

    def capture(self, cfg: CkptConfig) -> Capture:
        return capture_model(self.state, cfg)

    def restore(self, chosen, log, where: str) -> None:
        """Load a verified checkpoint (a :class:`~candle_ckpt.engine.resume.Chosen`) into the model.

        The weights come from the sidecar's ``model_file``: ``model.keras``
        (its weights member, read in place) or ``model.weights.h5``.

        Raises:
            NoValidCheckpoint: the checkpoint has no Keras 3 weights.
        """
        side, contents = chosen.sidecar, chosen.contents
        self.pending = Pending()
        if isinstance(side, CandleSidecar):  # written by ECP-CANDLE itself: its model.h5
            values = restore_candle_h5(self.state.model, os.path.join(where, side.model_file), log, where)
            if values is not None:  # not compiled yet: the callback applies it when fit begins
                self.pending = Pending(optimizer=ParkedOptimizer(values))
            return
        if side.model_file == MANIFEST:  # written by several processes: read into this process's variables
            build_optimizer(self.state.model)
            self.pending = load_sharded(self.state.model, contents, where, log)
            return
        if side.model_file not in contents:
            raise NoValidCheckpoint(f"checkpoint {where} has neither {L.MODEL_FILE} nor {L.WEIGHTS_FILE}")
        model = self.state.model
        extra = contents.get(L.EXTRA_FILE)
        optimizer = None
        late = late_optimizers(model)  # a GAN's d_optimizer before its first step: loaded when Keras builds it
        with (
            format_changed(side.keras_version, where),
            weights_view(contents[side.model_file], side.model_file, where) as weights,
        ):
            build_optimizer(model, weights)  # raises if the model is not built
            # One walk of the model's saveables serves the preflight and the random-layer variables.
            plan = make_plan(model, optimizers=getattr(model, "optimizer", None) is not None)
            extra_vars = self.state.extra_variables(plan)
            # All or nothing: every shape, dtype and count is checked before the first assignment.
            check_model(model, weights, extra, extra_vars, where, side.epoch, plan=plan, late=late)
            if getattr(model, "optimizer", None) is None:
                # restart() before compile(): the optimizer does not exist yet. Its state
                # is parked and applied when it does (the callback, at the latest when fit starts).
                arrays = read_optimizer_state(weights)
                optimizer = ParkedOptimizer(arrays) if arrays is not None else None
            saved = {name: read_optimizer_state(weights, name) for name in late}
            self.state.restore(weights, skip=list(late.values()))
        for name, arrays in saved.items():
            load_when_built(late[name], arrays, where, name)
        if extra is not None:
            self.state.restore_extra(bytes(extra), extra_vars)
        elif extra_vars:
            log.warning(
                f"restart: {where} has no {L.EXTRA_FILE}; the random-layer seed states "
                "start fresh, so the resumed run will not be bit-identical"
            )
        train_state = bytes(contents[TRAIN_STATE_FILE]) if TRAIN_STATE_FILE in contents else None
        self.pending = Pending(optimizer=optimizer, train_state=train_state)


@contextlib.contextmanager
def format_changed(saved: str | None, where: str) -> Iterator[None]:
    """Say so when a checkpoint written before a change of Keras's saving format does not load.

    Raises:
        ModelMismatch: the checkpoint does not fit the model, and Keras's saving format changed
            between the release that wrote it and this one (the message names both and the change).
    """
    change = internals.format_change(saved)
    try:
        yield
    except ValueError as err:
        if change is None:
            raise
        raise ModelMismatch(
            f"checkpoint {where} was written by Keras {saved} and this is Keras {internals.KERAS_VERSION}: "
            f"{change}. Restore it with Keras {saved} (pip install keras=={saved}), or load its weights "
            f"there and save them again with this Keras. What failed: {err}"
        ) from err


@contextlib.contextmanager
def weights_view(data: Any, name: str, where: str) -> Iterator[Any]:
    """The ``.weights.h5`` bytes of a checkpoint file read by a restore, without a copy.

    ``data`` itself for a ``.weights.h5``; for a ``.keras`` archive, a view of
    its stored weights member, released on exit (so the mmap can be closed).

    Raises:
        NoValidCheckpoint: the archive holds no stored weights member.
    """
    if not name.endswith(".keras"):
        yield data
        return
    try:
        start, size = weights_member_range(data, name)
    except ValueError as err:
        raise NoValidCheckpoint(f"checkpoint {where}: {err}") from None
    with memoryview(data) as whole, whole[start : start + size] as member:
        yield member
