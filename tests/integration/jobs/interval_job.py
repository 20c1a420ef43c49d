"""A job at the defaults whose epochs are long enough for ``ckpt_save_steps=auto`` to take step checkpoints.

``python interval_job.py DIR OUT PHASE STEP_S``: seeds everything, builds ``exact_job``'s model, calls
``restart()`` and ``fit`` for :data:`EPOCHS` epochs of :data:`STEPS` steps with the checkpoint callback at its
defaults; each step takes ``STEP_S`` seconds more (a callback sleeps: a real model's step time), and in the
``kill`` phase's last epoch at least a third of the interval's seconds (:data:`INTERVALS` intervals an epoch: the
interval in seconds follows the measured save cost, which a busy disk can make ten times longer). PHASE ``full``
and ``resume`` run to the end and write the final weights and optimizer variables to ``OUT`` (``.npz``) and
``stats()`` to ``OUT.json``; ``kill`` SIGKILLs itself in the last epoch, once it has taken a step checkpoint
there, one step short of the next one (the most work a kill can lose), after printing
``kill <step> <saved step> <gap in force> <interval>``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

EPOCHS, STEPS, BATCH = 2, 400, 8
#: In the kill phase's last epoch, its steps last long enough for this many intervals to fit in it.
INTERVALS = 3


def say(message: str) -> None:
    os.write(1, (message + "\n").encode())


def main(directory: str, out: str, phase: str, step_s: float) -> None:
    import keras
    import numpy as np

    import candle_ckpt

    sys.path.insert(0, os.path.dirname(__file__))
    import exact_job

    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((STEPS * BATCH, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1))).astype("float32")
    model = exact_job.build_model()
    exact_job.compile_model(model)
    gp = {"ckpt_directory": directory, "epochs": EPOCHS, "ckpt_save_best_metric": "loss"}
    found = candle_ckpt.restart(gp, model, logger=None)
    ckpt = candle_ckpt.CandleCheckpointCallback(gp, logger=None)
    start = found["epoch"] if found else 0
    say(f"start {start} {found['step'] if found else None}")

    class Slow(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None) -> None:
            # Before the checkpoint callback's batch end: it has seen steps 1 .. batch, not this one yet.
            if phase != "kill" or self.epoch != EPOCHS - 1:
                time.sleep(step_s)
                return
            step, stats = batch + 1, ckpt.stats()  # stats()["steps"]: the interval of its check at step - 1
            seconds = stats["steps"]["seconds"] or 0.0  # max(save cost / 2%, Young/Daly), whatever the step time
            time.sleep(max(step_s, seconds * INTERVALS / STEPS))
            saved = [s["step"] for s in stats["saves"] if s.get("step") and s["epoch"] == self.epoch]
            # The gap in force: the interval spread evenly over an epoch whose end saves anyway (at most 1.5 x it).
            every, interval = stats["steps"]["every"], stats["steps"]["interval"]
            if saved and (step - saved[-1] >= every - 1 or step == STEPS - 1):  # one step short of the next one
                say(f"kill {step} {saved[-1]} {every} {interval}")
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, initial_epoch=start, verbose=0, callbacks=[Slow(), ckpt])
    arrays = {f"w{i}": np.asarray(v) for i, v in enumerate(model.get_weights())}
    arrays.update({f"opt{i}": np.asarray(v.numpy()) for i, v in enumerate(model.optimizer.variables)})
    np.savez(out, **arrays)
    with open(out + ".json", "w") as f:
        json.dump(ckpt.stats(), f, default=str)
    say("done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
