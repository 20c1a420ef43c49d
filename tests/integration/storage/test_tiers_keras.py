"""Checkpoint tiers with real ``model.fit`` and the README's Quickstart model: the issue's stale-tier case, and a
preemption save drained (or not) before the process stops (docs/campaigns.rst)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import keras
import numpy as np
import pytest
from doclines import assert_log_example

from candle_ckpt import CandleCheckpointCallback, restart
from candle_ckpt.engine.preempt import PreemptExit
from candle_ckpt.storage.drain import DRAIN_INCOMPLETE_EXIT


def quickstart_data():
    """README.rst's Quickstart data: y = x @ w + noise, 512 samples of 8 features."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = x @ rng.normal(size=(8, 1)).astype("float32") + 0.1 * rng.normal(size=(512, 1)).astype("float32")
    return x, y


def quickstart_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def quickstart(fast: Path, persistent: Path | None, epochs: int, callbacks=(), **params) -> tuple[keras.Model, dict]:
    """One run of the Quickstart: restart(), then fit to ``epochs`` with the checkpoint callback."""
    gp = {"epochs": epochs, "ckpt_directory": str(fast), **params}
    if persistent is not None:
        gp["ckpt_persistent_url"] = str(persistent)
    x, y = quickstart_data()
    model = quickstart_model()
    info = restart(gp, model, logger=None)
    ckpt = CandleCheckpointCallback(gp, logger=None)
    model.fit(
        x,
        y,
        validation_split=0.25,
        epochs=epochs,
        initial_epoch=info["epoch"] if info else 0,
        callbacks=[ckpt, *callbacks],
        verbose=0,
    )
    return model, (info or {})


def weights(model) -> list[np.ndarray]:
    return [np.asarray(v) for v in model.variables + model.optimizer.variables]


def differing(model, twin) -> list[int]:
    """Indices of the variables (weights, then optimizer) that are not bit-identical."""
    pairs = zip(weights(model), weights(twin), strict=True)
    return [i for i, (w, t) in enumerate(pairs) if not np.array_equal(w, t)]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_stale_fast_tier_resumes_from_the_newer_persistent_epoch_and_leaves_its_history(tmp_path: Path) -> None:
    """The issue's case: 3 epochs in A, A copied to B, A on to 6; a run on B resumes from P's epoch 6 (not B's
    3), P's epochs 4-6 are unchanged, and B's run to 8 ends bit-identical to an uninterrupted one."""
    a, b, p = tmp_path / "A", tmp_path / "B", tmp_path / "P"
    quickstart(a, p, 3)
    shutil.copytree(a, b, symlinks=True)
    quickstart(a, p, 6)
    # The epochs' files (P also holds the run's restarts.jsonl once a start of this process has written it).
    before = {k: v for k, v in tree(p).items() if k.startswith("epochs/") and k.split("/")[1] in ("004", "005", "006")}
    assert len(before) == 6  # epochs 4-6: archive and sidecar each
    model, info = quickstart(b, p, 8)
    assert info["epoch"] == 6
    log = (b / "ckpt.log").read_text()
    line = [x for x in log.splitlines() if "restart: tier:" in x]
    assert len(line) == 1 and "restart: tier: persistent:" in line[0]
    assert "epochs/006 (generation 6, epoch 6) is newer than the fast tier's epochs/003 (generation 3" in line[0]
    assert_log_example("campaigns.rst", line[0], "INFO restart: tier: persistent:")
    after = tree(p)
    assert {k: after[k] for k in before} == before
    assert {k.split("/")[1] for k in after if k.startswith("epochs/")} >= {"007", "008"}
    twin, _ = quickstart(tmp_path / "twin", None, 8)
    assert differing(model, twin) == []


class SignalAt(keras.callbacks.Callback):
    """Sends this process ``signum`` after batch ``batch`` of epoch ``epoch`` (0-based, Keras's numbering)."""

    def __init__(self, epoch: int, batch: int, signum: int) -> None:
        super().__init__()
        self.epoch, self.batch, self.signum, self.at = epoch, batch, signum, -1

    def on_epoch_begin(self, epoch, logs=None):
        self.at = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.at == self.epoch and batch == self.batch:
            os.kill(os.getpid(), self.signum)


def test_a_preemption_save_is_drained_before_fit_stops_and_the_log_says_so(tmp_path: Path) -> None:
    """SIGUSR1 mid-epoch 3 with ckpt_drain=preempt: the step checkpoint reaches P before fit returns, the
    preemption line says 'drained', and an empty fast tier resumes from it."""
    fast, p = tmp_path / "A", tmp_path / "P"
    params = {"ckpt_preempt_signals": "SIGUSR1", "ckpt_preempt_exit_code": "return", "ckpt_drain": "preempt"}
    quickstart(fast, p, 5, callbacks=[SignalAt(2, 4, signal.SIGUSR1)], **params)
    steps = sorted(os.listdir(p / "steps"))
    assert len(steps) == 1 and (p / "steps" / steps[0] / "ckpt-info.json").exists()
    assert not (p / "epochs").exists()  # ckpt_drain=preempt: the epochs stayed on the fast tier
    log = (fast / "ckpt.log").read_text()
    assert "and drained it to the persistent tier" in log
    assert f"drain: complete: steps/{steps[0]}" in log
    model, info = quickstart(tmp_path / "B", p, 5, **params)
    assert info["epoch"] == 2 and info["step"] == 6  # the signal after batch 5 is answered at the next step
    twin, _ = quickstart(tmp_path / "twin", None, 5)
    assert differing(model, twin) == []


def test_a_drain_that_cannot_finish_in_time_gives_exit_status_75_and_says_so(tmp_path: Path, monkeypatch) -> None:
    """A persistent tier slower than ckpt_drain_timeout: the preempted fit exits with 75, not 143, and the
    log says the save is NOT drained."""
    from candle_ckpt.storage.remote import PersistentTier

    real_put = PersistentTier.put

    def slow_put(self, *args, **kwargs):
        time.sleep(3.0)
        return real_put(self, *args, **kwargs)

    monkeypatch.setattr(PersistentTier, "put", slow_put)
    fast, p = tmp_path / "A", tmp_path / "P"
    params = {"ckpt_preempt_signals": "SIGUSR1", "ckpt_drain": "preempt", "ckpt_drain_timeout": 0.2}
    with pytest.raises(PreemptExit) as caught:
        quickstart(fast, p, 5, callbacks=[SignalAt(1, 2, signal.SIGUSR1)], **params)
    assert caught.value.code == DRAIN_INCOMPLETE_EXIT
    log = (fast / "ckpt.log").read_text()
    assert "drain: NOT complete after 0.2 s: steps/" in log
    assert "NOT drained to the persistent tier" in log and "exiting with status 75" in log
