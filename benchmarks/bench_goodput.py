"""Goodput under failures: no checkpointing, Keras ``BackupAndRestore``, Keras ``OrbaxCheckpoint`` and candle_ckpt.

Usage::

    pip install -e .[bench]                                   # orbax-checkpoint and matplotlib
    python3 benchmarks/bench_goodput.py --schedule A          # 60 epochs of ~2 s; every 10-20 s SIGTERM or SIGKILL
    python3 benchmarks/bench_goodput.py --schedule B          # 10 epochs of ~20 s; a SIGKILL every 30-90 s
    python3 benchmarks/bench_goodput.py --quick               # a few minutes: does it all work?
    python3 benchmarks/bench_goodput.py --plot-only R1.json R2.json --plot out.png

Every contender runs the same job (``goodput_job.py``: Keras 3 on JAX, CPU, 3 x Dense(1024) with Adam, about
26 MB of state, ``fit`` with ``shuffle=True`` and validation data), first once without interruption, then under
the same seeded schedule of interruptions (``goodput_lib.schedule``), restarted at once after each until it
completes. The job timestamps itself into a JSON-lines file (process start before any import, model built,
restore done, first batch end, every batch and epoch end), so the breakdown is measured the same way for all.
A floor, ``write`` (every weight and optimizer variable written to one file and fsynced at each epoch end, nothing
restored), runs uninterrupted only: the overhead that any checkpoint of every epoch costs on this machine.

Reported per contender:

- **goodput**: the uninterrupted wall time of the job without checkpointing (launch to exit) over the wall time
  to completion under the schedule;
- **lost seconds per interruption**, split into start-up (the restarted process's launch to its restore's start:
  interpreter, imports, model build), restore (to ``fit``'s ``on_train_begin``: it includes ``fit``'s own set-up,
  which the run without checkpointing shows alone), compile (its first train step beyond an ordinary step), lost
  work (the training since the last durable save, redone) and other (the rest: a SIGTERM's grace and the save in
  it, the exit, training slower than uninterrupted);
- **overhead without failures**: the training time (first batch end to the end of ``fit``) of the uninterrupted
  run with the contender over that without checkpointing, minus 1;
- **exact**: whether the final weights and optimizer variables equal, bit for bit, those of the contender's own
  uninterrupted run (and those of the run without checkpointing);
- the **start-up floor**: the job without checkpointing, from launch to its first finished step.

The load average is sampled at every launch and written with the result: on a shared machine timings are noisy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import goodput_lib as G  # noqa: E402
import goodput_report as R  # noqa: E402

HERE = Path(__file__).resolve().parent
JOB = HERE / "goodput_job.py"
CONTENDERS = ("none", "backup", "orbax", "candle", "write", "candle-mtbf")
DEFAULT_CONTENDERS = CONTENDERS[:-1]  # candle-mtbf on request: a setting, not the defaults
NAMES = {
    "none": "no checkpointing",
    "backup": "Keras BackupAndRestore",
    "orbax": "Keras OrbaxCheckpoint",
    "candle": "candle_ckpt (defaults)",
    "candle-mtbf": "candle_ckpt, ckpt_mtbf = the schedule's mean interval",
    "write": "floor: state written + fsync each epoch",
}
FLOORS = ("write",)  # not checkpointers: measured uninterrupted only, for the overhead


class Runner:
    """Launches the job's processes for one contender and reads back their timestamps."""

    def __init__(
        self, contender: str, work: Path, epochs: int, steps: int, loads: list[float], tag: str, mtbf: float = 0.0
    ) -> None:
        self.contender, self.work, self.epochs, self.steps, self.loads = contender, work, epochs, steps, loads
        self.count, self.tag = 0, tag  # the files of launch n: <contender>-<tag><n>.jsonl and .log
        self.mtbf = mtbf  # candle-mtbf's ckpt_mtbf: the schedule's mean interval (stretched as the schedule is)

    def launch(self, directory: Path, plan: tuple[float, str] | None) -> dict:
        """One process; ``plan``: ``(seconds after launch, "TERM" | "KILL")`` or None (run to its end)."""
        self.count += 1
        events = self.work / f"{self.contender}-{self.tag}{self.count}.jsonl"
        log = open(self.work / f"{self.contender}-{self.tag}{self.count}.log", "w")  # noqa: SIM115
        cmd = [sys.executable, str(JOB), "--contender", self.contender, "--dir", str(directory)]
        cmd += ["--events", str(events), "--epochs", str(self.epochs), "--steps", str(self.steps)]
        if self.contender == "candle-mtbf":
            cmd += ["--mtbf", f"{self.mtbf:.1f}"]
        env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
        self.loads.append(os.getloadavg()[0])
        launch = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        signal_at, kind = None, None
        try:
            proc.wait(timeout=plan[0] if plan else None)
        except subprocess.TimeoutExpired:
            signal_at, kind = time.time(), plan[1]
            proc.send_signal(signal.SIGTERM if kind == "TERM" else signal.SIGKILL)
            try:
                proc.wait(timeout=G.GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        finally:
            log.close()
        out = read_events(events)
        out.update(launch=launch, exit=time.time(), rc=proc.returncode, signal_at=signal_at, signal=kind)
        return out


def read_events(path: Path) -> dict:
    """The process dict of :mod:`goodput_lib` from a job's JSON-lines file (a line cut by a SIGKILL is skipped)."""
    out: dict = {"steps": [], "epochs": []}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = ev["ev"]
        if kind == "steps":
            out["steps"] += ev["steps"]
        elif kind == "epoch":
            out["epochs"].append([ev["t"], ev["epoch"]])
        elif kind == "resumed":
            out["resumed"] = ev["step"]
        elif kind == "restored":  # a finished run's rerun trains no epoch: its restored step is where it "resumed"
            out["restored"] = ev["t"]
            out.setdefault("resumed", ev.get("optimizer_step", 0))
        elif kind == "done":
            out.update(done=ev["t"], digests=ev["digests"], state_bytes=ev["state_bytes"])
        elif kind in ("t0", "built", "first"):
            out[kind] = ev["t"]
    return out


def uninterrupted(runner: Runner) -> dict:
    """The contender's job once, to its end: its wall time, start, training time and final state."""
    with tempfile.TemporaryDirectory(dir=runner.work) as tmp:
        p = runner.launch(Path(tmp) / "ck", None)
    if "done" not in p:
        raise RuntimeError(f"{runner.contender}: the uninterrupted run failed (status {p['rc']}); see {runner.work}")
    step_s = G.step_time([p])
    return {
        "wall_s": p["exit"] - p["launch"],
        "to_first_step_s": p["first"] - p["launch"],
        "train_s": p["done"] - p["first"],
        "step_s": step_s,
        "start": G.start_parts(p, step_s),
        "state_bytes": p["state_bytes"],
        "digests": p["digests"],
    }


def under_schedule(runner: Runner, plan: list[tuple[float, str]], cap_s: float) -> dict:
    """The job under ``plan`` until it completes, crash-loops (5 crashes in a row) or passes ``cap_s`` of wall."""
    processes: list[dict] = []
    crashes, i, start = 0, 0, time.time()
    with tempfile.TemporaryDirectory(dir=runner.work) as tmp:
        directory = Path(tmp) / "ck"
        while True:
            p = runner.launch(directory, plan[i])
            processes.append(p)
            if "done" in p and p["rc"] == 0:
                return {"completed": True, "processes": processes}
            if p["signal_at"] is None:  # it ended by itself, unfinished: a crash (the next launch keeps its plan)
                crashes += 1
            else:
                crashes, i = 0, i + 1
            if crashes >= 5 or time.time() - start > cap_s:
                why = "crashed 5 times in a row" if crashes >= 5 else f"not complete after {cap_s:.0f} s"
                return {"completed": False, "why": why, "processes": processes, "tail": _tail(runner)}


def _tail(runner: Runner) -> str:
    log = runner.work / f"{runner.contender}-{runner.tag}{runner.count}.log"
    return log.read_text()[-1500:] if log.exists() else ""


def calibrate(work: Path, epoch_s: float, loads: list[float]) -> tuple[int, float]:
    """Steps per epoch for ``epoch_s`` seconds, from a short run's median step time."""
    p = Runner("none", work, 2, 40, loads, "calibrate").launch(work / "calibrate", None)
    step_s = G.step_time([{"steps": [s for s in p["steps"] if s[1] > 40]}])
    return max(1, round(epoch_s / step_s)), step_s


def contender_result(c: str, base: dict, run: dict, sched: dict, none_digests: dict) -> dict:
    """One contender's figures from its uninterrupted run and its run under the schedule."""
    out = {"name": NAMES[c], "uninterrupted": {k: v for k, v in run.items() if k != "digests"}}
    out["overhead"] = run["train_s"] / base["train_s"] - 1.0
    out["overhead_wall"] = run["wall_s"] / base["wall_s"] - 1.0
    procs = sched["processes"]
    out["completed"] = sched["completed"]
    out["launches"] = [
        {k: p.get(k) for k in ("rc", "signal", "resumed", "launch", "exit", "signal_at", "t0", "built", "first")}
        for p in procs
    ]
    if not sched["completed"]:
        out.update(goodput=0.0, why=sched["why"], tail=sched.get("tail", ""))
        return out
    out.update(G.split(procs, base["wall_s"]))
    out["goodput_vs_own_uninterrupted"] = run["wall_s"] / out["wall_s"]  # the failures' cost alone
    final = procs[-1]["digests"]
    out["exact"] = final == run["digests"]
    out["equal_to_no_checkpointing"] = final == none_digests
    out["differ"] = sorted(k for k in final if final[k] != run["digests"].get(k))[:8]
    return out


def overhead_rounds(none: list[dict], runs: list[dict]) -> dict:
    """The overhead without failures over interleaved rounds: each round's training time against that round's job
    without checkpointing, the median taken (``overhead``; each round's in ``overhead_each``)."""
    each = [run["train_s"] / base["train_s"] - 1.0 for base, run in zip(none, runs, strict=True)]
    walls = [run["wall_s"] / base["wall_s"] - 1.0 for base, run in zip(none, runs, strict=True)]
    return {"overhead": statistics.median(each), "overhead_each": each, "overhead_wall": statistics.median(walls)}


def bench(args: argparse.Namespace) -> dict:
    """Every contender, uninterrupted then under the schedule; the result dict."""
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)  # --work-dir names a folder to make, as --out does
    work = Path(tempfile.mkdtemp(prefix="goodput-", dir=args.work_dir))
    loads: list[float] = []
    load_start = [round(x, 2) for x in os.getloadavg()]
    steps, cal_step_s = (args.steps, None) if args.steps else calibrate(work, args.epoch_s, loads)
    plan = [(s * args.interval_x, kind) for s, kind in G.schedule(args.schedule, args.seed)]
    mtbf = statistics.mean(G.SCHEDULES[args.schedule]["every_s"]) * args.interval_x
    names = dict.fromkeys(["none", *args.contenders])  # the run without checkpointing first: the baseline
    rounds: dict[str, list[dict]] = {c: [] for c in names}
    for r in range(args.overhead_runs):  # interleaved: a slow minute of the machine falls on every contender alike
        for c in names:
            rounds[c].append(uninterrupted(Runner(c, work, args.epochs, steps, loads, f"whole{r or ''}", mtbf)))
    runs = {c: rounds[c][0] for c in names}
    base = {**runs["none"], "wall_s": statistics.median(x["wall_s"] for x in rounds["none"])}
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "schedule": args.schedule,
        "seed": args.seed,
        "interval_x": args.interval_x,
        "spec": G.SCHEDULES[args.schedule],
        "epochs": args.epochs,
        "steps_per_epoch": steps,
        "calibrated_step_s": cal_step_s,
        "first_interruptions": plan[:12],
        "uninterrupted_s": base["wall_s"],
        "startup_floor_s": base["to_first_step_s"],
        "floor_parts": base["start"],
        "machine": machine(),
        "loadavg_start": load_start,
        "work_dir": str(work),
        "contenders": {},
    }
    cap = max(args.max_wall_x * base["wall_s"], 300.0)
    for c in args.contenders:
        if c == "none" and max(s for s, _ in plan) < base["wall_s"]:
            result["contenders"][c] = {
                "name": NAMES[c],
                "completed": False,
                "goodput": 0.0,
                "why": f"no interval of the schedule is as long as the uninterrupted job ({base['wall_s']:.0f} s)",
                "uninterrupted": {k: v for k, v in base.items() if k != "digests"},
                "overhead": 0.0,
            }
            continue
        if c in FLOORS:
            result["contenders"][c] = {
                "name": NAMES[c],
                "completed": False,
                "floor": True,
                "why": "a floor, not a checkpointer: run uninterrupted only",
                "uninterrupted": {k: v for k, v in runs[c].items() if k != "digests"},
                "overhead": runs[c]["train_s"] / base["train_s"] - 1.0,
            }
        else:
            sched = under_schedule(Runner(c, work, args.epochs, steps, loads, "sched", mtbf), plan, cap)
            result["contenders"][c] = contender_result(c, base, runs[c], sched, base["digests"])
        if args.overhead_runs > 1:
            result["contenders"][c].update(overhead_rounds(rounds["none"], rounds[c]))
        print(R.line(c, result["contenders"][c]), file=sys.stderr, flush=True)
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["loadavg_1min_at_launches"] = {
        "min": min(loads),
        "median": statistics.median(loads),
        "max": max(loads),
        "launches": len(loads),
    }
    return result


