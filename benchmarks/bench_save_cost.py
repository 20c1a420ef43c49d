"""What a checkpoint really costs training, measured within one process, where the machine's drift cancels.

Usage::

    python3 benchmarks/bench_save_cost.py --kind step [--every 430] [--steps 1720] [--epochs 17] [--out JSON]
    python3 benchmarks/bench_save_cost.py --kind epoch [--modes sync async floor] [--steps 389] [--epochs 85]
        [--block 4] [--out JSON]

Single uninterrupted runs cannot tell a 2% cost from the machine's drift: on a 2-core machine two runs of the
same setting differ by up to 10% a step. Here each job is one process (the goodput job's model and data:
``benchmarks/goodput_job.py``, Keras 3 on JAX, 26 MB of state, ``fit`` with its defaults and validation data)
whose epochs alternate between saving and not saving, so that each saving stretch is compared with its
neighbours in the same process.

``--kind step``: ``candle_ckpt`` at its defaults but ``ckpt_save_steps=--every``.

* odd epochs take their step checkpoints (every ``--every`` steps);
* even epochs pass the same steps through the same code, but the step checkpoint's save is not called.

Both kinds end with the epoch's own checkpoint. So an odd epoch's time minus the mean of its two even
neighbours is what its step checkpoints cost training. The first epoch (it compiles) and the last (it has one
neighbour) are not paired. Reported, per step checkpoint: ``blocked`` (the seconds the save call held the
training thread), ``counted`` (the cost the automatic interval uses: the blocked time plus the slowdown of the
steps after it, ``engine/step_plan.py``; read from its moving record at the start of each even epoch), and
``paired`` (the epoch difference above over the epoch's step checkpoints; median and mean of the pairs).
``overhead_at_every`` is the paired cost's share of an even epoch at ``--every``; ``overhead_at_bound`` what the
automatic interval's 2% bound (``interval = counted / 0.02``) costs when a save really costs ``paired``:
``0.02 * paired / counted``.

``--kind epoch``: the epoch checkpoint, ``ckpt_save_steps=0`` (no step checkpoint), one process per mode:
``sync`` (``ckpt_async=false``), ``async`` (``ckpt_async=true``) and ``floor`` (no checkpointer: every weight
and optimizer variable written to one file and fsynced, ``goodput_job.BareWrite``); on request Keras's own
``modelcheckpoint`` (``ModelCheckpoint`` to one ``.keras`` file) and ``orbax`` (``OrbaxCheckpoint``, at its
defaults: asynchronous). Blocks of ``--block``
epochs alternate between saving every epoch end and saving none (the first block compiles and is left out;
the last epoch is always saved, as a run's end is). An epoch is timed from its beginning to the next one's,
so a save's effect on the steps after it counts. Reported per mode: ``paired`` (a saving block's mean epoch
minus the mean of its two neighbours' means: the cost of one epoch checkpoint; median and mean of the pairs),
the epoch time, and ``overhead`` (``paired`` over the epoch time).

The jobs wrap a private method of the package to skip a save (``StepPlan.step_end``,
``CandleCheckpointCallback._save``): a measurement seam of this benchmark only. If one changes, the job fails at
once, naming it.
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
sys.path[:0] = [str(HERE), str(REPO)]  # the jobs' paths too: goodput_job, and this checkout's candle_ckpt

from bench_goodput import machine  # noqa: E402

from candle_ckpt.engine.interval import OVERHEAD  # noqa: E402

MODES = ["sync", "async", "floor", "modelcheckpoint", "orbax"]

PRELUDE = r"""
import json, os, sys, time
sys.path[:0] = sys.argv[-2:]  # benchmarks/ and the repository (run() passes them last)
import goodput_job as gj
import keras
import candle_ckpt


class Stateless(keras.callbacks.Callback):
    # a timing callback: nothing to save with a checkpoint (so candle_ckpt does not warn about its attributes)
    def get_state(self):
        return {}

    def set_state(self, state):
        pass
"""

STEP_JOB = (
    PRELUDE
    + r"""
from candle_ckpt.engine import step_plan

