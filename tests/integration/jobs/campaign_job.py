"""A campaign on one machine: many Quickstart runs at once, each killed with SIGKILL and moved to an empty
fast tier, all draining into one persistent directory (``test_campaign.py``, ``benchmarks/bench_campaign.py``).

The server (``python campaign_job.py``) imports Keras once and, for every stdin line
``ID FAST PERSISTENT EPOCHS SEED OUT``, forks a child that runs README.rst's
Quickstart (its model, data and ``fit``) with ``ckpt_directory=FAST`` and
``ckpt_persistent_url=PERSISTENT`` (``-``: none, FAST is then the shared
directory itself) and does not wait for it: the runs overlap. The server
never runs a Keras op, so each child starts from a clean runtime (issue 40
item 10: a fork after the backend started its threads may deadlock).

Lines, each led by ID: ``started PID`` and ``reaped STATUS`` (the server);
``resumed GEN EPOCH STEP`` (``-`` for each from scratch), ``epoch N`` after
each epoch's checkpoint, ``done`` after the final weights are in ``OUT.npz``
and the run's figures in ``OUT.json`` (the children).

A run cannot end while the driving side still owes it a kill: while ``OUT.hold``
exists, a child waits at its last epoch's end (before that epoch's checkpoint,
at most ``HOLD_S``) for the file to go. On a busy machine the driver reads the
lines late, and a kill planned from a late line could otherwise come after the
run has ended (a run killed twice instead of three times).

:class:`Campaign` is the driving side, shared by the test and the benchmark.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from pipe_lines import PipeLines

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HOLD_S = 600.0  # the longest a child waits at its last epoch's end for the driver's last kill


def say(*words: object) -> None:
    os.write(1, (" ".join(str(w) for w in words) + "\n").encode())


def run(job: str, fast: str, persistent: str, epochs: int, seed: int, out: str) -> None:
    """One life of one run: README.rst's Quickstart, with its progress on stdout and its figures in OUT.json."""
    import keras
    import numpy as np

    import candle_ckpt as candle

    gp = {"epochs": epochs, "ckpt_directory": fast}
    if persistent != "-":
        gp["ckpt_persistent_url"] = persistent
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = x @ rng.normal(size=(8, 1)).astype("float32") + 0.1 * rng.normal(size=(512, 1)).astype("float32")
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    start = time.perf_counter()
    info = candle.restart(gp, model, logger=None)
    restore_s = time.perf_counter() - start
    if info:
        say(job, "resumed", info["generation"], info["epoch"], "-" if info["step"] is None else info["step"])
    else:
        say(job, "resumed", "-", "-", "-")
    ckpt = candle.CandleCheckpointCallback(gp, logger=None)
    stalls: list[float] = []

    class Clock(keras.callbacks.Callback):
        """The training thread's time from the last callback's epoch end to the next epoch's start: the
        checkpoint save (the callback saves once every on_epoch_end has run) and the drain's staging."""

        at: float | None = None

        def on_epoch_end(self, epoch, logs=None):
            say(job, "epoch", epoch + 1)
            hold, until = Path(out + ".hold"), time.monotonic() + HOLD_S
            while epoch + 1 == epochs and hold.exists() and time.monotonic() < until:
                time.sleep(0.05)  # a kill is still owed: it lands here, before the last checkpoint
            self.at = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            if self.at is not None:
                stalls.append(time.perf_counter() - self.at)

        on_train_end = on_epoch_begin

    model.fit(
        x,
        y,
        validation_split=0.25,
        epochs=epochs,
        initial_epoch=info["epoch"] if info else 0,
        callbacks=[ckpt, Clock()],
        verbose=0,
    )
    ckpt.report_final()  # waits for the drain of the last save
    np.savez(out + ".npz", *[np.asarray(v) for v in model.variables + model.optimizer.variables])
    stats = ckpt.stats()
    figures = {"stall_s": stalls, "restore_s": restore_s, "uploads": stats["uploads"], "saves": stats["saves"]}
    Path(out + ".json").write_text(json.dumps(figures, default=str))
    say(job, "done")


