"""Shared pieces of the checkpoint benchmark: the model, the timed fit, the limits, peak RSS.

Imported by ``bench_checkpoint.py`` (run that one).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import h5py  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from candle_ckpt.keras.state import ModelState  # noqa: E402

WIDTH = 2048
LAYER_MIB = 3 * (WIDTH * WIDTH + WIDTH) * 4 / 2**20  # kernel + bias, and two Adam moments of each


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def build_model(state_mib: float) -> tuple[keras.Model, np.ndarray]:
    """Dense layers trained with Adam whose state (weights + two moments) is about ``state_mib``.

    ``Dense(2048)`` layers (48 MiB of state each) when a whole number of them
    comes within 5% of the size (768 MiB: 16, 3 GiB: 64); otherwise as many
    square layers as 48 MiB ones would round up to, narrower (64 MiB: two of
    1672; a few MiB: one small layer).
    """
    keras.utils.set_random_seed(0)
    layers = max(1, round(state_mib / LAYER_MIB))
    width = WIDTH
    if abs(layers * LAYER_MIB - state_mib) > 0.05 * state_mib:
        layers = max(1, math.ceil(state_mib / LAYER_MIB))
        width = max(8, int((state_mib * 2**20 / (12 * layers)) ** 0.5))
    model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width) for _ in range(layers)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse", jit_compile=False)
    x = np.random.RandomState(0).rand(8, width).astype("float32")
    model.fit(x, x, epochs=1, batch_size=8, verbose=0)  # builds the optimizer's variables
    return model, x


class Timed:
    """Times a contender's ``on_epoch_end`` and ``on_train_end`` in place.

    The two hooks are replaced on the instance by timed ones and the contender
    itself is given to ``fit``: a wrapper callback forwarding every hook would
    put its own frame between ``fit`` and the contender's ``on_train_begin``
    (candle_ckpt's fit guard takes the frame above that hook for ``fit``).
    """

    def __init__(self, inner: keras.callbacks.Callback) -> None:
        self.inner = inner
        self.epoch_end_s: list[float] = []
        self.train_end_s = 0.0
        epoch_end, train_end = inner.on_epoch_end, inner.on_train_end

        def on_epoch_end(epoch, logs=None) -> None:
            start = time.perf_counter()
            epoch_end(epoch, logs)
            self.epoch_end_s.append(time.perf_counter() - start)

        def on_train_end(logs=None) -> None:
            start = time.perf_counter()
            train_end(logs)
            self.train_end_s = time.perf_counter() - start

        inner.on_epoch_end = on_epoch_end
        inner.on_train_end = on_train_end
        # candle_ckpt takes its snapshot after every callback's on_epoch_end (issue 11), not inside its
        # own on_epoch_end: time the engine's save itself, the whole stall on the training thread.
        engine = getattr(inner, "engine", None)
        if engine is not None and callable(getattr(engine, "save", None)):
            save = engine.save

            def timed_save(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return save(*args, **kwargs)
                finally:
                    self.epoch_end_s.append(time.perf_counter() - start)

            engine.save = timed_save

            def on_epoch_end(epoch, logs=None) -> None:  # the save is timed above
                epoch_end(epoch, logs)

            inner.on_epoch_end = on_epoch_end


class Compute(keras.callbacks.Callback):
    """The simulated compute phase of each epoch (a sleep); records when each epoch starts."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.starts: list[float] = []

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.starts.append(time.perf_counter())
        time.sleep(self.seconds)

    def on_train_end(self, logs=None) -> None:
        self.starts.append(time.perf_counter())

    def epoch_wall(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]


class MemcpyAtEpochEnd(keras.callbacks.Callback):
    """The host-snapshot limit, where the stall is: one memcpy of every variable into
    preallocated buffers at each epoch end of the same kind of fit."""

    def on_train_begin(self, logs=None) -> None:
        self.variables = list(self.model.variables) + list(self.model.optimizer.variables)
        self.buffers = [np.empty_like(np.asarray(v.value.read_value())) for v in self.variables]

    def on_epoch_end(self, epoch, logs=None) -> None:
        for buf, v in zip(self.buffers, self.variables, strict=True):
            np.copyto(buf, np.asarray(v.value.read_value()))


class RawWriteAtEpochEnd(keras.callbacks.Callback):
    """The raw-write limit: at each epoch end a bare ``h5py`` write + ``fsync`` of the same
    arrays into a new file, the earlier files kept (fresh disk blocks, as a store that keeps
    its checkpoints writes)."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    def on_train_begin(self, logs=None) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self.state = ModelState(self.model)

    def on_epoch_end(self, epoch, logs=None) -> None:
        path = os.path.join(self.directory, f"raw-{epoch:03d}.h5")
        write_raw_h5(path, self.state.snapshot(copy=False).arrays())


def write_raw_h5(path: str, arrays: list[np.ndarray]) -> None:
    """The bare minimum a durable HDF5 checkpoint takes: one dataset per array, then fsync."""
    with h5py.File(path, "w") as f:
        for i, a in enumerate(arrays):
            f.create_dataset(f"vars/{i}", data=a)
        f.flush()
        os.fsync(f.id.get_vfd_handle())


def run_fit(model, x, epochs: int, compute_s: float, contender=None, initial_epoch: int = 0) -> dict:
    """One ``fit`` with the simulated compute phase; the contender's hooks are timed."""
    clock = Compute(compute_s)
    timed = Timed(contender) if contender is not None else None
    callbacks = [clock] + ([contender] if contender is not None else [])
    model.fit(
        x,
        x,
        epochs=initial_epoch + epochs,
        initial_epoch=initial_epoch,
        batch_size=8,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    out = {"epoch_wall_s": median(clock.epoch_wall())}
    if timed is not None:
        out.update(stall_s=median(timed.epoch_end_s), stalls=timed.epoch_end_s, train_end_s=timed.train_end_s)
    return out


class PeakRss:
    """Samples this process's resident set size on a thread; ``peak`` is the highest seen (bytes)."""

    def __init__(self, every_s: float = 0.002) -> None:
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakRss:
        self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def machine() -> dict:
    """Python, platform, CPUs, memory, Keras, h5py and orbax versions, and the load average."""
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "h5py": h5py.__version__,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        import orbax.checkpoint

        info["orbax_checkpoint"] = getattr(orbax.checkpoint, "__version__", "?")
    except ImportError:
        info["orbax_checkpoint"] = None
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info
