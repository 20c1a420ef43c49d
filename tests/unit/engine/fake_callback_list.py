"""Stands in for a framework's callback dispatcher (Keras's ``callback_list.py``) in test_fit_guard."""

from __future__ import annotations


class Calls:
    """A ``CallbackList``: ``fit`` holds it in a local and calls each callback's hook through it."""

    def __init__(self, *callbacks: object) -> None:
        self.callbacks = list(callbacks)

    def on_train_begin(self) -> None:
        for callback in self.callbacks:
            callback.on_train_begin()
