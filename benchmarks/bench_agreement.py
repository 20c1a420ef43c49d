"""The per-step cost of the multi-worker preemption agreement (``NoticeAgreement`` over TF's coordination service).

::

    python benchmarks/bench_agreement.py --steps 300 --out agreement.json

Starts two MultiWorkerMirroredStrategy workers on localhost (one process each,
CPU). Each builds a small model (``--width`` units, two Dense layers), runs a
custom training step (``strategy.run`` of a GradientTape step, with its
gradient all-reduce) and measures, as medians over ``--steps`` steps:

* **train step**: one training step alone;
* **agreement**: one ``NoticeAgreement.step_end`` when no worker asked (a
  counter increment and a flag read: no message);
* **step + agreement**: a training step followed by the agreement;
* **store calls**: calls to the coordination service during those steps
  (0 expected: the watcher thread blocks on its one read);
* **agree once**: the time from worker 0's request until every worker knows
  the save step (one O(N) agreement through the coordination service).

Prints a table (the chief's figures) and writes JSON. The previous protocol
ran one all-reduce of one scalar after every step: 1.9-2.1 ms per step on
this setup.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(steps: int, width: int, out: str) -> None:
    """Run in each worker process (``TF_CONFIG`` set)."""
    import keras
    import tensorflow as tf

    from candle_ckpt.core.group import scoped
    from candle_ckpt.distributed.tf_group import tf_group
    from candle_ckpt.engine.preempt_control import NoticeAgreement

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width), keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(1e-3)
        opt.build(model.trainable_variables)
    x = tf.random.stateless_normal((32, width), seed=(1, 2))
    y = tf.reduce_sum(x, axis=1, keepdims=True)

    @tf.function
    def train_step():
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce("SUM", strategy.run(step), axis=None)

    group = scoped(tf_group(strategy, 2), "bench")
    agreement = NoticeAgreement(group, timeout_s=120)
    agreement.start()
    for _ in range(10):  # warm up: tracing, the first collectives
        float(train_step())
        agreement.step_end(False)

    def timed(fn) -> list[float]:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return times

    time.sleep(0.5)  # the watcher is blocked on its read
    calls = sum(group.store.calls.values())
    train = timed(lambda: float(train_step()))
    agree = timed(lambda: agreement.step_end(False))
    both = timed(lambda: (float(train_step()), agreement.step_end(False)))
    result = {name: statistics.median(t) for name, t in (("train_s", train), ("agree_s", agree), ("both_s", both))}
    result["store_calls"] = sum(group.store.calls.values()) - calls
    start, first = time.perf_counter(), group.rank == 0
    while not agreement.step_end("bench" if first else False):  # each worker runs on to the agreed step
        first = False
        float(train_step())
    result["agree_once_s"] = time.perf_counter() - start
    agreement.close()
    group.close(60)
    with open(out, "w") as f:
        json.dump(result, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--out", default="agreement.json")
    args = parser.parse_args()
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("localhost", 0))
    workers = [f"localhost:{s.getsockname()[1]}" for s in socks]
    for s in socks:
        s.close()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"w{i}.json") for i in range(2)]
        procs = []
        for i in range(2):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", KERAS_BACKEND="tensorflow")
            env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
            cmd = [sys.executable, __file__, "--child", str(args.steps), str(args.width), outs[i]]
            procs.append(subprocess.Popen(cmd, env=env))
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise SystemExit(f"a worker failed with {p.returncode}")
        results = [json.load(open(o)) for o in outs]  # noqa: SIM115 - read once
    chief = results[0]
    report = {
        "steps": args.steps,
        "width": args.width,
        "workers": results,
        "agree_ms": round(chief["agree_s"] * 1e3, 3),
        "train_ms": round(chief["train_s"] * 1e3, 3),
        "overhead_ms": round((chief["both_s"] - chief["train_s"]) * 1e3, 3),
        "store_calls": [r["store_calls"] for r in results],
        "agree_once_ms": round(chief["agree_once_s"] * 1e3, 3),
    }
    print(f"{'median per step (chief)':<28}{'ms':>10}")
    print(f"{'train step':<28}{report['train_ms']:>10.3f}")
    print(f"{'agreement alone':<28}{report['agree_ms']:>10.3f}")
    print(f"{'step + agreement - step':<28}{report['overhead_ms']:>10.3f}")
    print(f"{'agree once (a request)':<28}{report['agree_once_ms']:>10.3f}")
    print(f"store calls during the steps: {report['store_calls']} (per worker)")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main()
