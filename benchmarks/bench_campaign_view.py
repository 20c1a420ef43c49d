"""``candle-ckpt campaign`` at campaign scale: how long the view of N run directories takes.

::

    python benchmarks/bench_campaign_view.py --runs 2000 --out benchmarks/results/campaign-view.json

Writes ``--runs`` synthetic persistent run directories on a local disk (``candle_ckpt.testing.campaign``:
each with its newest ``--keep`` epoch checkpoints, an archive and a sidecar written by ``Sidecar.to_json``,
and its ``restarts.jsonl``; the runs spread over every state, a few half-written), then times the command
as an operator runs it (``python3 -m candle_ckpt campaign DIR``, a new process: its imports included) and
in this process (the reading and the rules alone), each ``--repeat`` times, the table and ``--json``. Then
the same view through fsspec's memory file system, counting its listings per run. Prints a table and
writes JSON. The goal: 2,000 runs within 5 s on a local disk, one listing per run on an object store.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from candle_ckpt.cli import campaign as C  # noqa: E402
from candle_ckpt.cli.campaign_state import STATES  # noqa: E402
from candle_ckpt.testing.campaign import half_written, write_run  # noqa: E402


def make_campaign(root: str, runs: int, keep: int) -> float:
    """``runs`` run directories under ``root``, cycling through the states; returns the seconds it took."""
    start, now = time.perf_counter(), time.time()
    for i in range(runs):
        state = STATES[i % len(STATES)]
        path = write_run(root, f"run-{i:05d}", state, now, keep=keep)
        if i % 50 == 7:
            half_written(path, 9, now)
    return time.perf_counter() - start


def time_cli(root: str, repeat: int, *extra: str) -> list[float]:
    """Wall seconds of ``python3 -m candle_ckpt campaign root`` (a new process each time)."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "candle_ckpt", "campaign", root, *extra], capture_output=True, text=True, env=env
        )
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"campaign failed ({done.returncode}): {done.stderr}")
    return times


def time_in_process(root: str, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            C.cmd_campaign(_args([root]))
        times.append(time.perf_counter() - start)
    return times


def _args(roots: list[str]):
    from candle_ckpt.cli.parser import build_parser

    return build_parser().parse_args(["campaign", *roots])


def memory_listings(root: str, runs: int) -> dict[str, float]:
    """The campaign copied into fsspec's memory file system, read through it, its listings counted."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    fs = fsspec.filesystem("memory")
    fs.rm("/bench", recursive=True) if fs.exists("/bench") else None
    for dirpath, _, files in os.walk(root):
        for name in files:
            src = os.path.join(dirpath, name)
            with open(src, "rb") as f:
                fs.pipe_file("/bench/" + os.path.relpath(src, root).replace(os.sep, "/"), f.read())
    calls, local = {"n": 0}, threading.local()  # the view reads the runs on several threads
    originals = {name: getattr(MemoryFileSystem, name) for name in ("ls", "find", "glob", "walk")}

    def counted(method):
        def wrapper(self, *a, **k):
            local.depth = getattr(local, "depth", 0) + 1
            calls["n"] += local.depth == 1  # a listing the view asked for, not the ones inside it
            try:
                return method(self, *a, **k)
            finally:
                local.depth -= 1

        return wrapper

    for name, method in originals.items():
        setattr(MemoryFileSystem, name, counted(method))
    try:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            C.cmd_campaign(_args(["memory://bench"]))
        elapsed = time.perf_counter() - start
    finally:
        for name, method in originals.items():
            setattr(MemoryFileSystem, name, method)
        fs.rm("/bench", recursive=True)
    return {"runs": runs, "listings": calls["n"], "listings_per_run": round(calls["n"] / runs, 4), "s": elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--keep", type=int, default=2, help="epoch checkpoints per run (the persistent keep limit)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory-runs", type=int, default=200, help="runs for the fsspec memory view (0: skip)")
    parser.add_argument("--dir", help="where to write the runs (default: a temporary directory)")
    parser.add_argument("--out", default="campaign-view.json")
    args = parser.parse_args(argv)
    base = tempfile.mkdtemp(prefix="campaign-view-", dir=args.dir)
    root = os.path.join(base, "campaign")
    try:
        made = make_campaign(root, args.runs, args.keep)
        cli = time_cli(root, args.repeat)
        cli_json = time_cli(root, args.repeat, "--json")
        inproc = time_in_process(root, args.repeat)
        small = os.path.join(base, "small")
        make_campaign(small, args.memory_runs, args.keep) if args.memory_runs else None
        memory = memory_listings(small, args.memory_runs) if args.memory_runs else None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "runs": args.runs,
        "keep": args.keep,
        "made_s": round(made, 3),
        "cli_s": [round(t, 3) for t in cli],
        "cli_json_s": [round(t, 3) for t in cli_json],
        "in_process_s": [round(t, 3) for t in inproc],
        "memory": memory,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print(f"{'campaign view of':<36}{args.runs} runs ({args.keep} epochs each), local disk")
    for label, key in (("candle-ckpt campaign (new process)", "cli_s"), ("  ... --json", "cli_json_s")):
        print(f"{label:<36}median {statistics.median(result[key]):.2f} s, max {max(result[key]):.2f} s")
    print(f"{'reading + rules (in process)':<36}median {statistics.median(inproc):.2f} s")
    if memory:
        print(f"{'fsspec memory://, listings':<36}{memory['listings']} for {memory['runs']} runs (+1: the root)")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