def resplit(result: dict) -> dict:
    """The runs under the schedule split again from the events kept in the result's work directory (after a change
    of the split; the launch, exit and signal times are the result's own)."""
    work = Path(result["work_dir"])
    for c, r in result["contenders"].items():
        if not r.get("completed") or "launches" not in r:
            continue
        procs = []
        for i, launch in enumerate(r["launches"], start=1):
            p = read_events(work / f"{c}-sched{i}.jsonl")
            p.update({k: launch[k] for k in ("launch", "exit", "signal_at", "signal", "rc")})
            procs.append(p)
        r.update(G.split(procs, result["uninterrupted_s"]))
        r["goodput_vs_own_uninterrupted"] = r["uninterrupted"]["wall_s"] / r["wall_s"]
    return result


def machine() -> dict:
    """Python, CPUs, versions of keras, jax and orbax-checkpoint (read without importing them)."""
    info = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    for dist in ("keras", "jax", "orbax-checkpoint", "candle_ckpt"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    info["candle_ckpt_from"] = os.environ.get("PYTHONPATH") or "installed"
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedule", choices=sorted(G.SCHEDULES), default="A")
    parser.add_argument("--epochs", type=int, default=None, help="default: the schedule's (A: 60, B: 10)")
    parser.add_argument("--epoch-s", type=float, default=None, help="seconds per epoch (A: 2, B: 20), via steps")
    parser.add_argument("--steps", type=int, default=None, help="steps per epoch (instead of calibrating --epoch-s)")
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=CONTENDERS,
        default=list(DEFAULT_CONTENDERS),
        help="default: all but candle-mtbf (candle_ckpt with ckpt_mtbf set to the schedule's mean interval)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--interval-x", type=float, default=1.0, help="stretch the intervals (a slow, shared machine's start-up)"
    )
    parser.add_argument("--quick", action="store_true", help="10 epochs of ~1.5 s: a sanity run of a few minutes")
    parser.add_argument(
        "--max-wall-x", type=float, default=8.0, help="give up after this x the uninterrupted time (300 s at least)"
    )
    parser.add_argument(
        "--overhead-runs",
        type=int,
        default=1,
        help="uninterrupted runs of each contender, interleaved; the overhead is their median (default: 1)",
    )
    parser.add_argument("--out", default=None, help="the JSON (default: benchmarks/results/goodput-...json)")
    parser.add_argument("--work-dir", default=None, help="where the checkpoints and logs go (default: a temp dir)")
    parser.add_argument("--plot", nargs="?", const="", default=None, help="also draw the PNG (default: beside)")
    parser.add_argument("--plot-only", nargs="+", default=None, metavar="JSON", help="draw results already written")
    parser.add_argument("--resplit", default=None, metavar="JSON", help="split a result again from its work dir")
    args = parser.parse_args()
    if args.resplit:
        result = resplit(json.loads(Path(args.resplit).read_text()))
        Path(args.resplit).write_text(json.dumps(result, indent=1) + "\n")
        print(R.table(result))
        return
    if args.plot_only:
        results = [json.loads(Path(p).read_text()) for p in args.plot_only]
        path = args.plot or str(Path(args.plot_only[0]).with_suffix(".png"))
        R.plot(results, path)
        print(f"wrote {path}")
        return
    spec = G.SCHEDULES[args.schedule]
    args.epochs = args.epochs or (10 if args.quick else spec["epochs"])
    args.epoch_s = args.epoch_s or (1.5 if args.quick else spec["epoch_s"])
    result = bench(args)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d-%H%M")
    out = Path(args.out or HERE / "results" / f"goodput-{args.schedule}-{stamp}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(R.table(result))
    print(f"wrote {out}")
    if args.plot is not None:
        png = args.plot or str(out.with_suffix(".png"))
        R.plot([result], png)
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