every, steps, epochs, directory = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
saves, blocked, counted = {}, {}, {}
original = step_plan.StepPlan.step_end
assert "save" in original.__code__.co_varnames, "StepPlan.step_end(step, step_s, save, ...) changed"


def step_end(self, step, step_s, save, *, epoch=0, of=None):
    def measured(kind, **how):  # how: background=True (a periodic one, written as an epoch's)
        saves[epoch] = saves.get(epoch, 0) + 1
        if epoch % 2:  # odd epochs save; even ones pass the same steps without the save
            began = time.perf_counter()
            save(kind, **how)
            blocked.setdefault(epoch, []).append(time.perf_counter() - began)

    if epoch % 2 == 0 and epoch not in counted and saves.get(epoch - 1):
        # the odd epoch's costs as counted: its newest ones (the policy keeps three)
        counted[epoch] = self.policy.saves[-saves[epoch - 1]:]
    return original(self, step, step_s, measured, epoch=epoch, of=of)


step_plan.StepPlan.step_end = step_end


class Times(Stateless):
    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch, "s": time.perf_counter() - self.began, "saves": saves.get(epoch, 0),
               "blocked": blocked.get(epoch, []), "counted": counted.get(epoch, [])}
        print("ROW " + json.dumps(row), flush=True)


x, y, validation = gj.data(steps)
model = gj.build()
params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_steps": every}
candle_ckpt.restart(params, model)
model.fit(x, y, batch_size=gj.BATCH, epochs=epochs, validation_data=validation, verbose=0,
          callbacks=[Times(), candle_ckpt.CandleCheckpointCallback(params)])
"""
)


EPOCH_JOB = (
    PRELUDE
    + r"""
from candle_ckpt.keras import callback

mode, steps, epochs, block, directory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]


