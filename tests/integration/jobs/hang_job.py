"""A small Keras 3 job (JAX) that hangs on demand, run by ``test_hang.py`` in fresh processes.

``python hang_job.py DIR OUT [--block KIND] [--at EPOCH] [--timeout S] [--candle-lib]``: ``restart()``, then ``fit`` of
``EPOCHS`` epochs over a ``PyDataset`` of ``BATCHES`` batches, a checkpoint every epoch, ``ckpt_hang_timeout=S``
(default: auto). ``--block input``: the dataset's third batch of epoch ``EPOCH`` (1-based) never comes (a
read that blocks for good); ``--block save``: the file system stops answering in the save of epoch ``EPOCH``
(``LocalFS.hook`` blocks at the first file created); ``--block restore``: the file system stops answering in
``restart()`` under the checkpoints (every open of a file in ``ckpts/epochs`` or
``ckpts/steps`` never returns, as when the storage targets that hold them hang); ``--block mount``: the whole
directory stops answering in ``restart()`` (every open, stat, listing, creation, rename or removal of a path in it
never returns, as on a hung NFS mount; ckpt.log and the restart history are on it too); ``--block fit-mount``: the
same from after ``restart()``, before ``fit``. ``--candle-lib``: candle_lib's order, as Uno's (``CandleCkptKeras``
made first, ``set_model``, ``ckpt.restart(params)``; its flat layout). Before it blocks the job prints
``blocking``; it prints ``restarting`` right before ``restart()``. At the end
it writes the final weights and optimizer variables to ``OUT`` (``.npz``) and prints ``done``.
"""

from __future__ import annotations

import argparse
import os
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "jax")

EPOCHS, BATCHES, BATCH = 5, 6, 16
FOREVER = threading.Event()  # never set: what a stuck read waits on


def say(message: str) -> None:
    """One progress line straight to fd 1 (no buffer to lose at os._exit)."""
    os.write(1, (message + "\n").encode())


# What a path's access goes through in Python (a hung mount blocks each of them; pathlib and os.path call these).
OS_CALLS = ("open", "stat", "lstat", "listdir", "scandir", "mkdir", "rmdir", "unlink", "rename", "replace",
            "symlink", "link", "readlink", "access", "utime", "chmod")  # fmt: skip


def stuck_paths(inside: tuple[str, ...], calls: tuple[str, ...] = ("open",)) -> None:
    """From now on every ``open`` and ``os.<call>`` of a path in one of the directories ``inside`` (each ending in
    a separator; the directory itself is not in it) blocks for good."""
    import builtins  # noqa: PLC0415

    def check(path) -> None:
        if isinstance(path, str | bytes | os.PathLike) and os.path.abspath(os.fsdecode(path)).startswith(inside):
            say("blocking")
            FOREVER.wait()

    def blocking(real):
        def call(path, *args, **kwargs):
            check(path)
            return real(path, *args, **kwargs)

        return call

    builtins.open = blocking(builtins.open)
    for name in calls:
        setattr(os, name, blocking(getattr(os, name)))


def stuck_checkpoint_reads(directory: str) -> None:
    """From now on every open of a file under ``directory``'s ``ckpts/epochs`` and ``ckpts/steps`` blocks for good
    (the storage that holds the checkpoints stopped answering; the restart history and ckpt.log still answer)."""
    stuck_paths(tuple(os.path.join(os.path.abspath(directory), "ckpts", kind) + os.sep for kind in ("epochs", "steps")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("out")
    parser.add_argument("--block", choices=("input", "save", "restore", "mount", "fit-mount"))
    parser.add_argument("--candle-lib", action="store_true")
    parser.add_argument("--at", type=int, default=3)
    parser.add_argument("--timeout", default="auto")
    args = parser.parse_args()

    import keras
    import numpy as np

    import candle_ckpt
    from candle_ckpt.core.fs import LocalFS

    state = {"epoch": 0}

    class Data(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__()
            rng = np.random.RandomState(0)
            self.x = rng.rand(BATCHES * BATCH, 8).astype("float32")
            self.y = rng.rand(BATCHES * BATCH, 1).astype("float32")

        def __len__(self) -> int:
            return BATCHES

        def __getitem__(self, i: int):
            if args.block == "input" and state["epoch"] == args.at and i == 2:
                say("blocking")
                FOREVER.wait()
            return self.x[i * BATCH : (i + 1) * BATCH], self.y[i * BATCH : (i + 1) * BATCH]

    class StuckFS(LocalFS):
        # The save of epoch EPOCH is the first to create a file after epoch EPOCH - 1 is renamed into place (its
        # write may run on the background writer while training is in epoch EPOCH + 1: ckpt_async=auto).
        def hook(self, op: str, path: str) -> None:
            if op == "rename" and path.endswith(os.path.join("epochs", f"{args.at - 1:03d}")):
                state["before_saved"] = True
            elif args.block == "save" and state.get("before_saved") and op == "create":
                say("blocking")
                FOREVER.wait()

    class Epochs(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None) -> None:
            state["epoch"] = epoch + 1

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    params = {
        "epochs": EPOCHS,
        "ckpt_directory": args.directory,
        "ckpt_save_interval": 1,
        "ckpt_save_best_metric": "loss",
    }
    params["ckpt_hang_timeout"] = args.timeout
    directory = os.path.abspath(args.directory)
    if args.block == "restore":
        stuck_checkpoint_reads(directory)
    elif args.block == "mount":  # the directory's own entries and everything under them
        stuck_paths((directory + os.sep,), OS_CALLS)
    if args.candle_lib:  # candle_lib's order, as Uno's: the callback first (it opens the directory), then restart()
        ckpt = candle_ckpt.CandleCkptKeras(params, logger=None, fs=StuckFS())
        ckpt.set_model(model)
        say("restarting")
        found = ckpt.restart(params)
    else:
        say("restarting")
        found = candle_ckpt.restart(params, model, logger=None)
        ckpt = candle_ckpt.CandleCheckpointCallback(params, logger=None, fs=StuckFS())
    start = found["epoch"] if found else 0
    if args.block == "fit-mount":  # the mount stops answering after restart(), before fit takes the writer lock
        stuck_paths((directory + os.sep,), OS_CALLS)
    say(f"start {start}")
    model.fit(Data(), epochs=EPOCHS, initial_epoch=start, verbose=0, callbacks=[Epochs(), ckpt])
    arrays = {f"w{i}": np.asarray(v) for i, v in enumerate(model.get_weights())}
    arrays.update({f"opt{i}": np.asarray(v) for i, v in enumerate(model.optimizer.variables)})
    np.savez(args.out, **arrays)
    say("done")


if __name__ == "__main__":
    main()