def serve() -> None:
    """Fork one run per stdin line; report each child's start and exit; never wait for one."""
    import keras  # noqa: F401  (imported once, inherited by every child)

    import candle_ckpt

    _ = candle_ckpt.restart, candle_ckpt.CandleCheckpointCallback  # resolve the lazy imports once
    jobs: dict[int, str] = {}
    say("serving")
    requests, open_stdin = PipeLines(sys.stdin), True
    while open_stdin or jobs:
        try:
            line = requests.next(0.02) if open_stdin else time.sleep(0.02)
        except EOFError:
            line = ""
        if line is not None:
            words = line.split()
            if len(words) != 6:
                open_stdin = False
                continue
            job = words[0]
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    run(job, words[1], words[2], int(words[3]), int(words[4]), words[5])
                except SystemExit as exit_:
                    code = exit_.code if isinstance(exit_.code, int) else 1
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stderr.flush()
                    os._exit(code)
            jobs[pid] = job
            say(job, "started", pid)
        while jobs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            say(jobs.pop(pid), "reaped", status)


# -- the driving side ------------------------------------------------------------------------------------------


def newest_persistent(root: Path) -> tuple[int, int, int] | None:
    """The (generation, epoch, step) of the newest complete checkpoint under ``root`` (a run's persistent
    directory), by the same order restart() uses; None if it has none."""
    from candle_ckpt.core.sidecar import Sidecar
    from candle_ckpt.storage.remote import sort_key

    best = None
    for side_path in list(root.glob("epochs/*/ckpt-info.json")) + list(root.glob("steps/*/ckpt-info.json")):
        try:
            key = sort_key(Sidecar.from_json(side_path.read_bytes()))
        except (OSError, ValueError):
            continue
        best = key if best is None or key > best else best
    return best


@dataclass
class Run:
    """One run of the campaign: its lives, the kills still to come, and what each restart resumed from."""

    index: int
    seed: int
    kills_left: int
    life: int = 0
    pid: int | None = None
    job: str = ""
    epoch: int = 0
    resumed: tuple[int, int, int] | None = None  # the last life's resumed (generation, epoch, step)
    kill_after: int = 0  # kill once this epoch has been reported...
    kill_at: float | None = None  # ...at this time
    epoch_at: float | None = None  # when the last epoch line came
    at_kill: list[tuple[int, int, int] | None] = field(default_factory=list)  # P's newest, recorded at each kill
    resumes: list[tuple[int, int, int] | None] = field(default_factory=list)  # each life's resumed key
    done: bool = False
    statuses: list[int] = field(default_factory=list)


