"""The restart -> callback hand-off without Keras: the Resumed record on the model and its Pending state."""

from __future__ import annotations

import gc
import os

import numpy as np

from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.pending import ParkedOptimizer, Pending
from candle_ckpt.engine.resume import Resumed, attach_resumed, resumed_of


class Model:
    """Stands in for a model: any object with attributes."""


def _resumed(directory: str, **pending_items) -> Resumed:
    side = Sidecar(epoch=3, generation=1, model_file="model.weights.h5", files={})
    return Resumed(os.path.realpath(directory), side, {"bytes": 1}, Pending(**pending_items))


def test_the_record_travels_on_the_model_and_only_serves_its_directory(tmp_path):
    """resumed_of finds the record attached to that model for the same directory (any spelling), never another's."""
    model, other = Model(), Model()
    record = _resumed(str(tmp_path / "a"))
    attach_resumed(model, record)
    assert resumed_of(model, str(tmp_path / "a" / ".." / "a")) is record
    assert resumed_of(model, str(tmp_path / "b")) is None
    assert resumed_of(other, str(tmp_path / "a")) is None
    attach_resumed(model, None)
    assert resumed_of(model, str(tmp_path / "a")) is None


def test_an_applied_optimizer_state_disarms_its_never_applied_warning(tmp_path):
    """take_optimizer() detaches the guard, so collecting the model says nothing."""
    log = OpsLog(str(tmp_path / "ckpt.log"))
    model = Model()
    record = _resumed(str(tmp_path), optimizer=ParkedOptimizer([np.zeros(2)]))
    record.pending.guard(model, log, "epochs/003")
    parked = record.pending.take_optimizer()
    assert len(parked.values) == 1 and record.pending.optimizer is None
    del model
    gc.collect()
    assert "never applied" not in (tmp_path / "ckpt.log").read_text()


def test_an_optimizer_state_never_taken_is_reported_when_the_model_goes(tmp_path, capfd):
    """Without take_optimizer(), collecting the model logs and prints that the optimizer state was never applied."""
    log = OpsLog(str(tmp_path / "ckpt.log"))
    model = Model()
    _resumed(str(tmp_path), optimizer=ParkedOptimizer([np.zeros(2)])).pending.guard(model, log, "epochs/003")
    del model
    gc.collect()
    assert "epochs/003 was never applied" in (tmp_path / "ckpt.log").read_text()
    assert "was never applied" in capfd.readouterr().err


def test_each_item_is_taken_once(tmp_path):
    """take_optimizer() and take_train_state() return None when nothing waits, and each item only once."""
    record = _resumed(str(tmp_path), train_state=b"state")
    assert record.pending.take_optimizer() is None
    assert record.pending.take_train_state() == b"state"
    assert record.pending.take_train_state() is None
