"""The running Keras 3 ``fit``: its frames, its epoch iterator and data adapter; the Keras 3 fit port.

A gateway module, as :mod:`candle_ckpt.keras.internals` (saving, models, optimizers, RNGs): with it, the only
modules that reach a frame of Keras 3 or a private attribute of its trainers (``tests/unit/test_architecture.py``).
:func:`find_fit`, :func:`wrap_epoch`, :func:`set_first_epoch` and :func:`stopped_early` are the Keras 3
:class:`~candle_ckpt.engine.fit_port.FitPort` (this module is passed as the port); the rest reaches the running
``fit``'s input (a mid-epoch resume, the input pipeline's state, the watchdog's probe). Each accessor's docstring
ends with what it relies on and the tripwire test that fails when a Keras release moves it.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import keras

from candle_ckpt.engine.fit_port import FoundFit

_LIST_DEPTH = 8  # frames searched above on_train_begin for the CallbackList
_HOOK_DEPTH = 12  # frames searched above the port's caller (the run) for the hook and its CallbackList


# -- the port ---------------------------------------------------------------------------------


def find_fit(callback: Any) -> FoundFit | None:
    """The ``fit`` calling ``callback``'s hook now: its ``CallbackList`` (None if not found) and a probe of whether
    the frame that called the list (``fit``'s; with no list, the hook's caller's) is still on a thread's stack.
    None: no hook of ``callback`` runs on this thread.

    Relies on: the list being the ``self`` of a frame above the hook, holding ``callbacks``, called by ``fit``;
    ``sys._getframe`` (CPython)
    -- tripwire ``test_lock_lifecycle.py::test_a_fit_that_raised_lets_go_of_the_lock_with_the_garbage_collector_off``.
    """
    frame: FrameType | None = sys._getframe(1)
    hook = None
    for _ in range(_HOOK_DEPTH):
        if frame is None:
            break
        this = frame.f_locals.get("self")
        if this is callback:
            hook = frame  # the outermost: a subclass's hook calls ours through super()
        elif hook is not None and _lists(this, callback):
            return FoundFit(this, _probe(frame.f_back)) if frame.f_back is not None else None
        frame = frame.f_back
    if hook is None or hook.f_back is None:
        return None
    return FoundFit(None, _probe(hook.f_back))


def _probe(frame: FrameType) -> Callable[[], bool]:
    """Whether ``frame`` is on the calling thread's stack; it keeps the frame's id and code, not the frame."""
    frame_id, code = id(frame), frame.f_code
    return lambda: any(id(f) == frame_id and f.f_code is code for f, _ in traceback.walk_stack(None))


def wrap_epoch(callback_list: Any, hooks: Mapping[str, Callable[..., None]]) -> None:
    """Make ``fit`` call ``hooks[name]`` where it calls the list's ``name`` (``on_epoch_begin``, ``on_epoch_end``).

    Relies on: the trainers' ``fit`` calling ``callbacks.on_epoch_begin`` / ``on_epoch_end`` on its
    ``CallbackList`` (an instance attribute wins over the method)
    -- tripwire ``test_resume_order.py::test_fit_hooks_find_the_callback_list_and_the_input``.
    """
    for name, hook in hooks.items():
        setattr(callback_list, name, hook)


def stopped_early(callback: Any, epoch: int) -> bool:
    """Whether ``callback`` is an ``EarlyStopping`` that ended training at Keras's epoch index ``epoch``.

    Relies on: ``EarlyStopping.stopped_epoch`` (the index of the epoch it stopped at)
    -- tripwire ``tests/integration/keras/test_exact_resume.py::test_a_finished_run_rerun_trains_nothing``.
    """
    return isinstance(callback, keras.callbacks.EarlyStopping) and callback.stopped_epoch == epoch


def set_first_epoch(model: Any, epoch: int | None) -> bool:
    """Make the ``fit`` that is starting begin at ``epoch`` whatever its ``initial_epoch`` (None: undo); True.

    Relies on: the trainers' ``initial_epoch = self._initial_epoch or initial_epoch`` (Keras's own
    ``BackupAndRestore`` sets it) -- tripwire
    ``tests/integration/keras/test_exact_resume.py::test_a_finished_run_rerun_trains_nothing``.
    """
    model._initial_epoch = epoch
    return True


def find_callback_list(callback: Any) -> Any:
    """The ``CallbackList`` calling ``callback.on_train_begin`` now (the caller's caller), or None.

    Relies on: the list being the ``self`` of a frame above the hook, holding ``callbacks``
    -- tripwire ``test_resume_order.py::test_fit_hooks_find_the_callback_list_and_the_input``.
    """
    frame = sys._getframe(1)
    for _ in range(_LIST_DEPTH):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if _lists(owner, callback):
            return owner
    return None


def _lists(owner: Any, callback: Any) -> bool:
    """Whether ``owner`` is a ``CallbackList`` holding ``callback``."""
    members = getattr(owner, "callbacks", None)
    return isinstance(members, list) and any(c is callback for c in members) and hasattr(owner, "on_epoch_end")


# -- the running fit's input ------------------------------------------------------------------


_INPUT_FILES = (f"{os.sep}trainers{os.sep}data_adapters{os.sep}", f"{os.sep}trainers{os.sep}epoch_iterator.py")


def waiting_for_input() -> str | None:
    """``"input"`` while the main thread waits in Keras's input pipeline (the watchdog's probe on a hang), else None.

    Relies on: the data adapters and the epoch iterator living under ``keras/src/trainers/``
    -- tripwire ``test_hang.py::test_an_input_pipeline_that_blocks_is_ended_and_the_rerun_is_exact``.
    """
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _INPUT_FILES):
            return "input"
        frame = frame.f_back
    return None


def find_epoch_iterator(model: Any) -> Any:
    """The epoch iterator of the ``fit`` of ``model`` that is running now, or None.

    Relies on: ``Trainer.fit``'s local ``epoch_iterator`` with a ``data_adapter``
    -- tripwire ``test_resume_order.py::test_fit_hooks_find_the_callback_list_and_the_input``.
    """
    frame = sys._getframe(1)
    for _ in range(_LIST_DEPTH + 2):
        frame = frame.f_back
        if frame is None:
            return None
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            it = frame.f_locals.get("epoch_iterator")
            return it if hasattr(it, "data_adapter") else None
    return None


def validated_epochs(model: Any) -> Callable[[int], bool] | None:
    """Which epochs (0-based) the running ``fit`` of ``model`` validates, or None: no validation data (or no fit).

    Relies on: ``Trainer.fit``'s locals ``validation_data`` (also made of ``validation_split``) and
    ``validation_freq``, and ``Trainer._should_eval``
    -- tripwire ``test_resume_order.py::test_fit_hooks_find_the_callback_list_and_the_input``.
    """
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model):
        frame = frame.f_back
    if frame is None or frame.f_locals.get("validation_data") is None:
        return None
    freq = frame.f_locals.get("validation_freq", 1)
    return lambda epoch: bool(model._should_eval(epoch, freq))


def batch_size(epoch_iterator: Any) -> Any:
    """The batch size ``fit``'s input says it has (arrays, grain, a batched tf.data), as it says it; None where it
    says none (a PyDataset) or cannot (``engine.epoch_shape.EpochShape.make`` keeps only a count).

    Relies on: ``DataAdapter.batch_size``
    -- tripwire ``test_resume_order.py::test_fit_hooks_find_the_callback_list_and_the_input``.
    """
    try:
        return epoch_iterator.data_adapter.batch_size
    except (AttributeError, ValueError, TypeError):  # a tf.data element of unknown rank
        return None


def replace_steps_once(epoch_iterator: Any, make: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
    """In the next epoch only, ``fit`` takes its ``(begin, end, iterator)`` steps from ``make(Keras's steps)``.

    Relies on: ``EpochIterator._enumerate_iterator`` yielding ``(begin step, end step, iterator)``
    -- tripwire ``test_mid_epoch.py::test_skip_steps_takes_the_first_steps_of_one_epoch_only``.
    """
    original = epoch_iterator._enumerate_iterator

    def once() -> Iterator[Any]:
        del epoch_iterator._enumerate_iterator  # later epochs run as Keras wrote them
        return make(original())

    epoch_iterator._enumerate_iterator = once


def steps_seen(epoch_iterator: Any) -> int:
    """Steps taken from a kept input iterator (``steps_per_epoch`` set).

    Relies on: ``EpochIterator._steps_seen``
    -- tripwire ``test_mid_epoch.py::test_skip_steps_takes_the_first_steps_of_one_epoch_only``.
    """
    return int(epoch_iterator._steps_seen)


def set_steps_seen(epoch_iterator: Any, steps: int) -> None:
    """Set what :func:`steps_seen` returns.

    Relies on: ``EpochIterator._steps_seen``
    -- tripwire ``test_mid_epoch.py::test_skip_steps_takes_the_first_steps_of_one_epoch_only``.
    """
    epoch_iterator._steps_seen = steps


def hides_tf_iterator() -> bool:
    """Whether ``fit`` reads tf.data through an iterable that makes the TensorFlow iterator at its first read and
    hides it (JAX's generator, torch's DataLoader). Relies on: each backend's ``EpochIterator._get_iterator`` --
    tripwire ``test_custom_step.py`` (tf.data on JAX and torch)."""
    return keras.backend.backend() != "tensorflow"


def count_iterators(epoch_iterator: Any, on_new: Callable[[], None]) -> None:
    """Call ``on_new()`` each time ``fit`` makes a TensorFlow iterator over its tf.data input: where it hides it, at
    its first read (Keras also makes one at each epoch's end that it never reads). Relies on:
    ``EpochIterator._get_iterator``, its result iterated at once -- tripwire ``test_exact_resume.py`` (tfdata_*),
    ``test_custom_step.py`` (tf.data on JAX, torch)."""
    make = epoch_iterator._get_iterator

    def counted() -> Any:
        if not hides_tf_iterator():
            on_new()
            return make()
        iterator = iter(make())

        def first_read() -> Iterator[Any]:
            on_new()
            yield from iterator

        return first_read()

    epoch_iterator._get_iterator = counted


def new_dataset(epoch_iterator: Any) -> Any:
    """A new iterable over ``fit``'s tf.data input whose ``iter()`` makes an epoch's TensorFlow iterator: Keras's,
    or the dataset itself where Keras's hides it. Relies on: ``EpochIterator._get_iterator`` -- tripwire
    ``test_exact_resume.py`` (tfdata_*), ``test_custom_step.py``."""
    if hides_tf_iterator():
        return epoch_iterator.data_adapter.get_tf_dataset()
    return epoch_iterator._get_iterator()


def replayed_iterator(epoch_iterator: Any, steps: int) -> Any:
    """Keras's iterator of a new epoch ``steps`` batches in: a saved run's kept iterator made again where its state
    was not saved (a tf.data pipeline reads the same batches again). Relies on: ``EpochIterator._get_iterator`` --
    tripwire ``test_custom_step.py`` (tfdata_repeat on JAX)."""
    iterator = iter(epoch_iterator._get_iterator())
    for _ in range(steps):
        next(iterator)
    return iterator


def kept_iterator(epoch_iterator: Any) -> Any:
    """The input iterator Keras keeps across epochs (``steps_per_epoch`` set), or None.

    Relies on: ``EpochIterator._current_iterator`` -- tripwire ``test_exact_resume.py`` (tfdata_repeat).
    """
    return getattr(epoch_iterator, "_current_iterator", None)


def keep_iterator(epoch_iterator: Any, iterator: Any, steps: int) -> None:
    """Make ``iterator`` the one Keras keeps across epochs, ``steps`` steps into it.

    Relies on: ``EpochIterator._current_iterator`` and ``_steps_seen``
    -- tripwire ``test_exact_resume.py`` (tfdata_repeat).
    """
    epoch_iterator._current_iterator = iterator
    epoch_iterator._steps_seen = steps


def queued_batches(adapter: Any) -> list[Any] | None:
    """The batches a ``PyDataset``'s enqueuer holds for the next epoch (``fit`` takes them before any it fetches),
    or None where the adapter has none (``workers`` 0 or 1 without multiprocessing). Read between epochs.

    Relies on: ``PyDatasetAdapter.enqueuer.ready_queue``, the ``queue.Queue`` that ``OrderedEnqueuer.stop`` fills
    and ``get`` reads first -- tripwire
    ``test_custom_step.py::test_a_pydataset_with_worker_threads_killed_mid_epoch_resumes_bit_identical``.
    """
    ready = getattr(getattr(adapter, "enqueuer", None), "ready_queue", None)
    if ready is None:
        return None
    with ready.mutex:
        return list(ready.queue)


def set_queued_batches(adapter: Any, batches: list[Any]) -> bool:
    """Make ``batches`` what :func:`queued_batches` returns (before an epoch); False where there is no enqueuer.
    Relies on: as :func:`queued_batches` -- tripwire
    ``test_custom_step.py::test_a_pydataset_with_worker_threads_killed_mid_epoch_resumes_bit_identical``."""
    ready = getattr(getattr(adapter, "enqueuer", None), "ready_queue", None)
    if ready is None:
        return False
    with ready.mutex:
        ready.queue.clear()
        ready.queue.extend(batches)
        ready.not_empty.notify_all()
    return True


def endless_index(adapter: Any, epoch_iterator: Any) -> int | None:
    """The index ``fit`` asks next of an infinite ``PyDataset`` (``num_batches`` None: Keras numbers its batches on
    across epochs, from the start in each process), or None (a finite one, or its enqueuer running). Relies on:
    ``OrderedEnqueuer.indices``, the ``itertools.count`` it keeps (its repr), else ``EpochIterator._steps_seen``
    (Keras 3.16's shards: ``_data_shard_id``, ``_num_data_shards``) -- tripwire
    ``test_custom_step.py::test_an_endless_pydataset_resumes_bit_identical``."""
    if adapter.py_dataset.num_batches is not None or (adapter.enqueuer is not None and adapter.enqueuer.is_running()):
        return None
    if adapter.enqueuer is not None:  # count(5) or count(5, 2)
        return int(repr(adapter.enqueuer.indices).removeprefix("count(").rstrip(")").split(",")[0])
    return getattr(adapter, "_data_shard_id", 0) + getattr(adapter, "_num_data_shards", 1) * steps_seen(epoch_iterator)


def prefetched(epoch_iterator: Any) -> list[Any]:
    """The batches Keras 3.13's JAX ``fit`` took ahead from the iterator it keeps (``steps_per_epoch``), oldest
    first; [] elsewhere. Relies on: the ``queue`` of ``JAXEpochIterator._prefetch_numpy_iterator``'s frame --
    tripwire ``test_custom_step.py::test_an_endless_pydataset_resumes_bit_identical`` (on Keras 3.13: .ci/run)."""
    frame = getattr(kept_iterator(epoch_iterator), "gi_frame", None)
    if frame is None or frame.f_code.co_name != "_prefetch_numpy_iterator":
        return []
    return list(frame.f_locals.get("queue", ()))


def start_endless_at(adapter: Any, epoch_iterator: Any, index: int) -> bool:
    """Make ``index`` the next that :func:`endless_index` gives (before an epoch); True if a new iterator from there
    is kept (no enqueuer). Relies on: as :func:`endless_index`; ``OrderedEnqueuer.stop`` (JAX's first read started
    it); ``PyDatasetAdapter._infinite_generator`` (TensorFlow calls it at its first read); :func:`keep_iterator`
    -- tripwire ``test_custom_step.py::test_an_endless_pydataset_resumes_bit_identical``."""
    first, step, once = getattr(adapter, "_data_shard_id", 0), getattr(adapter, "_num_data_shards", 1), [index]
    if adapter.enqueuer is not None:
        adapter.enqueuer.stop()
        set_queued_batches(adapter, [])  # what the stop drained came from this process's own count, not the saved run's
        adapter.enqueuer.indices = itertools.count(index, step)
        return False

    def generator() -> Iterator[Any]:  # Keras's, from ``index`` the first time
        start = once.pop() if once else first
        return (adapter._standardize_batch(adapter.py_dataset[i]) for i in itertools.count(start, step))

    adapter._infinite_generator = generator
    keep_iterator(epoch_iterator, iter(epoch_iterator._get_iterator()), (index - first) // step)
    return True


_ADAPTER_KINDS = {
    "TFDatasetAdapter": "tf.data",
    "PyDatasetAdapter": "pydataset",
    "GeneratorDataAdapter": "generator",
    "ArrayDataAdapter": "arrays",
    "GrainDatasetAdapter": "grain",
}


def adapter_kind(adapter: Any) -> str:
    """``tf.data``, ``pydataset``, ``generator``, ``arrays``, ``grain``, or the adapter's class name.

    Relies on: the class names in ``keras.src.trainers.data_adapters``
    -- tripwire ``test_resume_order.py::test_fit_hooks_find_the_callback_list_and_the_input`` (grain's:
    ``test_custom_step.py::test_a_grain_dataset_killed_mid_epoch_resumes_bit_identical``).
    """
    name = type(adapter).__name__
    return _ADAPTER_KINDS.get(name, name)


def adapter_epoch(adapter: Any) -> int | None:
    """The epochs a data adapter has counted in this ``fit`` (None where it keeps no count).

    Keras 3.16 seeds the shuffle of ``ArrayDataAdapter`` and ``PyDatasetAdapter``
    from this count, which starts at 0 in every ``fit``: a resumed run sets it.
    Relies on: ``DataAdapter._epoch`` (Keras 3.16 on) -- tripwire
    ``test_exact_resume.py`` (pydataset_np, pydataset_inplace on keras-nightly) and
    ``test_mid_epoch.py::test_restart_from_a_step_checkpoint_in_process_is_exact`` (JAX).
    """
    epoch = getattr(adapter, "_epoch", None)
    return epoch if isinstance(epoch, int) else None


def set_adapter_epoch(adapter: Any, epoch: int) -> None:
    """Set the count :func:`adapter_epoch` returns (nothing where the adapter keeps none).

    Relies on: ``DataAdapter._epoch`` -- tripwire ``test_exact_resume.py`` (pydataset_np).
    """
    if adapter_epoch(adapter) is not None:
        adapter._epoch = int(epoch)
