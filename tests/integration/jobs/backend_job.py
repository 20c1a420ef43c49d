"""A training job the backend tests run in a fresh process, under the backend in ``$KERAS_BACKEND``.

Usage::

    python backend_job.py train DIR EPOCHS OUT.npz [--kill-in EPOCH] [--no-shuffle]
        restart() from DIR, then fit to EPOCHS with fit's defaults (shuffle=True)
        and an unseeded Dropout, checkpointing every epoch; save the final
        weights and optimizer variables to OUT.npz. With --kill-in E the
        process sends itself SIGKILL in the middle of epoch E (after epoch E-1
        was committed).
    python backend_job.py save DIR OUT.npz
        train 2 epochs (no Dropout), checkpoint them, save the final state to OUT.npz.
    python backend_job.py load DIR OUT.npz
        restart() a fresh model from DIR and save its weights and optimizer
        variables to OUT.npz.
    python backend_job.py snapshot
        check that a sync host snapshot aliases the variables and an async one
        owns its arrays while training goes on.
    python backend_job.py no-tf DIR
        with ``import tensorflow`` (and tf_keras) made to fail, use the
        callback, restart(), JobRunner, load_weights and the CLI; print
        ``NO-TF OK`` and the backend.

With ``CANDLE_TEST_BLOCK_TF=1`` in the environment any command runs with
TensorFlow blocked (a meta-path finder that raises ImportError).
"""

from __future__ import annotations

import importlib.abc
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BLOCKED = ("tensorflow", "tf_keras")


class BlockTensorFlow(importlib.abc.MetaPathFinder):
    """Make ``import tensorflow`` fail as if TensorFlow were not installed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the test)", name=fullname)
        return None


if os.environ.get("CANDLE_TEST_BLOCK_TF") == "1":
    sys.meta_path.insert(0, BlockTensorFlow())

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resume_job import make_data, state_arrays  # noqa: E402  (the same data as the TF resume tests)


def build_model(*, dropout: bool = True):
    """Dense 8 -> 16 -> Dropout(0.3, no seed) -> 1 with Adam, seeded by ``set_random_seed(1)``."""
    import keras

    keras.utils.set_random_seed(1)
    layers = [keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden")]
    if dropout:
        layers.append(keras.layers.Dropout(0.3))
    layers.append(keras.layers.Dense(1, name="out"))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    return model


def _killer(epoch: int):
    import keras

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None) -> None:
            if self.epoch == epoch - 1 and batch == 1:
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_begin(self, e, logs=None) -> None:
            self.epoch = e

    return Kill()


def train(directory: str, epochs: int, out: str, kill_in: int | None, shuffle: bool) -> None:
    import numpy as np

    import candle_ckpt as candle

    params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_best_metric": "loss"}
    model = build_model()
    found = candle.restart(params, model, verbose=False)
    start = found["epoch"] if found else 0
    callbacks = [candle.CandleCheckpointCallback(params, verbose=False)]
    if kill_in is not None:
        callbacks.append(_killer(kill_in))
    x, y = make_data()
    model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=start, shuffle=shuffle, verbose=0, callbacks=callbacks)
    np.savez(out, **state_arrays(model))
    print(f"initial_epoch={start}", flush=True)


def save(directory: str, out: str) -> None:
    import numpy as np

    import candle_ckpt as candle

    params = {"ckpt_directory": directory, "epochs": 2, "ckpt_save_best_metric": "loss"}
    model = build_model(dropout=False)
    x, y = make_data()
    model.fit(
        x, y, batch_size=16, epochs=2, verbose=0, callbacks=[candle.CandleCheckpointCallback(params, verbose=False)]
    )
    np.savez(out, **state_arrays(model))
    print("saved", flush=True)


def load(directory: str, out: str) -> None:
    import numpy as np

    import candle_ckpt as candle

    model = build_model(dropout=False)
    found = candle.restart({"ckpt_directory": directory, "ckpt_restart_mode": "required"}, model, verbose=False)
    np.savez(out, **state_arrays(model))
    print(f"loaded epoch={found['epoch']}", flush=True)


def snapshot() -> None:
    """A sync snapshot aliases the variables (no copy); an async one owns its arrays across train steps."""
    import keras
    import numpy as np

    from candle_ckpt.keras.state import ModelState

    model = build_model()
    x, y = make_data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    state = ModelState(model)
    kernel = model.layers[0].kernel.value
    pointer = kernel.unsafe_buffer_pointer() if keras.backend.backend() == "jax" else kernel.data_ptr()
    views = state.snapshot(copy=False).arrays()
    assert pointer in [v.__array_interface__["data"][0] for v in views], "the sync snapshot copied the kernel"
    assert not any(v.flags.writeable for v in views)
    snap = state.snapshot(copy=True)
    before = [a.copy() for a in snap.arrays()]
    assert pointer not in [a.__array_interface__["data"][0] for a in snap.arrays()]
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert not np.array_equal(model.layers[0].kernel.numpy(), before[0]), "training changed nothing"
    assert all(np.array_equal(a, b) for a, b in zip(snap.arrays(), before, strict=True))
    print(f"SNAPSHOT OK {len(before)} arrays", flush=True)


def no_tf(directory: str) -> None:
    """Every public entry point once, with TensorFlow blocked."""
    sys.meta_path.insert(0, BlockTensorFlow())
    import keras
    import numpy as np

    import candle_ckpt as candle
    from candle_ckpt.cli.main import main as cli

    x, y = make_data()
    params = {"ckpt_directory": os.path.join(directory, "fit"), "epochs": 2, "ckpt_save_best_metric": "loss"}
    model = build_model()
    model.fit(
        x, y, batch_size=16, epochs=2, verbose=0, callbacks=[candle.CandleCheckpointCallback(params, verbose=False)]
    )
    again = build_model()
    assert candle.restart(params, again, verbose=False)["epoch"] == 2
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), again.get_weights(), strict=True))
    fresh = build_model()
    stats = candle.load_weights(fresh, 2, ["hidden"], directory=params["ckpt_directory"])
    assert stats["layers"] == ["hidden"], stats
    net = build_model(dropout=False)
    runner = candle.JobRunner(
        {"ckpt_directory": os.path.join(directory, "runner"), "epochs": 2, "ckpt_save_best_metric": "loss"},
        epoch_fn=lambda epoch: {"loss": float(net.train_on_batch(x, y))},
        objects={"model": net},
        verbose=False,
    )
    runner.train()
    assert cli(["verify", params["ckpt_directory"]]) == 0
    assert cli(["list", os.path.join(directory, "runner")]) == 0
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print(f"NO-TF OK backend={keras.backend.backend()}", flush=True)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "train":
        kill = int(args[args.index("--kill-in") + 1]) if "--kill-in" in args else None
        train(args[0], int(args[1]), args[2], kill, "--no-shuffle" not in args)
    elif command == "save":
        save(args[0], args[1])
    elif command == "load":
        load(args[0], args[1])
    elif command == "snapshot":
        snapshot()
    elif command == "no-tf":
        no_tf(args[0])
    else:
        raise SystemExit(f"unknown command {command!r}")
