"""What a step checkpoint really costs training, against what the automatic interval counts, in one process.

Usage::

    python3 benchmarks/bench_step_cost.py [--every 430] [--steps 1720] [--epochs 17] [--out JSON]

Single uninterrupted runs cannot tell a 2% cost from the machine's drift: on a 2-core machine two runs of the
same setting differ by up to 10% a step. Here one process (the goodput job's model and data:
``benchmarks/goodput_job.py``, Keras 3 on JAX, 26 MB of state, ``fit`` with its defaults and validation data,
``candle_ckpt`` at its defaults but ``ckpt_save_steps=--every``) runs epochs that alternate:

* odd epochs take their step checkpoints (every ``--every`` steps);
* even epochs pass the same steps through the same code, but the step checkpoint's save is not called.

Both kinds end with the epoch's own checkpoint. So an odd epoch's time minus the mean of its two even
neighbours is what its step checkpoints cost training, drift cancelled. The first epoch (it compiles) and the
last (it has one neighbour) are not paired.

Reported, per step checkpoint: ``blocked`` (the seconds the save call held the training thread), ``counted``
(the cost the automatic interval uses: the blocked time plus the slowdown of the steps after it,
``engine/step_plan.py``; read from its moving record at the start of each even epoch), and ``paired`` (the
epoch difference above over the epoch's step checkpoints; median and mean of the pairs). ``overhead_at_every``
is the paired cost's share of an even epoch at ``--every``; ``overhead_at_bound`` what the automatic interval's
2% bound (``interval = counted / 0.02``) costs when a save really costs ``paired``: ``0.02 * paired / counted``.

The job wraps ``StepPlan.step_end`` (a private method of the package) to skip the save in even epochs: a
measurement seam of this benchmark only. If the method changes, the job fails at once, naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OVERHEAD = 0.02  # engine/interval.OVERHEAD, repeated so that analysis needs no import of the package

JOB = r"""
import json, os, sys, time
os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path[:0] = [sys.argv[5], sys.argv[6]]
import goodput_job as gj
import keras
import candle_ckpt
from candle_ckpt.engine import step_plan

every, steps, epochs, directory = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
saves, blocked, counted = {}, {}, {}
original = step_plan.StepPlan.step_end
assert "save" in original.__code__.co_varnames, "StepPlan.step_end(step, step_s, save, ...) changed"


def step_end(self, step, step_s, save, *, epoch=0, of=None):
    def measured(kind):
        saves[epoch] = saves.get(epoch, 0) + 1
        if epoch % 2:  # odd epochs save; even ones pass the same steps without the save
            began = time.perf_counter()
            save(kind)
            blocked.setdefault(epoch, []).append(time.perf_counter() - began)

    if epoch % 2 == 0 and epoch not in counted and saves.get(epoch - 1):
        # the odd epoch's costs as counted: its newest ones (the policy keeps three)
        counted[epoch] = self.policy.saves[-saves[epoch - 1]:]
    return original(self, step, step_s, measured, epoch=epoch, of=of)


step_plan.StepPlan.step_end = step_end


class Times(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch, "s": time.perf_counter() - self.began, "saves": saves.get(epoch, 0),
               "blocked": blocked.get(epoch, []), "counted": counted.get(epoch, [])}
        print("ROW " + json.dumps(row), flush=True)

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


x, y, validation = gj.data(steps)
model = gj.build()
params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_steps": every}
candle_ckpt.restart(params, model)
model.fit(x, y, batch_size=gj.BATCH, epochs=epochs, validation_data=validation, verbose=0,
          callbacks=[Times(), candle_ckpt.CandleCheckpointCallback(params)])
"""


def analyse(rows: list[dict]) -> dict:
    """The per-save figures of the module docstring from the job's epoch rows (epoch, s, saves, blocked,
    counted). Raises ValueError when there is no odd epoch with two even neighbours that took step checkpoints."""
    by = {r["epoch"]: r for r in rows}
    pairs = []
    for epoch in sorted(by):
        row = by[epoch]
        if epoch % 2 == 0 or epoch - 1 not in by or epoch + 1 not in by or epoch - 1 == 0 or not row["blocked"]:
            continue  # epoch 0 compiles: an odd epoch next to it is not paired
        base = (by[epoch - 1]["s"] + by[epoch + 1]["s"]) / 2
        pairs.append((row["s"] - base) / len(row["blocked"]))
    if not pairs:
        raise ValueError("no odd epoch with step checkpoints between two even epochs: give --epochs >= 5")
    blocked = [b for r in rows for b in r["blocked"]]
    counted = [c for r in rows for c in r["counted"]]
    even = [r["s"] for r in rows if r["epoch"] % 2 == 0 and r["epoch"] > 0]
    paired = statistics.median(pairs)
    saves_per_epoch = statistics.median(len(r["blocked"]) for r in rows if r["blocked"])
    out = {
        "pairs": len(pairs),
        "blocked_s": statistics.mean(blocked),
        "counted_s": statistics.mean(counted) if counted else None,
        "paired_s": paired,
        "paired_mean_s": statistics.mean(pairs),
        "paired_per_pair_s": pairs,
        "even_epoch_s": statistics.median(even),
        "saves_per_epoch": saves_per_epoch,
        "overhead_at_every": paired * saves_per_epoch / statistics.median(even),
    }
    out["overhead_at_bound"] = OVERHEAD * paired / out["counted_s"] if out["counted_s"] else None
    return out


def run(every: int, steps: int, epochs: int) -> list[dict]:
    """One job in a fresh process; its epoch rows."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
        args = [str(every), str(steps), str(epochs), tmp + "/ck", str(HERE), str(REPO)]
        done = subprocess.run([sys.executable, "-c", JOB, *args], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"the job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=430, help="ckpt_save_steps (default 430: about 2.5 s here)")
    parser.add_argument("--steps", type=int, default=1720, help="train steps an epoch")
    parser.add_argument("--epochs", type=int, default=17, help="epochs (odd: the last is even)")
    parser.add_argument("--out", default=None, help="the JSON (default: benchmarks/results/step-cost-DATE.json)")
    args = parser.parse_args()
    if args.every < 1 or args.steps < args.every or args.epochs < 5:
        parser.error("--every must be >= 1 and <= --steps, and --epochs >= 5")
    began = time.time()
    rows = run(args.every, args.steps, args.epochs)
    result = {"args": vars(args), "load": os.getloadavg(), "seconds": time.time() - began, "rows": rows}
    result.update(analyse(rows))
    out = Path(args.out or HERE / "results" / f"step-cost-{time.strftime('%Y-%m-%d')}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['pairs']} pairs, {result['saves_per_epoch']} step checkpoints an epoch of "
          f"{result['even_epoch_s']:.2f} s")  # fmt: skip
    for name in ("blocked_s", "counted_s", "paired_s", "paired_mean_s"):
        print(f"  {name:14} {result[name]:.4f}")
    print(f"  overhead at --every {args.every}: {100 * result['overhead_at_every']:.2f}%; at the 2% bound: "
          f"{100 * result['overhead_at_bound']:.2f}%")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
