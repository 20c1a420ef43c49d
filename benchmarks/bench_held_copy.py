"""What the held copy of a validating epoch costs: one owned snapshot of the model's state, timed.

Usage::

    python3 benchmarks/bench_held_copy.py [--sizes 64 768] [--rounds 5]

A stop request during ``fit``'s validation is answered at once from the state held before the epoch's last step
(:class:`candle_ckpt.engine.capture.HeldStep`, docs/preemption.rst). That copy is taken on the training thread at
the epoch's second-to-last step call, in epochs that validate and whose window before the checkpoint was 5 s or
more: it is :meth:`candle_ckpt.keras.state.ModelState.snapshot` with ``copy=True``, what an asynchronous save
takes, into new arrays. The model is ``bench_checkpoint.py``'s (``Dense(2048)`` layers with Adam: 48 MiB of state
per layer; the layers closest to each size asked for). Prints the median seconds per size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 768], help="state sizes in MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import keras
    import numpy as np

    from candle_ckpt.keras.state import ModelState

    for mib in args.sizes:
        layers = max(1, round(mib / 48))
        model = keras.Sequential([keras.Input((2048,))] + [keras.layers.Dense(2048) for _ in range(layers)])
        model.compile("adam", "mse")
        model.fit(np.zeros((8, 2048), "float32"), np.zeros((8, 2048), "float32"), verbose=0, epochs=1)
        state, times = ModelState(model), []
        for _ in range(args.rounds):
            start = time.perf_counter()
            snap = state.snapshot(copy=True)
            times.append(time.perf_counter() - start)
            del snap
        print(f"{layers * 48} MiB of state: held copy {statistics.median(times):.3f} s (median of {args.rounds})")


if __name__ == "__main__":
    main()
