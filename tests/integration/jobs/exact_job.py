"""Training jobs written the ways real jobs are, run by ``test_exact_resume.py`` and ``test_custom_step.py``.

Served, like ``crash_job.py --serve``: the server imports Keras under ``$KERAS_BACKEND`` once, then for every line
``SETUP PHASE DIR OUT [async|sync] [steps]`` on stdin forks a child that runs one job (``steps``: a step
checkpoint after every step, written at once) and prints ``reaped <status>`` when it is gone. The server never
runs an op of its backend, so each child starts from a clean runtime.

A child seeds everything (``keras.utils.set_random_seed(1)``), builds the
model and the input of ``SETUP``, calls ``restart()`` and ``fit`` to
``EPOCHS`` with the checkpoint callback, and writes the final weights and
optimizer variables to ``OUT`` (``.npz``). In PHASE ``kill`` it sends
itself SIGKILL in the middle of epoch ``KILL_AT`` (after its second batch);
``full`` and ``resume`` run to the end.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

EPOCHS, KILL_AT, N, BATCH = 5, 3, 64, 16  # KILL_AT counts from 1
PYDATASETS = {"pydataset_np": "fresh", "pydataset_inplace": "protocol", "pydataset_shuffle_inplace": "bare"}
# The in-place shuffle read by two worker threads (PyDataset(workers=2)): on JAX and torch fit takes each epoch's
# first batches from those the workers fetched ahead in the epoch before. ``_over_cap``: none of them can be kept.
WORKERS = ("pydataset_workers", "pydataset_workers_over_cap")
# get_state/set_state, read by two forked processes (use_multiprocessing=True): each epoch's pool is forked mid-fit.
CUSTOM_STEP = ("vae", "gan", "jax_step")  # models of custom_step.py: a train_step of their own


_JOB: list[str] = []  # in a served job's child: the request id its lines carry


def say(message: str) -> None:
    """One progress line straight to fd 1 (nothing a kill could lose), led by the job's id when served."""
    os.write(1, (" ".join([*_JOB, message]) + "\n").encode())


def data():
    """64 seeded samples of 8 features, a target and sample weights."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1)) + 0.1 * rng.standard_normal((N, 1))).astype("float32")
    w = rng.uniform(0.5, 1.5, N).astype("float32")
    return x, y, w


def build_model(setup: str = ""):
    """Dense 8 -> 16 -> Dropout -> 1, built (Input layer), not compiled; ``custom_step.py``'s model for its
    setups."""
    import keras

    if setup in CUSTOM_STEP:
        import custom_step

        return custom_step.build(setup)

    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.2, seed=3),
            keras.layers.Dense(1),
        ]
    )


#: Setups whose optimizer or loss is not the plain Adam + mse of the others: what changes in ``compile``.
OPTIMIZERS = {
    "ema": {"use_ema": True, "ema_momentum": 0.9},  # weights replaced by their moving average when fit ends
    "grad_accum": {"gradient_accumulation_steps": 3},  # 3 does not divide an epoch's 4 steps: a partial sum saved
}


def set_policy(setup: str) -> None:
    """``mixed_float16`` for that setup (before the model is built; ``compile`` then wraps the optimizer in a
    ``LossScaleOptimizer`` with a dynamic loss scale), the default policy for the others."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16" if setup == "mixed_float16" else "float32")


def compile_model(model, setup: str = "") -> None:
    """Adam(1e-2) and mse, or what ``setup`` changes: the optimizer's options (:data:`OPTIMIZERS`), a learning
    rate schedule driven by the step count (``cosine_decay``), a classification loss (``class_weight``), two
    steps per call (``steps_per_execution``)."""
    import keras

    if setup in CUSTOM_STEP:
        import custom_step

        custom_step.compile_model(model)
        return
    rate = keras.optimizers.schedules.CosineDecay(1e-2, decay_steps=25) if setup == "cosine_decay" else 1e-2
    optimizer = keras.optimizers.Adam(rate, **OPTIMIZERS.get(setup, {}))
    loss = keras.losses.BinaryCrossentropy(from_logits=True) if setup == "class_weight" else "mse"
    per_call = 2 if setup == "steps_per_execution" else 1  # two steps per call: batch hooks after steps 2 and 4
    model.compile(optimizer=optimizer, loss=loss, jit_compile=False, steps_per_execution=per_call)