def saving(epoch):
    return (epoch // block) % 2 == 1 or epoch + 1 >= epochs


original = callback.CandleCheckpointCallback._save
assert original.__code__.co_varnames[:3] == ("self", "epoch", "logs"), "CandleCheckpointCallback._save changed"


def _save(self, epoch, logs):
    if saving(epoch):
        return original(self, epoch, logs)


callback.CandleCheckpointCallback._save = _save


def toggled(cls):
    # a Keras callback that saves at epoch ends, made to save only in saving epochs
    class Toggled(cls):
        def on_epoch_end(self, epoch, logs=None):
            if saving(epoch):
                super().on_epoch_end(epoch, logs)

    return Toggled


KERAS = {
    "floor": lambda: toggled(gj.BareWrite)(directory),
    "modelcheckpoint": lambda: toggled(keras.callbacks.ModelCheckpoint)(os.path.join(directory, "model.keras")),
    "orbax": lambda: toggled(keras.callbacks.OrbaxCheckpoint)(directory),
}


begins = []


class Times(Stateless):
    def on_epoch_begin(self, epoch, logs=None):
        begins.append(time.perf_counter())

    def on_train_end(self, logs=None):
        begins.append(time.perf_counter())


x, y, validation = gj.data(steps)
model = gj.build()
callbacks = [Times()]
if mode in KERAS:
    callbacks.append(KERAS[mode]())
else:
    params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_steps": 0, "ckpt_async": mode == "async"}
    candle_ckpt.restart(params, model)
    callbacks.append(candle_ckpt.CandleCheckpointCallback(params))
model.fit(x, y, batch_size=gj.BATCH, epochs=epochs, validation_data=validation, verbose=0, callbacks=callbacks)
print("EPOCHS " + json.dumps([b - a for a, b in zip(begins, begins[1:])]), flush=True)
"""
)


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


def analyse_blocks(epochs_s: list[float], block: int) -> dict:
    """``--kind epoch``'s figures from one job's epoch times (beginning to beginning; the last epoch's to the
    end of ``fit``): blocks of ``block`` epochs, odd blocks saving. Raises ValueError when no saving block has
    two whole neighbours after the first block."""
    # block 0 compiles; a block is whole without the run's last epoch (saved in any block)
    whole = (len(epochs_s) - 1) // block
    means = {index: statistics.mean(epochs_s[index * block : (index + 1) * block]) for index in range(1, whole)}
    pairs = [means[k] - (means[k - 1] + means[k + 1]) / 2 for k in means if k % 2 and k - 1 in means and k + 1 in means]
    if not pairs:
        raise ValueError(f"no saving block between two whole blocks: give --epochs >= {5 * block + 1}")
    quiet = [means[k] for k in means if k % 2 == 0]
    paired = statistics.median(pairs)
    return {
        "pairs": len(pairs),
        "paired_s": paired,
        "paired_mean_s": statistics.mean(pairs),
        "paired_per_pair_s": pairs,
        "epoch_s": statistics.median(quiet),
        "overhead": paired / statistics.median(quiet),
    }


def run(job: str, *args: object) -> str:
    """One job in a fresh process (its checkpoint directory a new temporary one); its standard output."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
        argv = [*(str(a) for a in args), tmp + "/ck", str(HERE), str(REPO)]
        done = subprocess.run([sys.executable, "-c", job, *argv], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"the job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def step_rows(every: int, steps: int, epochs: int) -> list[dict]:
    out = run(STEP_JOB, every, steps, epochs)
    return [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]


def epoch_times(mode: str, steps: int, epochs: int, block: int) -> list[float]:
    out = run(EPOCH_JOB, mode, steps, epochs, block)
    return next(json.loads(line[7:]) for line in out.splitlines() if line.startswith("EPOCHS "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", choices=["step", "epoch"], required=True, help="which checkpoint to cost")
    parser.add_argument("--every", type=int, default=430, help="step: ckpt_save_steps (default 430: about 2.5 s)")
    parser.add_argument(
        "--modes", nargs="+", choices=MODES, default=MODES[:3], help="epoch: what saves (default: %(default)s)"
    )
    parser.add_argument("--block", type=int, default=4, help="epoch: epochs a block (default 4)")
    parser.add_argument("--steps", type=int, default=None, help="train steps an epoch (step 1720, epoch 389)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (step 17, epoch 85)")
    parser.add_argument("--out", default=None, help="the JSON (default: benchmarks/results/KIND-cost-DATE.json)")
    args = parser.parse_args()
    step = args.kind == "step"
    args.steps = args.steps or (1720 if step else 389)
    args.epochs = args.epochs or (17 if step else 85)
    if step and (args.every < 1 or args.steps < args.every or args.epochs < 5):
        parser.error("--every must be >= 1 and <= --steps, and --epochs >= 5")
    if not step and (args.block < 1 or args.epochs < 5 * args.block + 1):
        parser.error("--block must be >= 1 and --epochs >= 5 x --block + 1")
    began = time.time()
    result: dict = {"args": vars(args), "machine": machine()}
    if step:
        rows = step_rows(args.every, args.steps, args.epochs)
        result.update(rows=rows, **analyse(rows))
        print(f"{result['pairs']} pairs, {result['saves_per_epoch']} step checkpoints an epoch of "
              f"{result['even_epoch_s']:.2f} s")  # fmt: skip
        for name in ("blocked_s", "counted_s", "paired_s", "paired_mean_s"):
            print(f"  {name:14} {result[name]:.4f}")
        print(f"  overhead at --every {args.every}: {100 * result['overhead_at_every']:.2f}%; at the 2% bound: "
              f"{100 * result['overhead_at_bound']:.2f}%")  # fmt: skip
    else:
        result["modes"] = {}
        for mode in args.modes:
            times = epoch_times(mode, args.steps, args.epochs, args.block)
            figures = result["modes"][mode] = {
                "epochs_s": times,
                "load": os.getloadavg(),
                **analyse_blocks(times, args.block),
            }
            print(f"{mode:6} {figures['pairs']} pairs: {figures['paired_s']:.4f} s an epoch checkpoint (mean "
                  f"{figures['paired_mean_s']:.4f}) on {figures['epoch_s']:.2f}-s epochs: "
                  f"{100 * figures['overhead']:+.1f}%")  # fmt: skip
    result["seconds"] = time.time() - began
    out = Path(args.out or HERE / "results" / f"{args.kind}-cost-{time.strftime('%Y-%m-%d')}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
