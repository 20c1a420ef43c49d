"""The position of ``fit``'s training input, saved and restored.

What each kind of input needs to continue exactly where the uninterrupted
run was (found by experiment with Keras 3.15 / TensorFlow 2.21; the tests in
``tests/integration/keras/test_exact_resume.py`` keep each finding):

* **tf.data, a new iterator per epoch** (no ``steps_per_epoch``): a
  ``shuffle(..., seed=s, reshuffle_each_iteration=True)`` draws each
  iterator's order from a seed generator owned by the dataset object, one
  draw per ``iter()``. A fresh process has a fresh generator, so its first
  epoch would replay epoch 1's order. We count the iterators ``fit`` made
  and, on resume, make (and drop) as many before the first epoch.
* **tf.data with ``steps_per_epoch``** (e.g. ``.repeat()``): Keras keeps one
  iterator across epochs. Its state (position, shuffle buffer, seeds) is
  saved with ``tf.train.Checkpoint(iterator=...)`` and loaded into the
  resumed run's iterator.
* **keras.utils.PyDataset**: one with ``get_state()`` / ``set_state()`` gets
  its state back. One without them that overrides ``on_epoch_end`` gets its
  small attributes back as they were at the save, after that epoch's
  ``on_epoch_end`` (:mod:`candle_ckpt.engine.dataset_attrs`): exact for an
  index shuffled in place (``np.random.shuffle(self.index)``) as for a fresh
  permutation. (Checkpoints of earlier releases replay the last
  ``on_epoch_end`` with the global RNG states it drew from.)
* **A Python generator**: its position cannot be saved; one warning says so.
* **NumPy arrays**: Keras's own shuffle resumes exactly; nothing to save
  before Keras 3.16.

From Keras 3.16 on, the array and PyDataset adapters seed their shuffle from
their own count of epochs, which starts at 0 in every ``fit``: it is saved
and set again before the first epoch of a resumed ``fit``, whatever the input.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from candle_ckpt.engine import dataset_attrs
from candle_ckpt.keras import fit_internals, rng_state
from candle_ckpt.keras.callback_state import has_protocol

_ITER_PREFIX = "pipe.iterator."


def _iterator_bytes(iterator: Any) -> dict[str, np.ndarray]:
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="candle-ckpt-it-") as tmp:
        tf.train.Checkpoint(iterator=iterator).write(os.path.join(tmp, "it"))
        return {
            _ITER_PREFIX + os.path.basename(p): np.frombuffer(open(p, "rb").read(), np.uint8)  # noqa: SIM115
            for p in glob.glob(os.path.join(tmp, "it*"))
        }


def _load_iterator(iterator: Any, arrays: dict[str, np.ndarray]) -> None:
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="candle-ckpt-it-") as tmp:
        for key, data in arrays.items():
            if key.startswith(_ITER_PREFIX):
                with open(os.path.join(tmp, key[len(_ITER_PREFIX) :]), "wb") as f:
                    f.write(np.asarray(data, np.uint8).tobytes())
        tf.train.Checkpoint(iterator=iterator).read(os.path.join(tmp, "it")).assert_consumed()


class Pipeline:
    """The training input of one ``fit``, as Keras's epoch iterator holds it.

    Args:
        epoch_iterator: The ``fit``'s epoch iterator (see :mod:`candle_ckpt.keras.fit_hooks`).
        warn: Logs a warning (once per message is up to the caller).
    """

    def __init__(self, epoch_iterator: Any, warn: Callable[[str], None]) -> None:
        self.it = epoch_iterator
        self.adapter = epoch_iterator.data_adapter
        self.kind = fit_internals.adapter_kind(self.adapter)
        self.warn = warn
        self.iterators = 0  # made on the dataset, in earlier runs (restored) and this one
        self.positioned = False  # the kept iterator was put where the saved run was (nothing to skip)
        self.changed: set[str] = set()  # attributes the PyDataset's on_epoch_end changes (see dataset_attrs)
        if self.kind == "tf.data":
            fit_internals.count_iterators(epoch_iterator, self._count_iterator)
        elif self.kind == "pydataset":
            end = self.adapter.on_epoch_end

            def on_epoch_end() -> None:
                if has_protocol(self.dataset) or not _overrides_epoch_end(self.dataset):
                    end()
                else:
                    dataset_attrs.watch(self.dataset, end, self.changed, self.warn, _pydataset_base())

            self.adapter.on_epoch_end = on_epoch_end
        elif self.kind not in ("arrays", "generator"):
            warn(
                f"the training input ({type(self.adapter).__name__}) is not one whose position candle_ckpt can "
                "save; a resumed run starts it afresh and may not be bit-identical"
            )
        if self.kind == "generator":
            warn(
                "the training input (fit's x) is a Python generator: its "
                "position cannot be saved, so a resumed run restarts it and will not be bit-identical to an "
                "uninterrupted one; use a tf.data pipeline or a keras.utils.PyDataset (with get_state()/set_state() "
                "if it keeps state) for an exact resume"
            )

    def _count_iterator(self) -> None:
        self.iterators += 1

    @property
    def dataset(self) -> Any:
        return getattr(self.adapter, "py_dataset", None)

    def capture(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Return (document, arrays) with what a resumed run needs to continue this input."""
        doc: dict[str, Any] = {"kind": self.kind}
        arrays: dict[str, np.ndarray] = {}
        epoch = fit_internals.adapter_epoch(self.adapter)
        if epoch is not None:  # Keras 3.16 seeds the shuffle of arrays and PyDatasets from it
            doc["adapter_epoch"] = epoch
        if self.kind == "tf.data":
            doc["iterators"] = self.iterators
            current = fit_internals.kept_iterator(self.it)
            if self.it.steps_per_epoch and current is not None:
                try:
                    arrays.update(_iterator_bytes(current))
                    doc["steps_seen"] = fit_internals.steps_seen(self.it)
                except Exception as err:  # e.g. Dataset.from_generator cannot be checkpointed
                    self.warn(
                        f"the position of the tf.data iterator cannot be saved ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200]}); a resumed run starts the dataset from its beginning "
                        "and will not be bit-identical"
                    )
        elif self.kind == "pydataset":
            if has_protocol(self.dataset):
                state = dict(self.dataset.get_state())
                doc["state"] = {k: v for k, v in state.items() if not isinstance(v, np.ndarray)}
                arrays.update({f"pipe.state.{k}": v for k, v in state.items() if isinstance(v, np.ndarray)})
            elif _overrides_epoch_end(self.dataset):
                doc["attrs"], more = dataset_attrs.capture(self.dataset, self.changed, _pydataset_base())
                arrays.update(more)
        return doc, arrays

    def restore(self, doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Before the first epoch of a resumed ``fit``: put the input where the saved run was."""
        if doc.get("kind") != self.kind:
            self.warn(f"restart: the checkpoint was saved with a {doc.get('kind')} input, this fit has {self.kind}")
            return
        if "adapter_epoch" in doc:
            fit_internals.set_adapter_epoch(self.adapter, doc["adapter_epoch"])
        if self.kind == "tf.data":
            self._restore_tf_data(doc, arrays)
        elif self.kind == "pydataset":
            self._restore_pydataset(doc, arrays)

    def _restore_tf_data(self, doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        dataset = fit_internals.new_dataset(self.it)
        if "steps_seen" in doc:
            current = iter(dataset)
            try:
                _load_iterator(current, arrays)
            except Exception as err:  # another pipeline than the one saved
                self.warn(
                    f"restart: the saved tf.data iterator position does not fit this dataset ({type(err).__name__}); "
                    "it starts from its beginning and the run will not be bit-identical"
                )
                return
            fit_internals.keep_iterator(self.it, current, doc["steps_seen"])
            self.iterators = int(doc["iterators"])
            self.positioned = True
            return
        for _ in range(int(doc["iterators"])):
            iter(dataset)  # each draw advances a reshuffling dataset's seed generator
        self.iterators = int(doc["iterators"])

    def _restore_pydataset(self, doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        ds = self.dataset
        if "state" in doc and has_protocol(ds):
            state = dict(doc["state"])
            state.update({k[len("pipe.state.") :]: v for k, v in arrays.items() if k.startswith("pipe.state.")})
            ds.set_state(state)
        elif "attrs" in doc:
            dataset_attrs.restore(ds, doc["attrs"], arrays)
            self.changed |= set(doc["attrs"].get("changed", []))
        elif "rng_before" in doc and _overrides_epoch_end(ds):  # a checkpoint of an earlier release
            before = {k[len("pipe.before.") :]: v for k, v in arrays.items() if k.startswith("pipe.before.")}
            rng_state.restore(doc["rng_before"], before)
            ds.on_epoch_end()
            self.warn(
                f"restart: replayed {type(ds).__name__}.on_epoch_end() with the saved global RNG states; this is exact "
                "only if it draws a fresh order from a global RNG (e.g. self.index = np.random.permutation(n)); a "
                "dataset that keeps other state across epochs needs get_state()/set_state()"
            )


def _overrides_epoch_end(dataset: Any) -> bool:
    import keras

    return type(dataset).on_epoch_end is not keras.utils.PyDataset.on_epoch_end


def _pydataset_base() -> set[str]:
    """The attributes ``keras.utils.PyDataset.__init__`` sets (workers, queue size): not the dataset's state."""
    import keras

    return set(vars(keras.utils.PyDataset()))
