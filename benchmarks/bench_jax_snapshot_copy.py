"""Three ways to take an asynchronous snapshot of a JAX CPU array that the next step donates, timed.

Usage::

    python3 benchmarks/bench_jax_snapshot_copy.py [--mib 128] [--rounds 4]

Why candle_ckpt's multi-process capture (:func:`candle_ckpt.multihost.save.capture_chunks`) copies each
shard into a host buffer on the training thread (docs/multi-worker.rst, "blocked in the hooks"). A jitted
step with ``donate_argnums=0`` (as Keras's JAX trainer compiles its train step) runs on an array of
``--mib`` MiB, after:

- ``host copy``: ``np.copyto`` of the array's no-copy view into a buffer kept from round to round (what
  candle_ckpt does): the hook blocks for the copy, then the step runs;
- ``view``: a no-copy NumPy view held while the step runs (no copy at all): JAX cannot donate the
  buffer, and the step takes longer;
- ``device copy``: ``jax.device_put(x, x.sharding, may_alias=False)``, dispatched without waiting:
  the hook returns at once, but the step runs after the copy.

Each line gives, per round, the hook's time and the time until the step's result is ready (both from the
hook's start), and whether the snapshot still equals the array's value before the step (it must).
"""

from __future__ import annotations

import argparse
import time
from functools import partial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    import jax
    import numpy as np

    @partial(jax.jit, donate_argnums=0)
    def step(x):
        return x * 1.0000001 + 1.0

    x = jax.numpy.asarray(np.random.default_rng(0).standard_normal(args.mib * 2**18, dtype=np.float32))
    buf = np.empty(x.shape, x.dtype)
    for _ in range(3):  # compiled, and the allocator warm
        x = step(x)
    x.block_until_ready()

    def host(x):
        np.copyto(buf, np.asarray(x))
        return buf

    def view(x):
        return np.asarray(x)

    def device(x):
        return jax.device_put(x, x.sharding, may_alias=False)

    for _ in range(args.rounds):
        began = time.perf_counter()
        x = step(x)
        x.block_until_ready()
        line = [f"step alone {1e3 * (time.perf_counter() - began):5.1f} ms"]
        for name, snap in (("host copy", host), ("view", view), ("device copy", device)):
            before = np.array(x)  # the value the snapshot must keep
            began = time.perf_counter()
            taken = snap(x)
            hook = time.perf_counter() - began
            x = step(x)
            x.block_until_ready()
            done = time.perf_counter() - began
            exact = np.array_equal(np.asarray(taken), before)
            line.append(f"{name}: hook {1e3 * hook:5.1f}, step done {1e3 * done:5.1f} ms, exact {exact}")
            del taken
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
