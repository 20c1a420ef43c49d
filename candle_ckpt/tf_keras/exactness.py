"""What a tf_keras resume cannot reproduce, said once at the first save.

For a tf_keras (Keras 2) model the weights and the optimizer resume exactly,
but two sources of randomness do not:

* ``fit(shuffle=True)`` (the default) on arrays shuffles them in tf_keras's
  own ``tf.data`` pipeline, with a stateful op seeded once per ``fit``;
* random layers (``Dropout``, ``GaussianNoise``, ...) draw from stateful TF1
  random kernels, whose position lives inside the kernel.

Neither state can be read or set from outside, so a resumed run draws other
numbers than the uninterrupted one. Keras 3 does not have this problem
(``candle_ckpt.keras`` saves its generators and the input's position).
:func:`inexact_causes` names what applies to this ``fit``; the callback says
it in one warning, at the first save.
"""

from __future__ import annotations

from typing import Any

import candle_ckpt.tf_keras.internals as internals


def inexact_causes(model: Any, fit_args: dict[str, Any] | None) -> list[str]:
    """What makes a resumed tf_keras ``fit`` differ from the uninterrupted one (empty: it resumes exactly)."""
    causes = []
    if fit_args is not None and fit_args["shuffle"] and _is_arrays(fit_args["x"]):
        causes.append(f"fit(shuffle={fit_args['shuffle']!r}) shuffles the arrays every epoch")
    random_layers = internals.random_layers(model)
    if random_layers:
        causes.append(f"random layers ({', '.join(random_layers)}) draw new numbers at every step")
    return causes


def _is_arrays(x: Any) -> bool:
    import numpy as np

    if isinstance(x, (list, tuple)):
        return bool(x) and all(_is_arrays(v) for v in x)
    if isinstance(x, dict):
        return bool(x) and all(_is_arrays(v) for v in x.values())
    return isinstance(x, np.ndarray) or type(x).__name__ in ("EagerTensor", "DataFrame", "Series")


def inexact_message(causes: list[str]) -> str:
    """The one warning for a tf_keras fit whose resume is not bit-identical."""
    return (
        f"tf_keras model: a resumed run will not be bit-identical to an uninterrupted one: {'; '.join(causes)}; "
        "these draw from stateful TensorFlow random ops whose state candle_ckpt cannot save for tf_keras (Keras 2) "
        "models (the weights and optimizer state resume exactly); for an exact resume train with Keras 3, whose "
        "callback saves the random and input state, or pass fit(shuffle=False) and use no random layers"
    )
