"""The job of the goodput benchmark: one process of a Keras 3 fit on JAX, restarted by ``bench_goodput.py``.

A 3 x Dense(1024) model with Adam (about 26 MB of state: weights and two moments), ``model.fit`` with its
defaults (``shuffle=True``) and validation data. Each contender restores as its documentation says, then fits
to ``--epochs``:

- ``none``: no checkpointing (every launch starts from scratch);
- ``backup``: ``keras.callbacks.BackupAndRestore(dir)`` (it restores itself in ``fit``);
- ``orbax``: ``keras.callbacks.OrbaxCheckpoint(dir)``, resumed as Keras's guide shows: ``model.load_weights(dir)``
  (the newest step) and ``initial_epoch`` = that step + 1 (the callback saves epoch ``e`` as step ``e``);
- ``candle``: ``candle_ckpt.restart(params, model)`` and ``CandleCheckpointCallback(params)``, nothing set but
  the directory and the epochs;
- ``candle-mtbf``: the same with ``ckpt_mtbf`` given (``--mtbf``: the schedule's mean interval), as an operator
  who knows the cluster's failure rate sets it: the first process is covered before any failure is recorded;
- ``write``: no checkpointer, only a floor: at every epoch end every weight and optimizer variable is written to
  one file and fsynced (:class:`BareWrite`), the least an epoch checkpoint that survives a power cut can cost. It
  restores nothing; the benchmark runs it uninterrupted only, for the overhead.

It timestamps itself (``time.time()``) into ``--events``, one JSON object a line, the same way for every
contender: ``t0`` (its first line, before any import), ``built`` (model built and compiled: the restore
begins), ``restored`` (the restore done: for ``backup`` at ``fit``'s ``on_train_begin``, after its restore),
``first`` (the first train batch's end), ``epoch`` (each epoch's end), ``steps`` (batch ends, in groups) and
``done`` (with a SHA-256 of every weight and optimizer variable).
"""

import time

T0 = time.time()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

WIDTH, FEATURES, OUTPUTS, BATCH = 1024, 64, 8, 32


class Events:
    """Appends one JSON object a line to a file, flushed at once (a SIGKILL loses nothing written)."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 (open for the life of the process)

    def write(self, event: str, **fields) -> None:
        self.f.write(json.dumps({"ev": event, "t": fields.pop("t", None) or time.time(), **fields}) + "\n")


class Probe(keras.callbacks.Callback):
    """Timestamps the restore's end, every batch end (as optimizer steps done) and every epoch end; last in the
    list. Its batch hook makes Keras dispatch batch ends on the training thread for every contender alike."""

    def __init__(self, events: Events, steps: int) -> None:
        super().__init__()
        self.events, self.steps_per_epoch = events, steps
        self.step, self.buffer, self.first_epoch, self.first_seen = 0, [], None, False

    def on_train_begin(self, logs=None) -> None:
        self.step = int(self.model.optimizer.iterations) if self.model.optimizer.built else 0
        self.events.write("restored", optimizer_step=self.step)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        if self.first_epoch is None:  # a contender that restores no optimizer step still resumes at an epoch
            self.first_epoch = epoch
            self.step = max(self.step, epoch * self.steps_per_epoch)
            self.events.write("resumed", epoch=epoch, step=self.step)

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.step += 1
        now = time.time()
        if not self.first_seen:
            self.first_seen = True
            self.events.write("first", t=now, step=self.step)
        self.buffer.append([now, self.step])
        if len(self.buffer) >= 8:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.events.write("steps", steps=self.buffer)
            self.buffer = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.flush()
        self.events.write("epoch", epoch=epoch, step=self.step)


class BareWrite(keras.callbacks.Callback):
    """The floor of an epoch checkpoint: the state's bytes written to one file and fsynced, at every epoch end."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "state.bin")

    def on_epoch_end(self, epoch, logs=None) -> None:
        with open(self.path, "wb") as f:
            for v in list(self.model.weights) + list(self.model.optimizer.variables):
                f.write(np.ascontiguousarray(keras.ops.convert_to_numpy(v.value)).data)
            f.flush()
            os.fsync(f.fileno())


def data(steps: int) -> tuple:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, FEATURES)).astype("float32")
    y = np.tanh(x[:, :OUTPUTS] * 2.0).astype("float32")
    xv = rng.standard_normal((4 * BATCH, FEATURES)).astype("float32")
    return x, y, (xv, np.tanh(xv[:, :OUTPUTS] * 2.0).astype("float32"))


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((FEATURES,))]
        + [keras.layers.Dense(WIDTH, activation="relu") for _ in range(3)]
        + [keras.layers.Dense(OUTPUTS)]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    return model


def restore(
    contender: str, model: keras.Model, directory: str, epochs: int, mtbf: float | None = None
) -> tuple[int, list]:
    """The contender's documented restore; ``(initial_epoch, callbacks)``."""
    if contender == "backup":
        return 0, [keras.callbacks.BackupAndRestore(directory)]
    if contender == "orbax":
        steps = [int(n) for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) else []
        if steps:
            model.load_weights(directory)  # Keras reads the newest step of an Orbax directory
        return (max(steps) + 1 if steps else 0), [keras.callbacks.OrbaxCheckpoint(directory)]
    if contender in ("candle", "candle-mtbf"):
        import candle_ckpt

        params = {"ckpt_directory": directory, "epochs": epochs}
        if mtbf is not None:
            params["ckpt_mtbf"] = mtbf
        info = candle_ckpt.restart(params, model)
        return (info["epoch"] if info else 0), [candle_ckpt.CandleCheckpointCallback(params)]
    if contender == "write":
        return 0, [BareWrite(directory)]
    return 0, []


def digests(model: keras.Model) -> dict[str, str]:
    out = {}
    for v in list(model.weights) + list(model.optimizer.variables):
        out[v.path] = hashlib.sha256(np.ascontiguousarray(keras.ops.convert_to_numpy(v.value)).tobytes()).hexdigest()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--contender", choices=["none", "backup", "orbax", "candle", "candle-mtbf", "write"], required=True
    )
    parser.add_argument("--mtbf", type=float, default=None, help="candle-mtbf: ckpt_mtbf in seconds")
    parser.add_argument("--dir", required=True, help="the checkpoint directory")
    parser.add_argument("--events", required=True, help="the JSON-lines file of timestamps")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="train steps per epoch")
    args = parser.parse_args()
    events = Events(args.events)
    events.write("t0", t=T0, pid=os.getpid())
    x, y, val = data(args.steps)
    model = build()
    events.write("built")
    initial_epoch, callbacks = restore(args.contender, model, args.dir, args.epochs, args.mtbf)
    probe = Probe(events, args.steps)  # "restored": at fit's on_train_begin, for every contender (see the docs)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=args.epochs,
        initial_epoch=initial_epoch,
        validation_data=val,
        callbacks=[*callbacks, probe],
        verbose=0,
    )
    variables = list(model.weights) + list(model.optimizer.variables)
    state = sum(keras.ops.convert_to_numpy(v.value).nbytes for v in variables)
    events.write("done", digests=digests(model), state_bytes=state, step=probe.step)


if __name__ == "__main__":
    main()
