"""What a user of ``CandleCheckpointCallback`` and ``restart()`` sees, with a real ``model.fit``.

Each "run" of a job inside this test process is separated by :func:`_new_run`,
which drops this process's writer lock and the record ``restart()`` leaves for
the callback, exactly as a new process would start without them. The
acceptance test also resumes in a genuinely fresh process (``resume_job.py``).
"""

from __future__ import annotations

import os

from locations import REPO, job_script

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

import importlib.util  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import select  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import candle_ckpt as candle  # noqa: E402
from candle_ckpt.core.errors import DirectoryLocked, NoValidCheckpoint  # noqa: E402
from candle_ckpt.core.retention import KeepExponential  # noqa: E402

JOB_SCRIPT = job_script("resume_job.py")

_spec = importlib.util.spec_from_file_location("_resume_job", JOB_SCRIPT)
job = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(job)

CANDLE_KEYS = (
    "epoch",
    "save_best_metric",
    "best_metric_last",
    "model_file",
    "checksum",
    "timestamp",
    "time_elapsed",
    "metadata",
)


# -- helpers ---------------------------------------------------------------------------
def _params(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """gParameters checkpointing into ``<tmp_path>/save``, best judged on ``loss``."""
    params = {"ckpt_directory": str(tmp_path / "save"), "epochs": 3, "ckpt_save_best_metric": "loss"}
    params.update(overrides)
    return params


def _new_run() -> None:
    """A new run of the job (the lock is the store's, restart()'s record travels on the model): nothing to forget."""


def _fit(model: keras.Model, epochs: int, callbacks: list, initial_epoch: int = 0) -> keras.callbacks.History:
    x, y = job.make_data()
    return model.fit(
        x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0, callbacks=callbacks
    )


def _ckpts(params: dict[str, Any]) -> Path:
    return Path(params["ckpt_directory"]) / "ckpts"


def _epochs_on_disk(params: dict[str, Any]) -> list[int]:
    return sorted(int(p.name) for p in (_ckpts(params) / "epochs").iterdir())


def _sidecar(params: dict[str, Any], epoch: int) -> dict[str, Any]:
    return json.loads((_ckpts(params) / "epochs" / f"{epoch:03d}" / "ckpt-info.json").read_text())


def _assert_states_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


class _Scripted(keras.callbacks.Callback):
    """Puts a scripted metric into the epoch logs (placed before the checkpoint callback)."""

    def __init__(self, name: str, values: list[float]) -> None:
        super().__init__()
        self.name, self.values = name, values

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        logs[self.name] = self.values[epoch]


def _reference(epochs: int, dropout: bool = False) -> dict[str, np.ndarray]:
    model = job.build_model(dropout=dropout)
    _fit(model, epochs, [])
    return job.state_arrays(model)


# -- bit-identical resume -------------------------------------------------------------------
def test_resume_in_a_fresh_process_is_bit_identical(tmp_path):
    """3 epochs here, restart() in a new process, go on to 6: weights and Adam state equal an uninterrupted run."""
    want = _reference(6)
    params = job.job_params(str(tmp_path / "save"), 6)
    model = job.build_model()
    _fit(model, 3, [candle.CandleCheckpointCallback(params, verbose=False)])  # "preempted" after 3 of 6
    _new_run()
    out = tmp_path / "final.npz"
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, str(JOB_SCRIPT), "train", params["ckpt_directory"], "6", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "initial_epoch=3" in proc.stdout
    with np.load(out) as got:
        _assert_states_equal(dict(got), want)
    assert _epochs_on_disk(params) == [1, 2, 3, 4, 5, 6]


def test_resume_in_process_is_bit_identical(tmp_path):
    """Restarting a fresh model in the same process from epoch 3 and training to 6 equals 6 uninterrupted epochs."""
    want = _reference(6)
    params = job.job_params(str(tmp_path / "save"), 6)
    _fit(job.build_model(), 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    _new_run()
    model = job.build_model()
    found = candle.restart(params, model, verbose=False)
    assert found["epoch"] == 3
    _fit(model, 6, [candle.CandleCheckpointCallback(params, verbose=False)], initial_epoch=found["epoch"])
    _assert_states_equal(job.state_arrays(model), want)


def test_dropout_model_resume_is_bit_identical(tmp_path):
    """With Dropout, restart() also restores the SeedGenerator state, so the resumed run is bit-identical.

    Keras keeps a Dropout layer's RNG state in a SeedGenerator variable that
    ``save_weights`` (and so ``model.weights.h5``) does not contain; it goes to
    ``model.extra.npz``. Without it the resumed run would draw the first
    dropout masks again.
    """
    want = _reference(6, dropout=True)
    params = job.job_params(str(tmp_path / "save"), 6)
    model = job.build_model(dropout=True)
    _fit(model, 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    rng_state = model.layers[1].seed_generator.state.numpy()
    assert (_ckpts(params) / "last" / "model.extra.npz").is_file()
    _new_run()
    resumed = job.build_model(dropout=True)
    fresh_state = resumed.layers[1].seed_generator.state.numpy()
    assert not np.array_equal(fresh_state, rng_state)  # a fresh model starts from the seed
    candle.restart(params, resumed, verbose=False)
    np.testing.assert_array_equal(resumed.layers[1].seed_generator.state.numpy(), rng_state)
    _fit(resumed, 6, [], initial_epoch=3)
    _assert_states_equal(job.state_arrays(resumed), want)


# -- the optimizer trap and stock Keras loaders ----------------------------------------------------
def test_stock_load_weights_skips_the_optimizer_but_restart_restores_it(tmp_path):
    """Stock load_weights into a fresh model leaves Adam at iteration 0; restart() restores iterations and moments."""
    params = _params(tmp_path)
    trained = job.build_model()
    _fit(trained, 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    weights_file = _ckpts(params) / "last" / "model.keras"  # load_weights reads a .keras too

    stock = job.build_model()
    with pytest.warns(UserWarning, match="Skipping variable loading for optimizer"):
        stock.load_weights(weights_file)
    assert int(stock.optimizer.iterations.numpy()) == 0

    _new_run()
    restored = job.build_model()
    candle.restart(params, restored, verbose=False)
    assert int(restored.optimizer.iterations.numpy()) == 12  # 3 epochs x 4 batches
    assert len(restored.optimizer.variables) == len(trained.optimizer.variables) == 10
    for got, want in zip(restored.optimizer.variables, trained.optimizer.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=want.path)


def test_checkpoint_files_load_with_stock_keras(tmp_path):
    """ckpts/last/model.keras, the one state file, loads with model.load_weights and keras.models.load_model."""
    params = _params(tmp_path, ckpt_save_weights_only=False)
    trained = job.build_model()
    _fit(trained, 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    last = _ckpts(params) / "last"
    names = sorted(p.name for p in last.iterdir())
    assert names == ["ckpt-info.json", "model.keras", "train.state.npz"]  # the model state written once (+ issue 11)

    fresh = job.build_model(seed=99)
    with pytest.warns(UserWarning, match="Skipping variable loading for optimizer"):  # the trap, see above
        fresh.load_weights(last / "model.keras")
    for got, want in zip(fresh.get_weights(), trained.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)

    loaded = keras.models.load_model(last / "model.keras")
    x, _ = job.make_data()
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), trained.predict(x, verbose=0))
    assert int(loaded.optimizer.iterations.numpy()) == 12


def test_weights_only_writes_no_keras_archive(tmp_path):
    """With ckpt_save_weights_only=True no epoch directory holds a model.keras."""
    params = _params(tmp_path, ckpt_save_weights_only=True)
    _fit(job.build_model(), 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    for epoch in (1, 2, 3):
        names = sorted(p.name for p in (_ckpts(params) / "epochs" / f"{epoch:03d}").iterdir())
        assert names == ["ckpt-info.json", "model.weights.h5", "train.state.npz"]


# -- save policy -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("epochs", "skip", "interval", "expected"),
    [
        (7, 4, 2, [4, 6, 7]),  # nothing before skip_epochs; every 2nd; the final epoch always
        (3, 0, 5, [3]),  # interval longer than the run: only the final epoch
        (3, 0, 0, []),  # 0 disables saving, even the final epoch
    ],
)
def test_skip_epochs_and_save_interval_choose_the_saved_epochs(tmp_path, epochs, skip, interval, expected):
    """ckpt_skip_epochs and ckpt_save_interval decide which epochs are saved; the final one always is."""
    params = _params(tmp_path, epochs=epochs, ckpt_skip_epochs=skip, ckpt_save_interval=interval, ckpt_save_best=False)
    _fit(job.build_model(), epochs, [candle.CandleCheckpointCallback(params, verbose=False)])
    if interval == 0:  # checkpointing off: nothing at all is written, not even the directory
        assert not os.path.exists(params["ckpt_directory"])
        return
    assert _epochs_on_disk(params) == expected
    assert not os.path.lexists(_ckpts(params) / "best")
    if expected:
        assert os.readlink(_ckpts(params) / "last") == f"epochs/{expected[-1]:03d}"
    else:
        assert not os.path.lexists(_ckpts(params) / "last")


@pytest.mark.parametrize(
    ("metric", "mode", "values", "best", "resolved"),
    [
        ("val_accuracy", "auto", [0.5, 0.7, 0.6, 0.9, 0.8], 4, "max"),  # CANDLE started "max" metrics at +inf
        ("val_loss", "auto", [1.0, 0.5, 0.7, 0.4, 0.6], 4, "min"),
        ("my_score", "max", [0.1, 0.3, 0.2, 0.5, 0.4], 4, "max"),
    ],
)
def test_save_best_moves_the_relative_best_link(tmp_path, metric, mode, values, best, resolved):
    """The best link follows improvements of the metric in its direction and is a relative symlink into epochs/."""
    params = _params(
        tmp_path,
        epochs=5,
        ckpt_save_best=True,
        ckpt_save_best_metric=metric,
        ckpt_save_best_mode=mode,
        ckpt_save_interval=100,
    )
    _fit(job.build_model(), 5, [_Scripted(metric, values), candle.CandleCheckpointCallback(params, verbose=False)])
    assert _epochs_on_disk(params) == [1, 2, 4, 5]  # the three improvements and the final epoch
    ckpts = _ckpts(params)
    assert os.path.islink(ckpts / "best") and os.path.islink(ckpts / "last")
    assert os.readlink(ckpts / "best") == f"epochs/{best:03d}"
    assert os.readlink(ckpts / "last") == "epochs/005"
    assert (ckpts / "best").resolve() == (ckpts / "epochs" / f"{best:03d}").resolve()
    side = _sidecar(params, best)
    assert side["save_best_metric"] == metric
    assert side["best_metric_last"] == values[best - 1]
    assert side["save_best_mode"] == resolved
    assert _sidecar(params, 5)["best_epoch"] == best


def test_missing_best_metric_raises_listing_the_metrics_present(tmp_path):
    """With save_best on, a ckpt_save_best_metric absent from the logs raises ValueError listing the metrics present."""
    params = _params(tmp_path, ckpt_save_best=True, ckpt_save_best_metric="val_auc")
    callback = candle.CandleCheckpointCallback(params, verbose=False)
    with pytest.raises(ValueError, match=r"ckpt_save_best_metric 'val_auc' is not in the training logs.*present: loss"):
        _fit(job.build_model(), 3, [callback])
    assert _epochs_on_disk(params) == []


def test_missing_best_metric_is_fine_when_save_best_is_off(tmp_path):
    """With save_best off, an absent ckpt_save_best_metric is ignored and every epoch is saved."""
    params = _params(tmp_path, ckpt_save_best=False, ckpt_save_best_metric="val_auc")
    _fit(job.build_model(), 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    assert _epochs_on_disk(params) == [1, 2, 3]


# -- ckpt-info.json ----------------------------------------------------------------------------
def test_every_sidecar_has_candle_keys_sizes_and_crcs(tmp_path):
    """Each ckpt-info.json has CANDLE's keys plus size and CRC32 of every file, versions, logs and save speed."""
    params = _params(tmp_path, ckpt_save_weights_only=False, ckpt_metadata="run-42")
    _fit(job.build_model(), 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    for epoch in (1, 2, 3):
        directory = _ckpts(params) / "epochs" / f"{epoch:03d}"
        side = _sidecar(params, epoch)
        assert set(CANDLE_KEYS) <= set(side)
        assert side["epoch"] == epoch
        assert side["metadata"] == "run-42"
        assert side["model_file"] == "model.keras"
        assert side["schema_version"] == 1
        assert side["keras_version"] == keras.__version__
        assert side["backend"] == keras.backend.backend()
        assert set(side["logs"]) == {"loss"} and isinstance(side["logs"]["loss"], float)
        assert side["save_duration_s"] > 0 and side["save_mb_per_s"] > 0
        assert time.strptime(side["timestamp"], "%Y-%m-%dT%H:%M:%S%z")
        assert sorted(side["files"]) == ["model.keras", "train.state.npz"]
        for name, entry in side["files"].items():
            data = (directory / name).read_bytes()
            assert entry == {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}
        assert side["checksum"] == f"{zlib.crc32((directory / 'model.keras').read_bytes()):08x}"


def test_metadata_falls_back_to_candles_metadata_key(tmp_path):
    """Without ckpt_metadata, CANDLE's own metadata key is stored in ckpt-info.json."""
    params = _params(tmp_path, epochs=1, metadata="candle-benchmark-7")
    _fit(job.build_model(), 1, [candle.CandleCheckpointCallback(params, verbose=False)])
    assert _sidecar(params, 1)["metadata"] == "candle-benchmark-7"


# -- restart modes -----------------------------------------------------------------------------
def test_restart_off_returns_none_and_creates_nothing(tmp_path):
    """ckpt_restart_mode=off returns None and leaves the checkpoint directory absent."""
    params = _params(tmp_path, ckpt_restart_mode="off")
    assert candle.restart(params, job.build_model(), verbose=False) is None
    assert not os.path.lexists(params["ckpt_directory"])


def test_restart_off_ignores_existing_checkpoints(tmp_path):
    """ckpt_restart_mode=off leaves the model untouched even when checkpoints exist."""
    params = _params(tmp_path)
    _fit(job.build_model(), 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    _new_run()
    model = job.build_model()
    before = model.get_weights()
    assert candle.restart(dict(params, ckpt_restart_mode="off"), model, verbose=False) is None
    for got, want in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_restart_auto_with_an_empty_directory_returns_none(tmp_path):
    """ckpt_restart_mode=auto on an empty (or absent) directory returns None."""
    params = _params(tmp_path, ckpt_restart_mode="auto")
    assert candle.restart(params, job.build_model(), verbose=False) is None
    os.makedirs(params["ckpt_directory"])
    assert candle.restart(params, job.build_model(), verbose=False) is None


def test_restart_required_with_an_empty_directory_names_it(tmp_path):
    """ckpt_restart_mode=required on an empty directory raises NoValidCheckpoint naming the directory."""
    params = _params(tmp_path, ckpt_restart_mode="required")
    os.makedirs(params["ckpt_directory"])
    with pytest.raises(NoValidCheckpoint, match=re.escape(params["ckpt_directory"])):
        candle.restart(params, job.build_model(), verbose=False)


def test_restart_returns_the_sidecar_dict(tmp_path):
    """restart() returns the restored ckpt-info.json as a dict, with epoch = completed epochs."""
    params = _params(tmp_path)
    _fit(job.build_model(), 3, [candle.CandleCheckpointCallback(params, verbose=False)])
    _new_run()
    found = candle.restart(params, job.build_model(), verbose=False)
    on_disk = _sidecar(params, 3)
    on_disk.pop("sidecar_crc32")
    assert found == on_disk
    assert found["epoch"] == 3


def test_restart_epoch_rolls_back_and_the_new_lineage_wins(tmp_path):
    """ckpt_restart_epoch=2 restores exactly epoch 2; the retrained epoch 3 replaces the old one and becomes last."""
    params = _params(tmp_path, epochs=4)
    per_epoch: dict[int, list[np.ndarray]] = {}
    trained = job.build_model()
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: per_epoch.update({e + 1: trained.get_weights()})
    )
    _fit(trained, 4, [record, candle.CandleCheckpointCallback(params, verbose=False)])
    old_3 = _sidecar(params, 3)
    _new_run()

    model = job.build_model()
    found = candle.restart(dict(params, ckpt_restart_epoch=2), model, verbose=False)
    assert found["epoch"] == 2
    assert int(model.optimizer.iterations.numpy()) == 8
    for got, want in zip(model.get_weights(), per_epoch[2], strict=True):
        np.testing.assert_array_equal(got, want)

    _fit(model, 3, [candle.CandleCheckpointCallback(params, verbose=False)], initial_epoch=2)
    new_3 = _sidecar(params, 3)
    assert new_3["resumed_from"] == 2 and new_3["generation"] > old_3["generation"]
    assert os.readlink(_ckpts(params) / "last") == "epochs/003"
    _new_run()
    assert candle.restart(params, job.build_model(), verbose=False)["generation"] == new_3["generation"]


def test_restart_epoch_that_does_not_exist_names_the_key(tmp_path):
    """A ckpt_restart_epoch with no checkpoint raises NoValidCheckpoint naming ckpt_restart_epoch."""
    params = _params(tmp_path, epochs=2)
    _fit(job.build_model(), 2, [candle.CandleCheckpointCallback(params, verbose=False)])
    _new_run()
    with pytest.raises(NoValidCheckpoint, match=r"ckpt_restart_epoch=9"):
        candle.restart(dict(params, ckpt_restart_epoch=9), job.build_model(), verbose=False)


# -- bad parameters ----------------------------------------------------------------------------
BAD_PARAMS = [
    ({"ckpt_keep_limit": 0}, ValueError, r"ckpt_keep_limit must be an integer > 0; got 0"),
    ({"ckpt_keep_mode": "fibonacci"}, ValueError, r"ckpt_keep_mode must be one of 'linear', 'exponential'"),
    ({"ckpt_restart_mode": "maybe"}, ValueError, r"ckpt_restart_mode must be one of 'off', 'auto', 'required'"),
    ({"ckpt_save_interval": -1}, ValueError, r"ckpt_save_interval must be an integer >= 0 \(0 disables saving\)"),
    ({"ckpt_save_best": "perhaps"}, ValueError, r"ckpt_save_best must be a boolean"),
    ({"ckpt_skip_epochs": 1.5}, ValueError, r"ckpt_skip_epochs must be an integer"),
    ({"ckpt_keep_limit": [3]}, TypeError, r"ckpt_keep_limit must be an integer"),
    ({"ckpt_on_error": "ignore"}, ValueError, r"ckpt_on_error must be one of 'raise', 'warn'"),
    ({"ckpt_restart_epoch": -2}, ValueError, r"ckpt_restart_epoch must be an integer >= 0 or None; got -2"),
]


@pytest.mark.parametrize(("bad", "error", "message"), BAD_PARAMS)
def test_bad_parameters_are_refused_by_the_callback_and_restart(tmp_path, bad, error, message):
    """A bad ckpt_* value raises ValueError/TypeError naming the key in the callback and restart(), before any I/O."""
    params = _params(tmp_path, **bad)
    with pytest.raises(error, match=message):
        candle.CandleCheckpointCallback(params, verbose=False)
    with pytest.raises(error, match=message):
        candle.restart(params, job.build_model(), verbose=False)
    assert not os.path.lexists(params["ckpt_directory"])


def test_the_callback_requires_epochs(tmp_path):
    """The callback, like CANDLE's, refuses gParameters without epochs and says so."""
    params = _params(tmp_path)
    del params["epochs"]
    with pytest.raises(ValueError, match=r"epochs is required"):
        candle.CandleCheckpointCallback(params, verbose=False)
    assert not os.path.lexists(params["ckpt_directory"])


def test_values_given_as_strings_work(tmp_path):
    """Values read from a config file as strings ("True", "3") behave like the typed values."""
    params = _params(
        tmp_path,
        epochs="6",
        ckpt_save_interval="3",
        ckpt_save_best="False",
        ckpt_keep_limit="1",
        ckpt_checksum="True",
        ckpt_save_weights_only="true",
    )
    _fit(job.build_model(), 6, [candle.CandleCheckpointCallback(params, verbose=False)])
    assert _epochs_on_disk(params) == [6]  # saves at 3 and 6; keep_limit 1 pruned 3
    _new_run()
    found = candle.restart(dict(params, ckpt_restart_mode="required", ckpt_restart_epoch="6"), job.build_model())
    assert found["epoch"] == 6
    assert sorted(found["files"]) == ["model.weights.h5", "train.state.npz"]


# -- the directory -----------------------------------------------------------------------------
def test_a_directory_under_a_regular_file_fails_at_creation(tmp_path):
    """A ckpt_directory that cannot be created (its parent is a file) fails when the callback is made, naming it."""
    blocker = tmp_path / "afile"
    blocker.write_bytes(b"precious")
    params = _params(tmp_path, ckpt_directory=str(blocker / "save"))
    with pytest.raises(OSError, match=re.escape(str(blocker / "save"))) as raised:
        candle.CandleCheckpointCallback(params, verbose=False)
    assert f"{str(blocker)!r} is a file, not a directory" in str(raised.value)  # not os.mkdir's bare "File exists"
    assert blocker.read_bytes() == b"precious"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions; the file-as-parent case covers root")
def test_a_read_only_parent_fails_at_creation(tmp_path):
    """A ckpt_directory inside a read-only directory fails when the callback is made, naming it."""
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        params = _params(tmp_path, ckpt_directory=str(parent / "save"))
        with pytest.raises(OSError, match=re.escape(str(parent / "save"))):
            candle.CandleCheckpointCallback(params, verbose=False)
    finally:
        parent.chmod(0o700)


def _start_holder(directory: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen(
        [sys.executable, str(JOB_SCRIPT), "hold", directory],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "LOCKED":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the lock holder did not start: {line!r} {err[-2000:]}")
    return proc


def test_a_second_writer_is_refused_until_the_first_is_killed(tmp_path):
    """A live writer in another process makes the callback raise DirectoryLocked; after kill -9 a new one succeeds."""
    params = _params(tmp_path, epochs=1)
    holder = _start_holder(params["ckpt_directory"])
    try:
        with pytest.raises(DirectoryLocked, match=re.escape(params["ckpt_directory"]) + rf".*pid {holder.pid}"):
            candle.CandleCheckpointCallback(params, verbose=False)
    finally:
        holder.kill()  # SIGKILL: the holder never releases the lock itself
        holder.communicate()
    assert holder.returncode == -9
    assert (_ckpts(params) / "lock").exists()  # the stale lock file is still there
    _fit(job.build_model(), 1, [candle.CandleCheckpointCallback(params, verbose=False)])
    assert _epochs_on_disk(params) == [1]


# -- logging and reporting -----------------------------------------------------------------------
def test_several_callbacks_add_one_console_handler_and_one_log_line_per_save(tmp_path):
    """Creating several callbacks leaves one console handler on 'candle_ckpt', and ckpt.log gets one line per save."""
    params = _params(tmp_path)
    logger = logging.getLogger("candle_ckpt")
    before = len(logger.handlers)
    callbacks = [candle.CandleCheckpointCallback(params, verbose=True) for _ in range(3)]
    assert len(logger.handlers) <= before + 1
    assert sum(bool(getattr(h, "_candle_ckpt_console", False)) for h in logger.handlers) == 1
    _fit(job.build_model(), 3, [callbacks[-1]])
    lines = (Path(params["ckpt_directory"]) / "ckpt.log").read_text().splitlines()
    saved = [line for line in lines if re.search(r"epoch \d+: saved", line)]
    assert [re.search(r"epoch (\d+): saved", line).group(1) for line in saved] == ["1", "2", "3"]


def test_exponential_keep_mode_retains_what_keep_exponential_predicts(tmp_path):
    """Over 20 epochs, keep_mode exponential keeps exactly what KeepExponential picks after each save plus best/last."""
    values = [0.1, 0.2, 0.3, 0.4, 0.9] + [0.5] * 15  # best stays at epoch 5
    params = _params(
        tmp_path,
        epochs=20,
        ckpt_keep_mode="exponential",
        ckpt_keep_limit=100,
        ckpt_save_best_metric="val_accuracy",
    )
    _fit(
        job.build_model(),
        20,
        [_Scripted("val_accuracy", values), candle.CandleCheckpointCallback(params, verbose=False)],
    )

    policy, kept, best = KeepExponential(100), set(), None
    for epoch in range(1, 21):
        kept.add(epoch)
        if best is None or values[epoch - 1] > values[best - 1]:
            best = epoch
        protected = {epoch, best}
        kept = policy.select(kept, protected) | protected
    assert _epochs_on_disk(params) == sorted(kept)
    assert 5 in kept and len(kept) < 10
    assert os.readlink(_ckpts(params) / "best") == "epochs/005"
    assert os.readlink(_ckpts(params) / "last") == "epochs/020"


def test_report_final_and_stats(tmp_path):
    """report_final() appends a summary line to ckpt.log; stats() lists each save's duration and MB/s."""
    params = _params(tmp_path)
    callback = candle.CandleCheckpointCallback(params, verbose=False)
    _fit(job.build_model(), 3, [callback])
    callback.report_final()
    last_line = (Path(params["ckpt_directory"]) / "ckpt.log").read_text().splitlines()[-1]
    assert re.search(r"report: 3 checkpoints, .* MB/s\); last epoch 3; best loss=.* at epoch \d; errors 0", last_line)
    saves = callback.stats()["saves"]
    assert [s["epoch"] for s in saves] == [1, 2, 3]
    for rec in saves:
        side = _sidecar(params, rec["epoch"])
        assert rec["bytes"] == sum(e["size"] for e in side["files"].values())
        assert rec["save_s"] == side["save_duration_s"] > 0
        assert rec["mb_per_s"] == side["save_mb_per_s"] > 0
    assert callback.stats()["errors"] == []
    assert callback.stats()["async"] is True  # ckpt_async's default (auto): asynchronous, in one process too
