"""A restart's start-up: our import cost, and JAX's persistent compilation cache (``ckpt_compile_cache``).

Usage::

    python3 benchmarks/bench_startup.py [--repeats 3] [--imports 7] [--out benchmarks/results/bench-startup.json]

Two tables, medians over fresh processes:

* imports: ``import keras`` alone, then ``import candle_ckpt`` after it, then the names a job touches
  (``ckpt_parser``, ``restart``, ``CandleCheckpointCallback``), under ``KERAS_BACKEND=jax`` and ``tensorflow``
  (TensorFlow installed, as users have it);
* compile cache: the goodput job's shape (Keras 3 on JAX, CPU, a 3x1024 Dense model with Adam, ``restart()``,
  the callback, ``fit`` with validation), a first run and then a restart, with ``ckpt_compile_cache=off``,
  ``auto`` (set by ``restart()``, after the model is built) and ``auto`` with ``JAX_COMPILATION_CACHE_DIR``
  pointing at the same directory from the job's start (the model's construction cached too). Columns: process
  start to ``fit``, ``fit`` to the first step's end, ``fit`` to the first epoch's end (the validation step's
  compile and the save included), and the cache's size on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_IMPORT_SNIPPETS = {
    "keras": "import keras",
    "+ import candle_ckpt": "import keras\nt1 = time.perf_counter()\nimport candle_ckpt",
    "+ the job's names": (
        "import keras\nt1 = time.perf_counter()\nimport candle_ckpt\n"
        "candle_ckpt.ckpt_parser, candle_ckpt.restart, candle_ckpt.CandleCheckpointCallback"
    ),
}

JOB = r"""
import json, os, sys, time
T0 = time.perf_counter()
import keras, numpy as np
import candle_ckpt
directory, epochs, setting = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 64)).astype("float32")
y = rng.normal(size=(4096, 64)).astype("float32")
model = keras.Sequential(
    [keras.Input((64,))] + [keras.layers.Dense(1024, activation="relu") for _ in range(3)] + [keras.layers.Dense(64)]
)
model.compile(optimizer="adam", loss="mse")
params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_compile_cache": setting}
info = candle_ckpt.restart(params, model, verbose=False)
marks = {}


class Marks(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        marks["fit"] = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        marks.setdefault("step", time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        marks.setdefault("epoch", time.perf_counter())


ckpt = candle_ckpt.CandleCheckpointCallback(params, verbose=False)
model.fit(x, y, validation_split=0.2, batch_size=128, epochs=epochs, initial_epoch=info["epoch"] if info else 0,
          callbacks=[Marks(), ckpt], verbose=0)
print("RESULT " + json.dumps({"to_fit": marks["fit"] - T0, "first_step": marks["step"] - marks["fit"],
                              "first_epoch": marks["epoch"] - marks["fit"]}))
"""


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_imports(runs: int) -> dict[str, dict[str, float]]:
    """Median seconds of each import snippet, whole and after ``import keras``, per backend."""
    out: dict[str, dict[str, float]] = {}
    for backend in ("jax", "tensorflow"):
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
        for name, body in _IMPORT_SNIPPETS.items():
            total, ours = [], []
            for _ in range(runs):
                code = (
                    "import time\nt0 = time.perf_counter()\nt1 = None\n" + body + "\nt2 = time.perf_counter()\n"
                    "print(t2 - t0, (t2 - t1) if t1 else 0.0)"
                )
                proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
                whole, after = map(float, proc.stdout.split()[-2:])
                total.append(whole)
                ours.append(after)
            out[f"{backend}: {name}"] = {"total_s": _median(total), "after_keras_s": _median(ours)}
            print(f"{backend:10s} {name:22s} total {_median(total):6.3f} s   after keras {_median(ours) * 1e3:6.1f} ms")
    return out


def _run_job(script: Path, directory: Path, epochs: int, setting: str, env_cache: bool) -> dict[str, float]:
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if env_cache:
        env["JAX_COMPILATION_CACHE_DIR"] = str(directory / "ckpts" / "compile-cache")
    proc = subprocess.run(
        [sys.executable, str(script), str(directory), str(epochs), setting],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.split(" ", 1)[1])


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def bench_compile_cache(repeats: int) -> dict[str, dict[str, float]]:
    """Medians of the job's start-up marks, first run and restart, per cache setting."""
    modes = {
        "off": ("off", False),
        "auto (restart() sets it)": ("auto", False),
        "auto + env from start": ("auto", True),
    }
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        samples: dict[str, list[dict[str, float]]] = {}
        sizes: dict[str, list[int]] = {}
        for _ in range(repeats):
            for mode, (setting, env_cache) in modes.items():  # interleaved: load changes hit every mode alike
                directory = Path(tmp) / "job"
                shutil.rmtree(directory, ignore_errors=True)
                for run, epochs in (("first run", 1), ("restart", 2)):
                    samples.setdefault(f"{mode}: {run}", []).append(
                        _run_job(script, directory, epochs, setting, env_cache)
                    )
                sizes.setdefault(mode, []).append(_du(directory / "ckpts" / "compile-cache"))
        for key, runs in samples.items():
            row = {k: _median([r[k] for r in runs]) for k in ("to_fit", "first_step", "first_epoch")}
            row["cache_bytes"] = _median(sizes[key.split(": ")[0]])
            out[key] = row
            print(
                f"{key:40s} start to fit {row['to_fit']:6.2f} s   fit to 1st step {row['first_step']:6.2f} s   "
                f"fit to 1st epoch end {row['first_epoch']:6.2f} s   cache {row['cache_bytes'] / 1024:6.0f} KiB"
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="job pairs (first run, restart) per cache setting")
    parser.add_argument("--imports", type=int, default=7, help="fresh processes per import snippet")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bench-startup.json"))
    parser.add_argument("--skip-imports", action="store_true")
    args = parser.parse_args()
    result = {"load_average_before": os.getloadavg()}
    if not args.skip_imports:
        result["imports"] = bench_imports(args.imports)
    result["compile_cache"] = bench_compile_cache(args.repeats)
    result["load_average_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out, "load average", result["load_average_after"])


if __name__ == "__main__":
    main()