def make_pydataset(x, y, kind: str, **options):
    """A PyDataset reshuffling with ``np.random``: a fresh permutation (``fresh``), in place with
    get_state/set_state (``protocol``), or in place with nothing else (``bare``, most Keras examples); ``options``
    go to ``PyDataset.__init__`` (``workers``)."""
    import keras
    import numpy as np

    class Fresh(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(**options)
            self.index = np.arange(N)

        def __len__(self) -> int:
            return N // BATCH

        def __getitem__(self, i):
            rows = self.index[i * BATCH : (i + 1) * BATCH]
            return x[rows], y[rows]

        def on_epoch_end(self) -> None:
            self.index = np.random.permutation(N)

    class Bare(Fresh):
        def on_epoch_end(self) -> None:
            np.random.shuffle(self.index)  # depends on every earlier shuffle: needs its state saved

    class InPlace(Bare):
        def get_state(self) -> dict:
            return {"index": self.index.copy()}

        def set_state(self, state: dict) -> None:
            self.index = np.array(state["index"])

    class Endless(keras.utils.PyDataset):  # num_batches None: fit reads it with steps_per_epoch
        def __init__(self) -> None:
            super().__init__(**options)

        @property
        def num_batches(self):
            return None

        def __getitem__(self, i):  # pass p = i // (N // BATCH) over the data, in an order seeded by p
            p, k = divmod(i, N // BATCH)
            rows = np.random.default_rng(p).permutation(N)[k * BATCH : (k + 1) * BATCH]
            return x[rows], y[rows]

    return {"fresh": Fresh, "protocol": InPlace, "bare": Bare, "endless": Endless}[kind]()


def tf_dataset(x, y, *, repeat: bool = False, augment: bool = False):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=7, reshuffle_each_iteration=True)
    if augment:  # a stateless, seeded augmentation in a parallel map

        def jitter(i, xy):
            a, b = xy
            noise = tf.random.stateless_uniform(tf.shape(a), seed=tf.stack([i, tf.constant(5, tf.int64)]))
            return a + 0.01 * noise, b

        ds = ds.enumerate().map(jitter, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(BATCH).prefetch(2)


def fit_inputs(setup: str) -> dict:
    """The ``fit`` keyword arguments of ``setup``'s input."""
    x, y, w = data()
    args = {"x": x, "y": y, "batch_size": BATCH, "shuffle": True}
    if setup in ("vae", "gan"):  # the features alone: the model's train_step takes them as they come
        del args["y"]
    if setup == "tfdata_reshuffle":
        args = {"x": tf_dataset(x, y)}
    elif setup == "tfdata_repeat":
        args = {"x": tf_dataset(x, y, repeat=True), "steps_per_epoch": 3}
    elif setup == "tfdata_map_parallel":
        args = {"x": tf_dataset(x, y, augment=True)}
    elif setup in PYDATASETS:
        args = {"x": make_pydataset(x, y, PYDATASETS[setup])}
    elif setup in WORKERS:
        args = {"x": make_pydataset(x, y, "bare", workers=2)}
    elif setup in ("pydataset_endless", "pydataset_endless_workers"):  # 3 steps an epoch: not a pass's 4
        workers = {"workers": 2, "max_queue_size": 2} if setup.endswith("workers") else {}  # fewer than it reads
        args = {"x": make_pydataset(x, y, "endless", **workers), "steps_per_epoch": 3}
    elif setup == "pydataset_processes":
        args = {"x": make_pydataset(x, y, "protocol", workers=2, use_multiprocessing=True)}
    elif setup.startswith("grain"):  # grain_map, grain_repeat
        import grain_input

        args = grain_input.fit_inputs(x, y, BATCH, setup)
    elif setup == "sample_weights":
        args["sample_weight"] = w
    elif setup == "jax_step":
        args["validation_data"] = (x[:16], y[:16])
    elif setup == "torch_loader":  # on any backend: its RandomSampler draws each epoch's order from torch's RNG
        import torch_loader

        args = {"x": torch_loader.loader(x, y, BATCH)}
    elif setup == "validation_freq":
        args.update(validation_data=(x[:16], y[:16]), validation_freq=2)
    elif setup == "class_weight":  # two classes, the rarer weighted up
        args.update(y=(y > 0.5).astype("float32"), class_weight={0: 1.0, 1: 3.0})
    return args


def other_callbacks(setup: str) -> tuple[list, list]:
    """(callbacks before ours, callbacks after ours) of ``setup``."""
    import keras

    if setup == "reduce_lr_after":
        return [], [keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=10.0)]
    if setup == "reduce_lr_before":
        return [keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=1, min_delta=10.0)], []
    if setup == "early_stopping":
        stop = keras.callbacks.EarlyStopping("loss", patience=3, min_delta=10.0, restore_best_weights=True)
        return [stop], []
    if setup == "lr_scheduler":
        return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.7)], []
    return [], []


def params(directory: str, use_async: bool | None, every_step: bool = False) -> dict:
    """The job's gParameters; ``use_async`` None leaves ``ckpt_async`` at its default (auto). ``every_step``: a
    step checkpoint after every step, written at once, so the kill after step 2 of epoch 3 resumes from step 1's."""
    gp = {"epochs": EPOCHS, "ckpt_directory": directory, "ckpt_save_best_metric": "loss", "ckpt_keep_limit": 2}
    if every_step:
        gp.update(ckpt_save_steps=1, ckpt_async=False)
    return gp if use_async is None else {**gp, "ckpt_async": use_async}


