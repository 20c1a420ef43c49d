"""Models that ``fit`` trains through their own ``train_step`` (``jobs/custom_step.py``), in one process: what a
restore does with a GAN's optimizers, which Keras builds only at their first ``apply_gradients``.

The kill and signal tests of these models are in ``test_exact_resume.py`` and ``test_preemption.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from candle_ckpt import CandleCheckpointCallback, restart  # noqa: E402
from candle_ckpt.core.errors import ModelMismatch  # noqa: E402

pytestmark = pytest.mark.tf_only  # the models' train_step uses tf.GradientTape


def _gan():
    import custom_step  # noqa: PLC0415 (imports TensorFlow)

    model = custom_step.build("gan")
    custom_step.compile_model(model)
    return model


@pytest.fixture
def trained(tmp_path):
    """A GAN trained 2 epochs with the callback (the best by its summed loss), and its parameters."""
    import keras  # noqa: PLC0415

    keras.utils.set_random_seed(1)
    gp = {"epochs": 2, "ckpt_directory": str(tmp_path / "gan"), "ckpt_save_best_metric": "loss"}
    model = _gan()
    x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    model.fit(x, batch_size=16, epochs=2, verbose=0, callbacks=[CandleCheckpointCallback(gp, logger=None)])
    return model, gp


def test_a_gans_optimizers_get_their_saved_state_when_keras_builds_them(trained):
    """restart() into a fresh GAN leaves its two optimizers unbuilt (and model.optimizer, unused when saved,
    too); when each is built, with the variables its train_step applies it to, it holds the saved state."""
    model, gp = trained
    fresh = _gan()
    assert restart(gp, fresh, logger=None)["epoch"] == 2
    assert not (fresh.d_optimizer.built or fresh.g_optimizer.built or fresh.optimizer.built)
    fresh.d_optimizer.build(fresh.discriminator.trainable_variables)
    fresh.g_optimizer.build(fresh.generator.trainable_variables)
    for name in ("d_optimizer", "g_optimizer"):
        saved, loaded = getattr(model, name).variables, getattr(fresh, name).variables
        assert len(saved) == len(loaded) > 2, name
        assert all(np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in zip(saved, loaded, strict=True))
    assert "build" not in vars(fresh.d_optimizer), "the instance's build was not given back"


def test_a_gan_optimizer_built_on_other_variables_is_refused_at_its_build(trained):
    """The saved state of d_optimizer does not fit it when it is built on the generator's variables: its build
    raises ModelMismatch naming it and what to do, and its variables keep their fresh values."""
    _, gp = trained
    fresh = _gan()
    restart(gp, fresh, logger=None)
    with pytest.raises(ModelMismatch, match=r"the state of d_optimizer restored from .* does not fit") as err:
        fresh.d_optimizer.build(fresh.generator.trainable_variables)
    assert "Apply d_optimizer to the variables it was applied to" in str(err.value)
    assert int(np.asarray(fresh.d_optimizer.iterations)) == 0
