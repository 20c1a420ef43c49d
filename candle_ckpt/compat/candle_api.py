"""The candle_lib develop API by its own names: ``CandleCkptKeras``, ``CandleCkpt``, ``MultiGPUCheckpoint``.

Scripts of that generation do::

    ckpt = candle.CandleCkptKeras(gParameters, verbose=False)
    ckpt.set_model(model)
    J = ckpt.restart(model)          # often before model.compile(); Uno passes gParameters instead
    model.fit(..., callbacks=[..., ckpt])
    ckpt.report_final()

The class chooses the generation: ``CandleCkptKeras`` uses develop's defaults
(``ckpt_directory`` None means ``<output_dir>/ckpts``, the ``flat`` layout),
``CandleCheckpointCallback`` and ``restart(gParameters, model)`` Benchmarks
master's (``./save``, ``ckpts/`` inside it). ``ckpt_layout`` overrides either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import keras

from candle_ckpt.config.candle_params import develop_params
from candle_ckpt.config.params import require_model, require_params
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.keras import internals
from candle_ckpt.keras.callback import CandleCheckpointCallback
from candle_ckpt.keras.restart import restart as _restart


class CandleCkptKeras(CandleCheckpointCallback):
    """candle_lib develop's checkpoint callback, with ``set_model``, ``restart()`` and ``report_final()``.

    Args:
        gParameters: The job's parameter dict (``epochs``, ``ckpt_*``, ``output_dir``).
        logger: ``"DEFAULT"``, a :class:`logging.Logger`, or None (``ckpt.log`` only).
        verbose: Progress lines on the console; ``ckpt.log`` gets them either way.
        fs: The file-system seam, as for :class:`CandleCheckpointCallback` (tests inject faults).

    Raises:
        TypeError: ``gParameters`` is not a mapping (a model passed by mistake, say).
        ValueError: a parameter is invalid (the message names it).
    """

    def __init__(
        self,
        gParameters: Mapping[str, Any],
        logger: str | logging.Logger | None = "DEFAULT",
        verbose: bool = True,
        *,
        fs: LocalFS | None = None,
    ) -> None:
        require_params(gParameters, "CandleCkptKeras(gParameters): gParameters")
        self.gParameters = develop_params(gParameters)
        self._logger, self._verbose = logger, verbose
        self._other_said = False  # restart() was passed another model than set_model's (said once)
        super().__init__(self.gParameters, logger=logger, verbose=verbose, fs=fs)

    def set_model(self, model) -> None:
        """Attach the Keras model (``fit`` does it again; scripts call it before ``restart``)."""
        require_model(model, "CandleCkptKeras.set_model(model): model")
        super().set_model(model)

    def restart(self, model=None, verbose: bool | None = None) -> dict[str, Any] | None:
        """Restore the model from the newest valid checkpoint; return its ``ckpt-info.json`` dict or None.

        As in candle_lib, the model restored is the one given to :meth:`set_model`;
        ``model`` is needed only when none was set. Like candle_lib, any other
        argument is accepted and not read: Uno passes its parameter dict
        (``ckpt.restart(params)``). A model that is not the one set is not
        restored, and a warning says so once.

        Works before ``model.compile()``: the weights are loaded now and the
        optimizer state when training begins (this object is the callback).
        Best tracking, the resumed-from epoch and its protection from pruning
        continue from the restored checkpoint.

        Raises:
            TypeError: no model was set and ``model`` is not a Keras model.
        """
        if not self.cfg.restores():
            return None  # ckpt_restart_mode=off: nothing is read, whatever was passed
        model = self._model_to_restore(model)
        found = _restart(
            self.gParameters, model, logger=self._logger, verbose=self._verbose if verbose is None else verbose
        )
        if found is None:
            return None
        # This object is the callback: its run adopts what restart() resumed (the step checkpoint of a mid-epoch
        # save, not its epoch's), now, whatever the order of the calls; fit's start finds it adopted. An
        # optimizer state that waits for compile() travels with the model, as for restart().
        self.run.adopt(model)
        return found

    def _model_to_restore(self, given: Any) -> Any:
        """set_model's model (candle_lib reads nothing else), or ``given`` when none was set."""
        own = internals.callback_model(self)
        if own is None:
            if isinstance(given, Mapping) or given is None:
                raise TypeError(
                    "CandleCkptKeras.restart(): no model to restore: call ckpt.set_model(model) first "
                    "(candle_lib's order), or pass the model: ckpt.restart(model)"
                )
            require_model(given, "CandleCkptKeras.restart(model): model")
            return given
        if given is not None and given is not own and not isinstance(given, Mapping) and not self._other_said:
            self._other_said = True
            self.log.warning(
                f"CandleCkptKeras.restart(model): the {type(given).__name__} passed is not the model given to "
                f"set_model() ({type(own).__name__} {own.name!r}); as in candle_lib, the set_model() one is "
                "restored and the one passed is not: call ckpt.set_model(model) first to restore that one"
            )
        return own


#: candle_lib's backend-neutral base class; candle_ckpt serves Keras only, so it is the same class.
CandleCkpt = CandleCkptKeras


class MultiGPUCheckpoint(keras.callbacks.ModelCheckpoint):
    """CANDLE's ``ModelCheckpoint`` that saves ``model.layers[-2]`` when that layer is itself a Model.

    (The template model inside a multi-GPU wrapper, as Uno builds it.)
    """

    def set_model(self, model) -> None:
        require_model(model, "MultiGPUCheckpoint.set_model(model): model")
        layers = getattr(model, "layers", [])
        inner = layers[-2] if len(layers) >= 2 and isinstance(layers[-2], keras.Model) else model
        super().set_model(inner)