def run(setup: str, phase: str, directory: str, out: str, use_async: bool | None, every_step: bool = False) -> None:
    """Run one job of ``setup`` (see the module docstring)."""
    import keras
    import numpy as np

    import candle_ckpt

    keras.utils.set_random_seed(1)
    if setup == "pydataset_workers_over_cap":
        import candle_ckpt.engine.carried

        candle_ckpt.engine.carried.MAX_BYTES = 1  # no batch fits
    if setup == "torch_loader":  # Keras seeds torch on the torch backend only
        import torch_loader

        torch_loader.seed(1)
    set_policy(setup)
    model = build_model(setup)
    gp = params(directory, use_async, every_step)
    ckpt = None
    if setup == "callback_before_restart":  # candle_lib's CandleCkptKeras order
        ckpt = candle_ckpt.CandleCheckpointCallback(gp, logger=None)
    if setup != "restart_before_compile":
        compile_model(model, setup)
    found = candle_ckpt.restart(gp, model, logger=None)  # CANDLE master: before compile()
    if setup == "restart_before_compile":
        compile_model(model, setup)
    ckpt = ckpt or candle_ckpt.CandleCheckpointCallback(gp, logger=None)
    start = found["epoch"] if found else 0
    say(f"start {start}")
    before, after = other_callbacks(setup)

    class KillMidEpoch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None) -> None:
            if phase == "kill" and self.epoch + 1 == KILL_AT and batch == 1:
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.epoch = epoch

    callbacks = [KillMidEpoch(), *before, ckpt, *after]
    first = {"initial_epoch": start} if setup != "no_initial_epoch" else {}  # a script that forgot it
    history = model.fit(**fit_inputs(setup), epochs=EPOCHS, **first, verbose=0, callbacks=callbacks)
    np.savez(out, **final_arrays(model))
    say(f"done {start} {len(history.epoch)}")


def final_arrays(model) -> dict:
    """What the tests compare: the model's weights and every optimizer's variables (a GAN's two included)."""
    import numpy as np

    arrays = {f"w{i}": np.asarray(v) for i, v in enumerate(model.get_weights())}
    optimizers = [model.optimizer]
    if hasattr(model, "d_optimizer"):
        import custom_step

        optimizers = custom_step.optimizers(model)
    variables = [v for opt in optimizers for v in opt.variables]
    arrays.update({f"opt{i}": np.asarray(v.numpy()) for i, v in enumerate(variables)})
    return arrays


def threads() -> int:
    """This process's threads (a fork copies only the calling one: a child can deadlock on a lock another held)."""
    return len(os.listdir("/proc/self/task"))


def import_once() -> int:
    """A server's imports, inherited by every child: Keras and candle_ckpt's public names. Returns the threads a
    fork may carry: those running once numpy and scipy's BLAS are loaded (each an OpenBLAS pool, which re-creates
    itself in a child; keras-nightly imports ``scipy.linalg``, whose bundled OpenBLAS starts a pool of its own).
    Keras, TensorFlow and JAX start none at import; they start with a first op or ``jax.process_count()``
    (measured: 2 threads after ``import numpy``, 3 after ``scipy.linalg``, no more after these imports, 14 after
    ``jax.process_count()``), which only the children run."""
    import numpy  # noqa: F401, PLC0415

    try:
        import scipy.linalg  # noqa: F401, PLC0415
    except ImportError:  # Keras does not need scipy; without it there is no second pool
        pass
    baseline = threads()
    import keras  # noqa: F401, PLC0415

    import candle_ckpt  # noqa: PLC0415

    # Touch the public names so their lazy imports happen once, here. (Not
    # ``import candle_ckpt.restart``: that binds the submodule over the function.)
    _ = candle_ckpt.restart, candle_ckpt.CandleCheckpointCallback
    return baseline


def fork_safe(baseline: int) -> bool:
    """Whether the server runs no more than the ``baseline`` threads of :func:`import_once`; says why not if not.
    (Fewer is fine: OpenBLAS stops its pool before a fork and starts it again only when used.)"""
    now = threads()
    if now > baseline:
        say(f"not forking: {now} threads, {baseline} once numpy was imported (TensorFlow or JAX started threads)")
    return now <= baseline


def serve(handle: Callable[[list[str]], None] | None = None) -> None:
    """Fork one job per stdin line ``ID SETUP PHASE DIR OUT [words]``; print ``ID started <pid>``, the job's
    lines (each led by ``ID``) and ``ID reaped <status>``.

    The id lets the test side match every line to its request and drop a late
    one (a job it gave up on). ``handle(words)`` runs one job in the child (default: :func:`run`; ``async``
    or ``sync`` among the words sets ``ckpt_async``, else it is left at its default; ``steps``: a step checkpoint
    after every step); a ``SystemExit`` it raises is the child's exit status, any other error status 1.
    """
    baseline = import_once()
    if handle is None:

        def handle(words: list[str]) -> None:
            mode = words[4:]
            use_async = True if "async" in mode else False if "sync" in mode else None
            run(words[0], words[1], words[2], words[3], use_async, every_step="steps" in mode)

    say("serving")
    for line in sys.stdin:
        job_id, *words = line.split() or [""]
        if len(words) < 4 or not fork_safe(baseline):
            break
        pid = os.fork()
        if pid == 0:
            _JOB.append(job_id)
            code = 0
            try:
                handle(words)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        say(f"{job_id} started {pid}")
        _, status = os.waitpid(pid, 0)
        say(f"{job_id} reaped {status}")


if __name__ == "__main__":
    serve()
