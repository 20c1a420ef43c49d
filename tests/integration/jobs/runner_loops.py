"""A GAN-style custom training loop for the JobRunner tests, also run as a subprocess.

Usage::

    python runner_loops.py DIR EPOCHS OUT.npz [SLEEP_S]
        run the loop under a JobRunner checkpointing into DIR until EPOCHS,
        save every weight, optimizer variable and loop-state value to OUT.npz
        and print "resumed_from=N init_calls=K epochs_run=E". SLEEP_S (default 0) is slept
        at the end of every epoch so a test can kill the process mid-run.

Two models (generator, discriminator), two standalone Adam optimizers
(registered as ``(optimizer, variables)``), ``tf.GradientTape`` steps,
noise and dropout drawn from a ``keras.random.SeedGenerator``, a Dropout layer
in the discriminator (its seed state is saved by the runner), a data-loader
position and a ``numpy.random.Generator`` in the registered loop state.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 8
STEPS = 3


class GanLoop:
    """The models, optimizers, loop state and epoch function of one run."""

    def __init__(self, seed: int = 0) -> None:
        import keras
        import numpy as np

        keras.utils.set_random_seed(seed)
        self.gen = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
        )
        self.disc = keras.Sequential(
            [
                keras.Input((2,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dropout(0.2, seed=3),  # its seed state goes to disc.extra.npz
                keras.layers.Dense(1),
            ]
        )
        self.g_opt = keras.optimizers.Adam(1e-2)
        self.d_opt = keras.optimizers.Adam(1e-2)
        self.data = np.random.default_rng(0).standard_normal((40, 2)).astype("float32") + 3.0
        self.state: dict[str, Any] = {
            "pos": 0,  # the data loader's position
            "noise": keras.random.SeedGenerator(7),
            "shuffle": np.random.default_rng(11),
            "ema_loss": np.float64(0.0),
            "history": [],
        }
        self.init_calls = 0
        self.epochs_run = 0  # counted by run()'s epoch_fn

    def objects(self) -> dict[str, Any]:
        return {
            "gen": self.gen,
            "disc": self.disc,
            "g_opt": (self.g_opt, self.gen.trainable_variables),
            "d_opt": (self.d_opt, self.disc.trainable_variables),
        }

    def init(self) -> None:
        self.init_calls += 1

    def _batch(self):
        import numpy as np

        pos = self.state["pos"]
        idx = (np.arange(BATCH) + pos) % len(self.data)
        self.state["pos"] = int((pos + BATCH) % len(self.data))
        jitter = self.state["shuffle"].standard_normal((BATCH, 2)).astype("float32") * 0.01
        return self.data[idx] + jitter

    def epoch(self, epoch: int) -> dict[str, float]:
        import keras
        import tensorflow as tf

        seed = self.state["noise"]
        for _ in range(STEPS):
            real = tf.constant(self._batch())
            z = keras.random.normal((BATCH, 4), seed=seed)
            with tf.GradientTape() as tape:
                fake = self.gen(z)
                d_loss = tf.reduce_mean(tf.nn.softplus(-self.disc(real, training=True))) + tf.reduce_mean(
                    tf.nn.softplus(self.disc(fake, training=True))
                )
            grads = tape.gradient(d_loss, self.disc.trainable_variables)
            self.d_opt.apply_gradients(zip(grads, self.disc.trainable_variables, strict=True))
            z = keras.random.normal((BATCH, 4), seed=seed)
            with tf.GradientTape() as tape:
                hidden = keras.random.dropout(self.gen.layers[0](z), 0.25, seed=seed)
                fake = self.gen.layers[1](hidden)
                g_loss = tf.reduce_mean(tf.nn.softplus(-self.disc(fake)))
            grads = tape.gradient(g_loss, self.gen.trainable_variables)
            self.g_opt.apply_gradients(zip(grads, self.gen.trainable_variables, strict=True))
        self.state["ema_loss"] = self.state["ema_loss"] * 0.9 + float(g_loss) * 0.1
        self.state["history"].append(round(float(d_loss), 6))
        return {"d_loss": float(d_loss), "g_loss": float(g_loss)}

    def final_arrays(self) -> dict[str, Any]:
        """Every value that must be equal bit for bit between two runs."""
        import numpy as np

        out: dict[str, Any] = {}
        for name, obj in (("gen", self.gen), ("disc", self.disc), ("g_opt", self.g_opt), ("d_opt", self.d_opt)):
            for i, v in enumerate(obj.variables):
                out[f"{name}/{i}"] = np.asarray(v.numpy())
        out["noise_state"] = np.asarray(self.state["noise"].state.numpy())
        out["pos"] = np.asarray(self.state["pos"])
        out["shuffle_next"] = self.state["shuffle"].standard_normal(3)
        out["ema_loss"] = np.asarray(self.state["ema_loss"])
        out["history"] = np.asarray(self.state["history"])
        return out


def params(directory: str, epochs: int, **overrides: Any) -> dict[str, Any]:
    """gParameters for the loop: best judged on g_loss, every epoch saved."""
    p = {
        "epochs": epochs,
        "ckpt_directory": directory,
        "ckpt_save_best_metric": "g_loss",
        "ckpt_restart_mode": "auto",
    }
    p.update(overrides)
    return p


def run(directory: str, epochs: int, *, sleep_s: float = 0.0, fs: Any = None, **overrides: Any):
    """Run the loop under a JobRunner (``fs``: its file-system seam); return (loop, runner, logs)."""
    from candle_ckpt import JobRunner

    loop = GanLoop()

    def epoch_fn(epoch: int) -> dict[str, float]:
        loop.epochs_run += 1
        logs = loop.epoch(epoch)
        if sleep_s:
            time.sleep(sleep_s)
        return logs

    runner = JobRunner(
        params(directory, epochs, **overrides),
        init_fn=loop.init,
        epoch_fn=epoch_fn,
        objects=loop.objects(),
        state=loop.state,
        logger=None,
        fs=fs,
    )
    logs = runner.train()
    return loop, runner, logs


if __name__ == "__main__":
    import numpy as np

    directory, epochs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sleep_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    loop, runner, _ = run(directory, epochs, sleep_s=sleep_s)
    np.savez(out, **loop.final_arrays())
    print(f"resumed_from={runner.resumed_from} init_calls={loop.init_calls} epochs_run={loop.epochs_run}", flush=True)
