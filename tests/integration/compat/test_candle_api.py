"""CANDLE's API names and parameter semantics: both generations, argument types, checkpointing off, verbose."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import keras
import numpy as np
import pytest
from candle_writer import build_model, compile_model, make_data
from locations import REPO

import candle_ckpt
from candle_ckpt import CandleCheckpointCallback, CandleCkpt, CandleCkptKeras, MultiGPUCheckpoint
from candle_ckpt.core.fs import read_link


def fit(model, callbacks, epochs: int, initial_epoch: int = 0) -> None:
    x, y = make_data()
    model.fit(
        x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0, callbacks=callbacks
    )


def test_the_gateway_reads_the_model_set_model_gave_a_callback() -> None:
    """Tripwire for keras/internals.callback_model (CandleCkptKeras.restart() restores set_model's model):
    None before set_model, then that very object, read without the ``model`` property."""
    from candle_ckpt.keras.internals import callback_model

    callback, model = keras.callbacks.Callback(), object()
    assert callback_model(callback) is None
    callback.set_model(model)
    assert callback_model(callback) is model


def test_develop_defaults_write_flat_layout_under_output_dir(tmp_path: Path) -> None:
    """CandleCkptKeras with ckpt_directory unset writes <output_dir>/ckpts/{epochs,best,last,lock}, no ckpts/ level."""
    params = {"epochs": 2, "output_dir": str(tmp_path / "out"), "ckpt_save_best_metric": "loss", "ckpt_directory": None}
    ckpt = CandleCkptKeras(params, verbose=False)
    model = compile_model(build_model())
    ckpt.set_model(model)
    assert ckpt.restart(model) is None
    fit(model, [ckpt], 2)
    root = tmp_path / "out" / "ckpts"
    assert sorted(os.listdir(root)) == ["best", "ckpt.log", "epochs", "last", "lock"]
    assert read_link(str(root / "last")) == "epochs/002"
    assert CandleCkpt is CandleCkptKeras


def test_develop_relative_ckpt_directory_is_under_output_dir(tmp_path: Path) -> None:
    """A relative ckpt_directory is joined to output_dir, as candle_lib does; an absolute one is kept."""
    out = tmp_path / "out"
    ckpt = CandleCkptKeras({"epochs": 1, "output_dir": str(out), "ckpt_directory": "mine"}, verbose=False)
    assert Path(ckpt.cfg.directory) == out / "mine" and ckpt.cfg.layout == "flat"
    ckpt = CandleCkptKeras({"epochs": 1, "output_dir": str(out), "ckpt_directory": str(tmp_path / "abs")})
    assert Path(ckpt.cfg.directory) == tmp_path / "abs"


def test_develop_restart_before_compile_resumes_bit_identical(tmp_path: Path) -> None:
    """CandleCkptKeras made first, restart(model) before compile(): weights at once, optimizer state when fit
    begins; training to the end matches an uninterrupted run bit for bit, and best tracking carries on."""
    params = {"epochs": 4, "output_dir": str(tmp_path), "ckpt_save_best_metric": "loss"}
    first = CandleCkptKeras(params, verbose=False)
    model = compile_model(build_model())
    fit(model, [first], 2)
    first.engine.store.close()

    ckpt = CandleCkptKeras(params, verbose=False)
    model = build_model(seed=7)
    ckpt.set_model(model)
    found = ckpt.restart(model)
    assert found["epoch"] == 2
    compile_model(model)
    fit(model, [ckpt], 4, initial_epoch=found["epoch"])
    reference = compile_model(build_model())
    fit(reference, [], 4)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.optimizer.variables, reference.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert ckpt.engine.resumed.epoch == 2 and ckpt.engine.policy.best.epoch == 4


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p, m: candle_ckpt.restart(p, {"epochs": 1}), r"model must be a Keras model; got a dict"),
        (lambda p, m: candle_ckpt.restart(m, p), r"gParameters must be a mapping .* got Sequential \(a model\?"),
        (lambda p, m: CandleCheckpointCallback(m), r"gParameters must be a mapping"),
        (lambda p, m: CandleCkptKeras(m), r"CandleCkptKeras\(gParameters\): gParameters must be the parameter dict"),
        (lambda p, m: CandleCkptKeras(p).restart(p), r"restart\(\): no model to restore: call ckpt.set_model"),
        (lambda p, m: CandleCkptKeras(p).set_model(p), r"set_model\(model\): model must be a Keras model; got a dict"),
    ],
    ids=["restart-dict-model", "restart-swapped", "callback-model", "ckptkeras-model", "uno-restart-params", "set"],
)
def test_wrong_argument_types_raise_typeerror_naming_the_argument(tmp_path: Path, call, match: str) -> None:
    """A dict where a model belongs, or a model where the parameters belong, is a TypeError naming the argument."""
    params = {"epochs": 1, "ckpt_directory": str(tmp_path / "save"), "output_dir": str(tmp_path)}
    with pytest.raises(TypeError, match=match):
        call(params, build_model())


@pytest.mark.parametrize("interval", [0, "0"])
@pytest.mark.parametrize("api", ["master", "develop"])
def test_save_interval_zero_writes_nothing_at_all(tmp_path: Path, monkeypatch, api: str, interval) -> None:
    """ckpt_save_interval=0 (the benchmarks' default config): restart, fit and report_final create no directory,
    no lock and no ckpt.log, in either generation."""
    monkeypatch.chdir(tmp_path)
    params = {"epochs": 2, "ckpt_save_interval": interval, "ckpt_save_best_metric": "loss", "output_dir": "."}
    model = build_model()
    if api == "master":
        assert candle_ckpt.restart(params, model, verbose=False) is None
        ckpt = CandleCheckpointCallback(params, verbose=False)
    else:
        ckpt = CandleCkptKeras(params, verbose=False)
        ckpt.set_model(model)
        assert ckpt.restart(model) is None
    fit(compile_model(model), [ckpt], 2)
    ckpt.report_final()
    assert os.listdir(tmp_path) == []


def test_best_metric_last_seeds_best_tracking(tmp_path: Path) -> None:
    """ckpt_best_metric_last is the value to beat: unbeatable (-1 for a loss) means no best link; 'inf' and
    'None' (strings from a config file) mean no best yet."""
    for seed, expect_best in ((-1.0, False), ("inf", True), ("None", True)):
        root = tmp_path / str(seed)
        params = {"epochs": 2, "ckpt_directory": str(root), "ckpt_save_best_metric": "loss"}
        params["ckpt_best_metric_last"] = seed
        cb = CandleCheckpointCallback(params, verbose=False)
        fit(compile_model(build_model()), [cb], 2)
        assert os.path.lexists(root / "ckpts" / "best") is expect_best, seed
        assert sorted(os.listdir(root / "ckpts" / "epochs")) == ["001", "002"]  # the interval still saves
        cb.engine.store.close()


def test_keep_mode_all_keeps_every_checkpoint(tmp_path: Path) -> None:
    """ckpt_keep_mode=all keeps every checkpoint whatever ckpt_keep_limit says."""
    params = {"epochs": 4, "ckpt_directory": str(tmp_path), "ckpt_save_best_metric": "loss"}
    cb = CandleCheckpointCallback(params | {"ckpt_keep_mode": "all", "ckpt_keep_limit": 1}, verbose=False)
    fit(compile_model(build_model()), [cb], 4)
    assert sorted(os.listdir(tmp_path / "ckpts" / "epochs")) == ["001", "002", "003", "004"]


def test_verbose_false_keeps_console_quiet_but_ckpt_log_gets_info(tmp_path: Path, caplog) -> None:
    """After restart() (verbose=True by default, as in CANDLE), a verbose=False callback logs no INFO line to the
    console loggers, while ckpt.log gets every INFO line; verbose=True does reach the console logger."""
    params = {"epochs": 2, "ckpt_directory": str(tmp_path), "ckpt_save_best_metric": "loss"}
    model = build_model()
    with caplog.at_level(logging.INFO):
        candle_ckpt.restart(params, model)
        cb = CandleCheckpointCallback(params, verbose=False)
        fit(compile_model(model), [cb], 2)
        cb.report_final()
    console = [r.getMessage() for r in caplog.records if r.name.startswith("candle_ckpt") and r.levelno == logging.INFO]
    assert console and all(m.startswith("restart: ") for m in console), console  # restart() was verbose
    log = (tmp_path / "ckpt.log").read_text()
    assert "INFO epoch 1: saved 001" in log and "INFO report: 2 checkpoints" in log
    cb.engine.store.close()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        loud = CandleCheckpointCallback(params | {"epochs": 3}, verbose=True)
        fit(model, [loud], 3, initial_epoch=2)
    assert any("epoch 3: saved 003" in r.getMessage() for r in caplog.records if r.name == "candle_ckpt")


def test_multigpu_checkpoint_saves_the_inner_model(tmp_path: Path) -> None:
    """MultiGPUCheckpoint saves model.layers[-2] when that layer is a Model (Uno's template model)."""
    inner = build_model()
    outer = keras.Sequential([keras.Input((8,)), inner, keras.layers.Identity()])
    outer.compile(optimizer="adam", loss="mse")
    path = tmp_path / "inner.weights.h5"
    cb = MultiGPUCheckpoint(str(path), save_weights_only=True)
    fit(outer, [cb], 1)
    again = build_model(seed=3)
    again.load_weights(path)
    for a, b in zip(again.get_weights(), inner.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert cb.model is inner


def test_one_line_swap_into_an_existing_candle_module() -> None:
    """The documented one-liner puts candle_ckpt's checkpoint names into a ``candle`` module, leaving its others."""
    import types

    candle = types.ModuleType("candle")
    candle.finalize_parameters = len  # one of CANDLE's other utilities, untouched
    vars(candle).update({n: getattr(candle_ckpt, n) for n in candle_ckpt.CANDLE_NAMES})
    assert candle.restart is candle_ckpt.restart and candle.CandleCkptKeras is CandleCkptKeras
    assert candle.finalize_parameters is len


def test_cli_lists_a_flat_directory(tmp_path: Path) -> None:
    """``candle-ckpt list`` recognises a develop-generation (flat) directory by its epochs/ and lists it (one named
    ``ckpts`` keeps the existing hint to list its parent, which shows the same checkpoints)."""
    import json
    import subprocess
    import sys

    params = {"epochs": 2, "output_dir": str(tmp_path), "ckpt_directory": "mine", "ckpt_save_best_metric": "loss"}
    ckpt = CandleCkptKeras(params, verbose=False)
    fit(compile_model(build_model()), [ckpt], 2)
    ckpt.engine.store.close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "candle_ckpt", "list", str(tmp_path / "mine"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["last"] == 2 and [r["epoch"] for r in out["checkpoints"]] == [1, 2]


def test_develop_restart_takes_what_candle_lib_takes(tmp_path: Path) -> None:
    """ckpt.restart(params) (Uno) and ckpt.restart() restore set_model's model, with ckpt_restart_mode=off too;
    another model passed is not restored and one warning (said once) names both and the fix."""
    params = {"epochs": 2, "output_dir": str(tmp_path), "ckpt_save_best_metric": "loss"}
    first = CandleCkptKeras(params, verbose=False)
    trained = compile_model(build_model())
    fit(trained, [first], 2)
    first.close()
    assert CandleCkptKeras(params | {"ckpt_restart_mode": "off"}, verbose=False).restart(params) is None
    for arg in (params, None):
        ckpt, model = CandleCkptKeras(params, verbose=False), build_model(seed=7)
        ckpt.set_model(model)
        assert (ckpt.restart(params) if arg is not None else ckpt.restart())["epoch"] == 2
        for a, b in zip(model.get_weights(), trained.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
    ckpt, model, other = CandleCkptKeras(params, verbose=False), build_model(seed=7), build_model(seed=8)
    ckpt.set_model(model)
    before = [w.copy() for w in other.get_weights()]
    assert ckpt.restart(other)["epoch"] == 2 and ckpt.restart(other)["epoch"] == 2
    np.testing.assert_array_equal(model.get_weights()[0], trained.get_weights()[0])
    for a, b in zip(other.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    expected = (
        f"CandleCkptKeras.restart(model): the Sequential passed is not the model given to set_model() (Sequential "
        f"{model.name!r}); as in candle_lib, the set_model() one is restored and the one passed is not: call "
        "ckpt.set_model(model) first to restore that one"
    )
    log = (tmp_path / "ckpts" / "ckpt.log").read_text()
    assert log.count(expected) == 1, log


@pytest.mark.parametrize("api", ["master", "develop"])
def test_every_path_in_the_log_exists_under_both_layouts(tmp_path: Path, api: str) -> None:
    """Under the nested (master) and flat (develop) layouts, every path that ckpt.log names exists: saves, the
    resume, the optimizer state applied when fit starts, and the warning about optimizer state never applied."""
    import gc
    import re

    params = {"epochs": 3, "output_dir": str(tmp_path), "ckpt_save_best_metric": "loss"}
    if api == "master":
        params["ckpt_directory"] = str(tmp_path / "save")

    def restart_before_compile(model):
        if api == "master":
            return candle_ckpt.restart(params, model, logger=None), CandleCheckpointCallback(params, logger=None)
        ckpt = CandleCkptKeras(params, logger=None)
        ckpt.set_model(model)
        return ckpt.restart(params), ckpt

    first = CandleCkptKeras(params, logger=None) if api == "develop" else CandleCheckpointCallback(params, logger=None)
    fit(compile_model(build_model()), [first], 2)
    model = build_model(seed=7)
    found, ckpt = restart_before_compile(model)
    fit(compile_model(model), [ckpt], 3, initial_epoch=found["epoch"])
    ckpt.close()
    lonely = build_model(seed=8)
    restart_before_compile(lonely)[1].close()  # and no fit ever applies its optimizer state
    del lonely
    gc.collect()
    log_path = tmp_path / ("save" if api == "master" else "ckpts") / "ckpt.log"
    lines = log_path.read_text().splitlines()
    named = [(m.group(0), line) for line in lines for m in re.finditer(re.escape(str(tmp_path)) + r"[^\s,;()']*", line)]
    assert any("never applied" in line for _, line in named) and any("resumed from" in line for _, line in named)
    assert any("optimizer state of" in line for _, line in named), lines
    missing = [(path, line) for path, line in named if not os.path.exists(path)]
    assert missing == []
