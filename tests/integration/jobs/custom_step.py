"""Models that ``fit`` trains through a ``train_step`` of their own, written as Keras's examples write them (the
variational autoencoder and the GAN of keras.io): no ``call``, so ``model.built`` stays False for good though
every layer is built; the GAN trains with two optimizers set in its ``compile`` and built by Keras at their first
``apply_gradients``, inside the step (traced, on TensorFlow), while ``model.optimizer`` stays unused.

The VAE's step is TensorFlow's (``tf.GradientTape``); the GAN's is TensorFlow's or, under
``KERAS_BACKEND=torch``, torch's (keras.io's torch guide: ``backward()``, then ``optimizer.apply``; Keras's torch
``fit`` refuses an unbuilt model, so there it says it is built, as that guide's models do).

And, under ``KERAS_BACKEND=jax``, the model of keras.io's guide "Customizing what happens in fit() with JAX"
(setup ``jax_step``): a functional model whose ``train_step`` is stateless (``stateless_call``,
``jax.value_and_grad``, ``optimizer.stateless_apply``, each metric's ``stateless_update_state``) and returns the
state that Keras's JAX ``fit`` keeps between steps and writes back to the variables only at the epoch's end.

Used by ``exact_job.py`` (setups ``vae``, ``gan`` and ``jax_step``): same data (64 samples of 8 features), the
inputs only (``jax_step``: inputs and targets, with validation data).
"""

from __future__ import annotations

import keras

TORCH = keras.backend.backend() == "torch"
if TORCH:
    import torch
elif keras.backend.backend() == "jax":
    import jax
else:
    import tensorflow as tf

SETUPS = ("vae", "gan", "jax_step")


def _dense(inputs: int, outputs: int, dropout: bool = False) -> keras.Sequential:
    """``inputs`` -> 16 (relu) -> [Dropout] -> ``outputs``, built with an ``Input`` layer."""
    layers = [keras.Input((inputs,)), keras.layers.Dense(16, activation="relu")]
    layers += [keras.layers.Dropout(0.2, seed=3)] if dropout else []
    return keras.Sequential([*layers, keras.layers.Dense(outputs)])


class VAE(keras.Model):
    """An encoder to a 2-d latent (mean and log-variance), a sampled latent, a decoder; ``model.optimizer``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.decoder = _dense(8, 4), _dense(2, 8, dropout=True)
        self.noise, self.loss_tracker = keras.random.SeedGenerator(42), keras.metrics.Mean(name="loss")

    @property
    def metrics(self) -> list:
        return [self.loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            h = self.encoder(data)
            mean, log_var = h[:, :2], h[:, 2:]
            z = mean + tf.exp(0.5 * log_var) * keras.random.normal(tf.shape(mean), seed=self.noise)
            error = tf.reduce_mean(tf.square(self.decoder(z, training=True) - data))
            loss = error - 0.5 * tf.reduce_mean(1 + log_var - mean**2 - tf.exp(log_var))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


class GAN(keras.Model):
    """A generator (4 -> 8) and a discriminator (8 -> 1), each with its own Adam, set in ``compile``."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = _dense(4, 8)
        self.discriminator = _dense(8, 1, dropout=True)
        self.noise = keras.random.SeedGenerator(42)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.built = TORCH

    def compile(self, d_optimizer, g_optimizer) -> None:  # noqa: D102 (Keras's GAN example's signature)
        super().compile()  # model.optimizer: Keras's default, never used
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @property
    def metrics(self) -> list:
        return [self.d_loss_tracker, self.g_loss_tracker, self.loss_tracker]

    def train_step(self, real):
        if TORCH:
            return self.torch_step(real)
        n = tf.shape(real)[0]
        fake = self.generator(keras.random.normal((n, 4), seed=self.noise))
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], 0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(tf.concat([fake, real], 0), training=True))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights, strict=True))
        with tf.GradientTape() as tape:
            fake = self.generator(keras.random.normal((n, 4), seed=self.noise))
            g_loss = self.loss_fn(tf.zeros((n, 1)), self.discriminator(fake, training=True))
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights, strict=True))
        return self.track(d_loss, g_loss)

    def torch_step(self, real):
        n = real.shape[0]
        fake = self.generator(keras.random.normal((n, 4), seed=self.noise))
        labels = torch.cat([torch.ones((n, 1)), torch.zeros((n, 1))], 0)
        self.zero_grad()
        d_loss = self.loss_fn(labels, self.discriminator(torch.cat([fake, real], 0), training=True))
        d_loss.backward()
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply([w.value.grad for w in weights], weights)
        self.zero_grad()
        fake = self.generator(keras.random.normal((n, 4), seed=self.noise))
        g_loss = self.loss_fn(torch.zeros((n, 1)), self.discriminator(fake, training=True))
        g_loss.backward()
        weights = self.generator.trainable_weights
        self.g_optimizer.apply([w.value.grad for w in weights], weights)
        return self.track(d_loss, g_loss)

    def track(self, d_loss, g_loss) -> dict:
        for tracker, value in ((self.d_loss_tracker, d_loss), (self.g_loss_tracker, g_loss)):
            tracker.update_state(value)
        self.loss_tracker.update_state(d_loss + g_loss)
        return {m.name: m.result() for m in self.metrics}


class JaxStep(keras.Model):
    """keras.io's JAX guide's ``CustomModel``: Keras's JAX ``fit`` hands ``train_step`` the state and keeps what it
    returns; the model holds the variables' values of the epoch's start until the epoch ends."""

    def loss_and_updates(self, trainable, non_trainable, x, y, training=False):
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x, training=training)
        return self.compute_loss(x, y, y_pred), (y_pred, non_trainable)

    def train_step(self, state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y = data
        grad_fn = jax.value_and_grad(self.loss_and_updates, has_aux=True)
        (loss, (y_pred, non_trainable)), grads = grad_fn(trainable, non_trainable, x, y, training=True)
        trainable, optimizer_variables = self.optimizer.stateless_apply(optimizer_variables, grads, trainable)
        updated, logs = [], {}
        for metric in self.metrics:
            own = metrics_variables[len(updated) : len(updated) + len(metric.variables)]
            own = metric.stateless_update_state(own, *((loss,) if metric.name == "loss" else (y, y_pred)))
            logs[metric.name] = metric.stateless_result(own)
            updated += own
        return logs, (trainable, non_trainable, optimizer_variables, updated)


def build(setup: str) -> keras.Model:
    """The model of ``setup`` (``vae``, ``gan`` or ``jax_step``), not compiled."""
    if setup == "jax_step":
        inputs = keras.Input((8,))
        return JaxStep(inputs, _dense(8, 1, dropout=True)(inputs))
    return VAE() if setup == "vae" else GAN()


def compile_model(model: keras.Model) -> None:
    """Adam(1e-2), as the other setups; the GAN's two optimizers at 1e-2 and 2e-2; mse and mae for ``jax_step``."""
    if isinstance(model, GAN):
        model.compile(keras.optimizers.Adam(1e-2), keras.optimizers.Adam(2e-2))
    elif isinstance(model, JaxStep):
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    else:
        model.compile(optimizer=keras.optimizers.Adam(1e-2))


def optimizers(model: keras.Model) -> list:
    """Every optimizer whose state the comparison covers: the GAN's two besides ``model.optimizer``."""
    return [model.optimizer, *(getattr(model, name) for name in ("d_optimizer", "g_optimizer") if hasattr(model, name))]
