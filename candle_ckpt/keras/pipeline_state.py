"""The position of ``fit``'s training input and the global RNGs it draws from, saved and restored.

Found by experiment, each finding kept by a test (``test_exact_resume.py``; on JAX and torch
``test_custom_step.py``); docs/exactness.rst ("What is saved") says it for users:

* **tf.data, a new iterator per epoch**: a reshuffling ``shuffle`` draws each iterator's order from the dataset's
  seed generator when the iterator is made, so we count those ``fit`` made and, on resume, make as many.
* **tf.data with ``steps_per_epoch``**: Keras keeps one iterator; ``tf.train.Checkpoint`` saves it (TensorFlow), or
  a new one is read to the saved run's step (JAX, torch: Keras's iterable hides it).
* **PyDataset**: ``get_state()`` / ``set_state()``, else its small attributes after ``on_epoch_end``
  (:mod:`candle_ckpt.engine.dataset_attrs`); Keras 3.16's adapter epoch count; with workers, the batches they
  fetched ahead for the next epoch (:mod:`candle_ckpt.engine.carried`); an infinite one's next index (Keras numbers
  its batches on across epochs). A generator: one warning.
* **Grain** (``MapDataset``, ``IterDataset``, ``DataLoader``): each ``iter()`` reads the same batches; with
  ``steps_per_epoch``, Keras's kept iterator is made again and read to the saved step, as tf.data's on JAX.

**The global RNGs** (:func:`capture_rngs`, :func:`restore_rngs`): Python's, NumPy's, TensorFlow's global generator
and op-seed counter, Keras's ``SeedGenerator``, and torch's once imported
(:mod:`candle_ckpt.distributed.torch_rng`: the torch backend, or a ``DataLoader`` on another). Capture copies a
few KB and draws nothing.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from candle_ckpt.distributed.tf_data import ITER_PREFIX, iterator_bytes, load_iterator
from candle_ckpt.distributed.tf_internals import tf_global_generator
from candle_ckpt.distributed.torch_rng import backend_capture, backend_restore
from candle_ckpt.engine import carried, dataset_attrs
from candle_ckpt.engine.state_file import capture_generator, capture_rng, restore_generator, restore_rng
from candle_ckpt.keras import fit_internals, internals
from candle_ckpt.keras.callback_state import has_protocol


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
        self.note = ""  # how it was put there, when that took time: for the log
        self.changed: set[str] = set()  # attributes the PyDataset's on_epoch_end changes (see dataset_attrs)
        self.queued_at_begin: list[Any] | None = None  # the enqueuer's batches as this epoch began (engine/carried)
        self.index_at_begin: int | None = None  # an infinite PyDataset's next index then, read by the enqueuer
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
        elif self.kind not in ("arrays", "generator", "grain"):
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

    def mark_epoch_begin(self) -> None:
        """Before the epoch's first batch: remember the batches the enqueuer holds for it, and the index it asks
        next (a step checkpoint's: the resumed epoch reads its first steps again)."""
        if self.kind == "pydataset":
            self.index_at_begin = fit_internals.endless_index(self.adapter, self.it)
            self.queued_at_begin = self._queued()

    def _queued(self) -> list[Any] | None:
        """The batches the next epoch takes first: a kept iterator's prefetched ones (Keras 3.13, JAX), the queued."""
        queued, kept = fit_internals.queued_batches(self.adapter), self.it.steps_per_epoch
        return queued if queued is None or not kept else fit_internals.prefetched(self.it) + queued

    def capture(self, mid: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Return (document, arrays) with what a resumed run needs to continue this input: at an epoch's end, or
        (``mid``) to resume this epoch from its beginning."""
        doc: dict[str, Any] = {"kind": self.kind}
        arrays: dict[str, np.ndarray] = {}
        epoch = fit_internals.adapter_epoch(self.adapter)
        if epoch is not None:  # Keras 3.16 seeds the shuffle of arrays and PyDatasets from it
            doc["adapter_epoch"] = epoch
        current = fit_internals.kept_iterator(self.it) if self.it.steps_per_epoch else None
        if self.kind == "grain" and current is not None:  # made again on resume and read to its step
            doc["steps_seen"] = fit_internals.steps_seen(self.it)
        elif self.kind == "tf.data":
            doc["iterators"] = self.iterators
            if current is not None:
                try:
                    if not fit_internals.hides_tf_iterator():  # else made again on resume and read to its step
                        arrays.update(iterator_bytes(current))
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
            enqueued = mid and self.queued_at_begin is not None  # workers; else the kept iterator is put at its step
            index = self.index_at_begin if enqueued else fit_internals.endless_index(self.adapter, self.it)
            if index is not None:
                doc["endless_index"] = index
            queued = self.queued_at_begin if mid else self._queued()
            if queued is not None:
                doc["queued"], more = carried.capture(queued, self.warn)
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
        elif self.kind == "grain" and "steps_seen" in doc:
            self._keep(doc["steps_seen"], 0)

    def _restore_tf_data(self, doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        dataset, iterators = fit_internals.new_dataset(self.it), int(doc["iterators"])
        saved = any(key.startswith(ITER_PREFIX) for key in arrays)  # the kept iterator's state (TensorFlow)
        if "steps_seen" not in doc:
            for _ in range(iterators):
                iter(dataset)  # each draw advances a reshuffling dataset's seed generator
            self.iterators = iterators
            return
        current = None  # read again to its step
        if saved and not fit_internals.hides_tf_iterator():
            current = iter(dataset)
            try:
                load_iterator(current, arrays)
            except Exception as err:  # another pipeline than the one saved
                self.warn(
                    f"restart: the saved tf.data iterator position does not fit this dataset ({type(err).__name__}); "
                    "it starts from its beginning and the run will not be bit-identical"
                )
                return
        else:
            for _ in range(iterators - 1):  # the iterators made before the kept one
                iter(dataset)
        self._keep(doc["steps_seen"], iterators, current)

    def _keep(self, steps: int, iterators: int, current: Any = None) -> None:
        """Make ``current`` the iterator ``fit`` reads on, ``steps`` in; None: the kept one made again and read."""
        if current is None:
            began = time.perf_counter()
            current = fit_internals.replayed_iterator(self.it, steps)
            self.note = f", {steps} batches read again in {time.perf_counter() - began:.3f} s"
        fit_internals.keep_iterator(self.it, current, steps)
        self.iterators, self.positioned = iterators, True

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
            restore_rngs(doc["rng_before"], before)
            ds.on_epoch_end()
            self.warn(
                f"restart: replayed {type(ds).__name__}.on_epoch_end() with the saved global RNG states; this is exact "
                "only if it draws a fresh order from a global RNG (e.g. self.index = np.random.permutation(n)); a "
                "dataset that keeps other state across epochs needs get_state()/set_state()"
            )
        if "endless_index" in doc:  # an infinite one: put its numbering (and, without workers, fit's iterator) there
            self.positioned = fit_internals.start_endless_at(self.adapter, self.it, doc["endless_index"])
        queued = doc.get("queued")
        if queued is not None and fit_internals.set_queued_batches(self.adapter, carried.decode(queued, arrays)):
            self.note = f", {len(queued)} queued batches"


def _overrides_epoch_end(dataset: Any) -> bool:
    import keras

    return type(dataset).on_epoch_end is not keras.utils.PyDataset.on_epoch_end


def _pydataset_base() -> set[str]:
    """The attributes ``keras.utils.PyDataset.__init__`` sets (workers, queue size): not the dataset's state."""
    import keras

    return set(vars(keras.utils.PyDataset()))


# -- the global RNG states -------------------------------------------------------------------------------------
# The JSON document is {"python": ..., "numpy": ..., "tf_global": ..., "tf_op_seed": ..., "keras": ...};
# arrays go in the npz under these names.
_KERAS_KEY = "rng.keras.state"


def _tf_loaded() -> bool:
    """True once TensorFlow is imported (the TF backend, tf.data): only then do its RNG states matter."""
    return "tensorflow" in sys.modules


def capture_rngs() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return (JSON-able document, arrays) of every global RNG state that exists now."""
    doc, arrays = capture_rng()  # Python's random and NumPy's
    if _tf_loaded():  # TensorFlow's states exist only once it is imported (never on a JAX/torch job without it)
        rng = internals.tf_op_seed_rng()
        if isinstance(rng, random.Random):
            v, s, g = rng.getstate()
            doc["tf_op_seed"] = [v, list(s), g]
        capture_generator(tf_global_generator(), doc, arrays)
    kgen = internals.keras_global_seed_generator(create=False)
    if kgen is not None:
        doc["keras"] = True
        arrays[_KERAS_KEY] = np.array(kgen.state.numpy(), copy=True)
    if "torch" in sys.modules:  # torch's global generators, once it is imported (a job without enters no torch_rng)
        arrays.update(backend_capture())
    return doc, arrays


def restore_rngs(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
    """Set every global RNG state saved by :func:`capture_rngs`; return the names of those set."""
    done = []
    if doc.get("keras") and _KERAS_KEY in arrays:
        # Creating Keras's global generator draws from Python's random: do it first.
        internals.keras_global_seed_generator(create=True).state.assign(arrays[_KERAS_KEY])
        done.append("keras")
    if _tf_loaded():
        import tensorflow as tf

        done += restore_generator(tf.random.get_global_generator, doc, arrays)
    if "tf_op_seed" in doc and _tf_loaded():
        rng = internals.tf_op_seed_rng()
        if isinstance(rng, random.Random):
            v, s, g = doc["tf_op_seed"]
            rng.setstate((v, tuple(s), g))
            done.append("tf_op_seed")
    done += restore_rng(doc, arrays)
    if "torch" in sys.modules:
        done += backend_restore(arrays)
    return done