class Campaign:
    """Start ``runs`` Quickstart runs at once through one server; kill each ``kills`` times; restart each life on
    an empty fast tier.

    Args:
        root: Working directory (fast tiers under ``fast/``, the shared persistent directory ``shared/``).
        direct: Write straight to the shared directory (``ckpt_directory=shared/run-NN``, no persistent tier),
            the comparison of the benchmark: then a restart keeps its directory.
        seeds: Run i uses seed ``i % seeds``; one uninterrupted twin per seed.
    """

    def __init__(
        self, root: Path, runs: int, kills: int, epochs: int, *, direct: bool = False, seeds: int = 8, rng_seed: int = 0
    ) -> None:
        self.root, self.epochs, self.direct = root, epochs, direct
        self.rng = random.Random(rng_seed)
        self.runs = [Run(i, i % seeds, kills) for i in range(runs)]
        self.twins = {seed: Run(1000 + seed, seed, 0) for seed in range(min(seeds, runs))}
        self.by_job: dict[str, Run] = {}
        self.lines = 0
        self.proc: subprocess.Popen | None = None
        self.stderr = root / "server.stderr"

    def shared(self, run: Run) -> Path:
        return self.root / "shared" / f"run-{run.index:03d}"

    def out(self, run: Run) -> str:
        return str(self.root / "out" / f"run-{run.index:03d}")

    def start_server(self, timeout: float) -> None:
        jobs = Path(__file__).resolve().parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(jobs.parents[2]), os.environ.get("PYTHONPATH", "")])}
        (self.root / "out").mkdir(parents=True, exist_ok=True)
        self.err = open(self.stderr, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
            text=True,
            bufsize=1,
        )
        self.lines = PipeLines(self.proc.stdout)
        assert self.line(timeout) == ["serving"], self.stderr.read_text()[-3000:]

    def line(self, timeout: float) -> list[str] | None:
        try:
            got = self.lines.next(timeout)
        except EOFError:
            raise RuntimeError(f"the campaign server exited; stderr:\n{self.stderr.read_text()[-3000:]}") from None
        return None if got is None else got.split()

    def launch(self, run: Run) -> None:
        run.life += 1
        run.job = f"r{run.index}l{run.life}"
        self.by_job[run.job] = run
        if self.direct:
            fast, persistent = str(self.shared(run)), "-"
        else:  # an empty fast tier for every life, as on a new node
            fast, persistent = str(self.root / "fast" / f"run-{run.index:03d}-life-{run.life}"), str(self.shared(run))
        out = self.out(run) if run.index < 1000 else str(self.root / "out" / f"twin-{run.seed}")
        if run.kills_left:
            Path(out + ".hold").touch()  # removed with the last kill: until then the run cannot end
        self.proc.stdin.write(f"{run.job} {fast} {persistent} {self.epochs} {run.seed} {out}\n")

    def plan_kill(self, run: Run, resumed_epoch: int) -> None:
        """The next kill: once a random epoch 1-3 past the resumed one is reported (two epochs per kill still
        to come are left), at a random moment of the next epoch (its save and drain included)."""
        if run.kills_left == 0:
            run.kill_after = 10**9
            return
        last = self.epochs - 2 * run.kills_left
        run.kill_after = min(resumed_epoch + self.rng.randint(1, 3), max(last, resumed_epoch + 1))
        run.epoch_at = None

    def play(self, silence_s: float, twins: bool = True) -> float:
        """Run the whole campaign (and the twins); returns its wall time. Fails if the server is silent too long."""
        start = time.monotonic()
        everyone = self.runs + (list(self.twins.values()) if twins else [])
        for run in everyone:
            self.launch(run)
        while not all(r.done for r in everyone):
            now = time.monotonic()
            for run in everyone:
                if run.kill_at is not None and now >= run.kill_at and run.pid is not None:
                    os.kill(run.pid, signal.SIGKILL)
                    run.kill_at = None
                    run.kills_left -= 1
                    if not run.kills_left:
                        Path(self.out(run) + ".hold").unlink(missing_ok=True)
            words = self.line(0.01)
            if words is None:
                if time.monotonic() - self._heard > silence_s:
                    waiting = [
                        (r.index, r.life, r.epoch, r.kills_left, r.kill_after, r.pid) for r in everyone if not r.done
                    ]
                    raise RuntimeError(
                        f"no line from the campaign for {silence_s:.0f} s; (run, life, epoch, kills owed, kill after "
                        f"epoch, pid) of the runs not done: {waiting}"
                    )
                continue
            self._heard = time.monotonic()
            self.on_line(words)
        return time.monotonic() - start

    _heard = float("inf")

    def on_line(self, words: list[str]) -> None:
        self._heard = time.monotonic()
        run = self.by_job.get(words[0])
        if run is None or words[0] != run.job:
            return  # a line of an earlier life
        what = words[1]
        if what == "started":
            run.pid = int(words[2])
        elif what == "resumed":
            key = (
                None
                if words[2] == "-"
                else (int(words[2]), int(words[3]), 1 << 62 if words[4] == "-" else int(words[4]))
            )
            run.resumes.append(key)
            self.plan_kill(run, key[1] if key else 0)
        elif what == "epoch":
            now, before = time.monotonic(), run.epoch_at
            run.epoch, run.epoch_at = int(words[2]), now
            if run.epoch >= run.kill_after and run.kill_at is None and run.kills_left:
                epoch_s = now - before if before is not None else 0.2
                run.kill_at = now + self.rng.uniform(0.0, epoch_s)  # a run with a kill owed holds at its end
        elif what == "reaped":
            status = int(words[2])
            run.statuses.append(status)
            run.pid, run.kill_at = None, None
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                run.at_kill.append(newest_persistent(self.shared(run)) if not self.direct else None)
                self.launch(run)
            elif status == 0:
                run.done = True
            else:
                raise RuntimeError(f"run {run.index} life {run.life} exited with {status}; see {self.stderr}")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(60)
            self.err.close()


if __name__ == "__main__":
    serve()
