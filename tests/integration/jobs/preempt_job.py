"""Jobs that a scheduler preempts, run by ``test_preemption.py`` in fresh processes (issue 16).

The same server as ``exact_job.py``: it imports TensorFlow once, then for every
stdin line ``SETUP PHASE DIR OUT [key=value ...]`` forks a child that runs one
job and prints ``reaped <status>``. The model, data and inputs are
``exact_job.py``'s (found by name, with its other callbacks), plus ``arrays_noshuffle``, ``validation`` (shuffled
arrays validated in 8 batches of 4) and ``validation_reduce_lr`` (with ReduceLROnPlateau on ``val_loss`` after ours).

Phases: ``full`` and ``resume`` run to the end and write the final weights and
optimizer variables to ``OUT`` (each epoch's logged loss to ``OUT.loss.json``).
``signal`` stops at ``at=EPOCH.BATCH`` (1-based epoch, 0-based batch), prints
``at <pid>`` and waits until ``DIR.go`` exists (the test sends the signal
first), so the callback sees the signal at exactly that batch end. ``early``
waits so right after ``restart()``, before the callback exists and ``fit`` begins. ``kill``
sends itself SIGKILL there. ``deadline`` trains slowly (``sleep=`` seconds per
batch) towards ``deadline=``. Options: ``async``, ``code=N`` or ``code=return``
(``ckpt_preempt_exit_code``), ``steps=N`` (``ckpt_save_steps``), ``batch=N`` (``fit``'s batch size), ``slowfs=S``
(each of the first two commits sleeps S seconds before its sidecar, so that a
signal can come during an async write), ``val=EPOCH.BATCH`` (the signal at that batch of the epoch's validation
instead: each validation batch of the run prints ``val EPOCH.BATCH``), ``valsleep=S`` (each validation batch sleeps S
seconds: a slow validation).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_path = Path(__file__).with_name("exact_job.py")
_spec = importlib.util.spec_from_file_location("exact_job", _path)
job = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(job)
say = job.say


def options(words: list[str]) -> dict[str, str]:
    return dict(w.split("=", 1) if "=" in w else (w, "1") for w in words)


def fit_inputs(setup: str) -> dict:
    if setup == "arrays_noshuffle":
        return {**job.fit_inputs("arrays_shuffle"), "shuffle": False}
    if setup.startswith("validation_") or setup == "validation":
        x, y, _ = job.data()
        return {**job.fit_inputs("arrays_shuffle"), "validation_data": (x[:32], y[:32]), "validation_batch_size": 4}
    return job.fit_inputs(setup)


def other_callbacks(setup: str) -> tuple[list, list]:
    if setup == "validation_reduce_lr":  # lowers the rate at every epoch end, by what the validation measured
        import keras

        return [], [keras.callbacks.ReduceLROnPlateau("val_loss", factor=0.5, patience=0, min_delta=10.0)]
    return job.other_callbacks(setup)


def params(directory: str, opts: dict[str, str]) -> dict:
    gp = job.params(directory, "async" in opts)
    gp.update(ckpt_preempt_signals="SIGTERM,SIGUSR1", ckpt_preempt_exit_code=opts.get("code"))
    gp.update(ckpt_save_steps=int(opts.get("steps", 0)), ckpt_deadline=opts.get("deadline", "none"))
    gp.update(ckpt_deadline_margin=float(opts.get("margin", 1)))
    return gp


def slow_fs(seconds: float):
    """A LocalFS whose first two sidecar writes of an epoch commit wait ``seconds`` first."""
    from candle_ckpt.core.fs import LocalFS

    class SlowFS(LocalFS):
        left = 2

        def write_bytes(self, path, data):
            if path.endswith("ckpt-info.json") and os.sep + "work" + os.sep in path and SlowFS.left > 0:
                SlowFS.left -= 1
                time.sleep(seconds)
            return super().write_bytes(path, data)

    return SlowFS()


def wait_go(directory: str) -> None:
    """Wait (30 s at most) until the test has sent its signal and created ``DIR.go``."""
    go = Path(directory + ".go")
    for _ in range(3000):
        if go.exists():
            break
        time.sleep(0.01)


def run(setup: str, phase: str, directory: str, out: str, opts: dict[str, str]) -> None:
    import keras
    import numpy as np

    import candle_ckpt

    keras.utils.set_random_seed(1)
    job.set_policy(setup)
    model = job.build_model(setup)
    job.compile_model(model, setup)
    gp = params(directory, opts)
    found = candle_ckpt.restart(gp, model, logger=None)
    if phase == "early":  # the test's signal comes after restart(), before the callback exists and fit begins
        say(f"at {os.getpid()} 0")
        wait_go(directory)
    extra = {"fs": slow_fs(float(opts["slowfs"]))} if "slowfs" in opts else {}
    ckpt = candle_ckpt.CandleCheckpointCallback(gp, logger=None, **extra)
    start = found["epoch"] if found else 0
    say(f"start {start} {found['step'] if found else None}")
    at_epoch, at_batch = (int(v) for v in opts.get("at", "0.0").split("."))
    val_at = tuple(int(v) for v in opts["val"].split(".")) if "val" in opts else None

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None) -> None:
            if phase == "deadline":
                time.sleep(float(opts.get("sleep", 0.2)))
            if (self.epoch + 1, batch) != (at_epoch, at_batch):
                return
            if phase == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if phase == "signal" and val_at is None:
                say(f"at {os.getpid()} {int(ckpt.engine.writer.in_flight())}")
                wait_go(directory)

        def on_test_batch_end(self, batch, logs=None) -> None:
            if val_at is None:
                return
            time.sleep(float(opts.get("valsleep", 0)))
            say(f"val {self.epoch + 1}.{batch}")
            if phase == "signal" and (self.epoch + 1, batch) == val_at:
                say(f"at {os.getpid()} {int(ckpt.engine.writer.in_flight())}")
                wait_go(directory)

    say(f"deadline {ckpt.run.controller.watcher.deadline}")
    epochs = 40 if phase == "deadline" else job.EPOCHS
    before, after = other_callbacks(setup)
    callbacks = [Interrupt(), *before, ckpt, *after]
    inputs = {**fit_inputs(setup), **({"batch_size": int(opts["batch"])} if "batch" in opts else {})}
    history = model.fit(**inputs, epochs=epochs, initial_epoch=start, verbose=0, callbacks=callbacks)
    np.savez(out, **job.final_arrays(model))
    losses = dict(zip(history.epoch, map(float, history.history.get("loss", [])), strict=False))
    Path(out + ".loss.json").write_text(json.dumps({str(k): v for k, v in losses.items()}))
    if "val_loss" in history.history:
        val = dict(zip(history.epoch, map(float, history.history["val_loss"]), strict=False))
        Path(out + ".val.json").write_text(json.dumps({str(k): v for k, v in val.items()}))
    say(f"done {start} {len(history.epoch)} {ckpt.stats()['preempt']}")


def serve() -> None:
    """``exact_job.serve`` with this file's jobs: one fork per stdin line, ``reaped <status>`` when it is gone."""
    job.serve(lambda words: run(words[0], words[1], words[2], words[3], options(words[4:])))


if __name__ == "__main__":
    serve()
