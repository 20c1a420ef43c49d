"""Stands in for a framework's callback dispatcher (Keras's ``callback_list.py``) and its gateway's ``find_fit`` in
test_fit_guard."""

from __future__ import annotations

import sys

from candle_ckpt.engine.fit_port import FoundFit


class Calls:
    """A ``CallbackList``: ``fit`` holds it in a local and calls each callback's hook through it."""

    def __init__(self, *callbacks: object) -> None:
        self.callbacks = list(callbacks)

    def on_train_begin(self) -> None:
        for callback in self.callbacks:
            callback.on_train_begin()


def find_fit(callback: object) -> FoundFit | None:
    """Stands in for a framework gateway's port (``keras/fit_internals.find_fit``): called from ``callback``'s hook,
    the ``Calls`` that called it and a probe of the frame that called the list (the fit's)."""
    hook = sys._getframe(1)
    listed = hook.f_back
    fit = listed.f_back if listed is not None else None
    if fit is None:
        return None
    frame_id, code = id(fit), fit.f_code
    this = listed.f_locals.get("self")
    return FoundFit(this if isinstance(this, Calls) else None, lambda: _on_stack(frame_id, code))


def _on_stack(frame_id: int, code: object) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if id(frame) == frame_id and frame.f_code is code:
            return True
        frame = frame.f_back
    return False
