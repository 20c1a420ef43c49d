"""What a tf_keras resume cannot reproduce, said once at the first save.

A tf_keras (Keras 2) model resumes exactly: its weights, its optimizer, the
order of ``fit``'s default ``shuffle=True`` on arrays (a resumed ``fit``
skips the batches of the epochs before it in a pipeline built as the
uninterrupted run's, see ``internals.fast_forward_input``) and the
``tf.random.Generator`` states of random layers
(:mod:`~candle_ckpt.tf_keras.random_state`). Two things remain:

* random layers (``Dropout``, ``GaussianNoise``, ...) draw by default from
  TF1 stateful kernels, whose position lives inside the kernel and cannot
  be read or set; ``tf_keras.backend.experimental.enable_tf_random_generator()``,
  called before the model is built, gives them generators whose state is saved;
* shuffled array input whose pipeline the callback could not reach (``fit``
  not found on the stack, or an input adapter that makes a new iterator
  every epoch).

:func:`inexact_causes` names what applies to this ``fit``; the callback says
it in one warning, at the first save.
"""

from __future__ import annotations

from typing import Any

import candle_ckpt.tf_keras.internals as internals


def inexact_causes(model: Any, fit_args: dict[str, Any] | None, forwarded: bool = False) -> list[str]:
    """What makes a resumed tf_keras ``fit`` differ from the uninterrupted one (empty: it resumes exactly).

    Args:
        model: The model being fitted.
        fit_args: The locals of its ``fit`` (``internals.fit_arguments``), None if not found.
        forwarded: This (resumed) fit's input was fast-forwarded to its first epoch.
    """
    causes = []
    if fit_args is not None and fit_args["shuffle"] and _is_arrays(fit_args["x"]) and not forwarded:
        adapter = internals.handler_adapter(fit_args.get("data_handler"))
        if adapter is None or adapter.should_recreate_iterator():
            causes.append(
                f"fit(shuffle={fit_args['shuffle']!r}) shuffles the arrays every epoch in an input pipeline "
                f"({type(adapter).__name__}) whose position a resumed fit cannot skip to"
            )
    random_layers = internals.random_layers(model)
    if random_layers:
        causes.append(
            f"random layers ({', '.join(random_layers)}) draw from stateful TF1 random kernels, whose state cannot "
            "be saved; call tf_keras.backend.experimental.enable_tf_random_generator() before building the model: "
            "they then draw from tf.random.Generator states, which the checkpoint keeps"
        )
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
        f"tf_keras model: a resumed run will not be bit-identical to an uninterrupted one: {'; '.join(causes)} "
        "(the weights, the optimizer state and the order of fit's shuffle resume exactly)"
    )
