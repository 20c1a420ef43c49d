"""The README's Slurm recipe under a real one-node Slurm (issue 29).

The module fixture starts Slurm (``slurm_cluster``: munged, slurmctld and
slurmd of this machine's ``slurm-wlm``), measures how fast the Quickstart
trains here with an uninterrupted run of it (the reference, outside Slurm),
and submits the README's sbatch script, its code blocks read from README.rst
with only ``--time`` and ``--epochs`` changed, in five ways at once:

* ``timelimit``: ``--time=3`` with the script's ``--signal=USR1@120``: the
  warning signal, exit 99, requeue, until the run is complete;
* ``scancel`` and ``scancel_batch``: ``scancel --signal=TERM`` (the job step)
  and ``scancel --batch --signal=TERM`` (the batch shell, whose trap passes it
  on) once three epochs are saved;
* ``preempted``: submitted to the preemptable partition; once three epochs are
  saved a job of the higher-priority partition needs its memory, and Slurm
  preempts and requeues it;
* ``deadline``: ``--time=2`` and no ``--signal`` line: ``ckpt_deadline=auto``
  finds the end time (``scontrol show job`` on Slurm 22.05) and saves 60 s
  before it.

The epochs are chosen from the measured speed so that the time-limit and
deadline jobs cannot finish within one run. Each test then checks its job: it
completed after at least one requeue, its log shows the save the test meant,
and its last checkpoint holds the same bytes as the uninterrupted run's
checkpoint of that epoch (every weight and optimizer variable, the RNG and
input state).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pytest
from locations import REPO
from slurm_cluster import SlurmCluster, missing, start_cluster
from test_readme import README, blocks

pytestmark = pytest.mark.slow

ENV = dict(
    os.environ,
    PYTHONPATH=str(REPO),
    TF_CPP_MIN_LOG_LEVEL="3",
    CUDA_VISIBLE_DEVICES="",
    PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
)
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
LONG_S = 55.0  # training time of the time-limit and deadline jobs, alone: more than one run's window (<= 60 s)
SHORT_S = 15.0  # of the scancel and preemption jobs: long enough to be signalled mid-training


def recipe(time_limit: str, epochs: int, signal: bool = True) -> str:
    """README's sbatch script with only ``--time`` and ``--epochs`` changed (and, without ``signal``, no --signal)."""
    (script,) = [b.astext() for b in blocks(README, "bash")]
    script, n_time = re.subn(r"--time=\S+", f"--time={time_limit}", script)
    script, n_epochs = re.subn(r"--epochs \d+", f"--epochs {epochs}", script)
    assert n_time == n_epochs == 1, "README's sbatch script changed: update this test"
    if not signal:
        script, n = re.subn(r"#SBATCH --signal=\S+\n", "", script)
        assert n == 1
    return script


def epochs_saved(folder: Path) -> int:
    """How many epoch checkpoints ``folder``'s Quickstart has committed."""
    epochs = folder / "save" / "ckpts" / "epochs"
    return len(list(epochs.iterdir())) if epochs.is_dir() else 0


def state_bytes(checkpoint: Path) -> dict[str, bytes]:
    """Every array of a checkpoint (the model's and optimizer's variables, the train state), as raw bytes."""
    out: dict[str, bytes] = {}
    with zipfile.ZipFile(checkpoint / "model.keras") as archive, archive.open("model.weights.h5") as raw:
        with h5py.File(raw) as h5:
            h5.visititems(
                lambda name, obj: out.update({name: obj[()].tobytes()}) if isinstance(obj, h5py.Dataset) else None
            )
    for npz in sorted(checkpoint.glob("*.npz")):
        with np.load(npz, allow_pickle=False) as arrays:
            out.update({f"{npz.name}:{k}": arrays[k].tobytes() for k in arrays.files})
    return out


@dataclass
class Scenario:
    """One submitted job and what the driver did to it."""

    name: str
    folder: Path
    epochs: int
    job: str = ""
    act: str | None = None  # what the driver does once three epochs are saved
    acted_at: float | None = None
    seen: set[str] = field(default_factory=set)  # job states and reasons seen while polling
    final: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        """The job's output (all runs: --open-mode=append) and its ckpt.log."""
        parts = [
            p.read_text(errors="replace") for p in (self.folder / "quickstart.log", self.folder / "save" / "ckpt.log")
        ]
        return "\n".join(p for p in parts if p)


def calibrate(reference: Path, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds per epoch of the Quickstart here: the reference run's epochs 3 to 13, timed as they are committed."""
    end = time.monotonic() + timeout
    marks: dict[int, float] = {}
    while time.monotonic() < end and proc.poll() is None:
        done = epochs_saved(reference)
        for mark in (3, 13):
            if done >= mark:
                marks.setdefault(mark, time.monotonic())
        if len(marks) == 2:
            return (marks[13] - marks[3]) / 10
        time.sleep(0.05)
    raise AssertionError(f"the reference Quickstart did not save 13 epochs within {timeout:.0f} s")


def submit(cluster: SlurmCluster, sc: Scenario, script: str, *options: str) -> None:
    """Write the Quickstart and ``job.sh`` into the scenario's folder and sbatch it from there."""
    sc.folder.mkdir()
    (sc.folder / "quickstart.py").write_text(QUICKSTART)
    (sc.folder / "job.sh").write_text(script)
    env = {
        **cluster.env,
        **{k: v for k, v in ENV.items() if k not in ("SLURM_CONF",)},
        "SLURM_CONF": cluster.env["SLURM_CONF"],
    }
    proc = subprocess.run(
        ["sbatch", "--parsable", *options, "job.sh"], cwd=sc.folder, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    sc.job = proc.stdout.strip().split(";")[0]


def act(cluster: SlurmCluster, sc: Scenario, memory_mb: int) -> None:
    """Signal or preempt ``sc``'s job as its scenario says."""
    if sc.act == "scancel":
        cluster.cmd("scancel", "--signal=TERM", sc.job)
    elif sc.act == "scancel_batch":
        cluster.cmd("scancel", "--batch", "--signal=TERM", sc.job)
    elif sc.act == "preempt":
        cluster.cmd("sbatch", "-p", "high", f"--mem={memory_mb}M", "-o", "/dev/null", "--wrap", "sleep 2")
    sc.acted_at = time.monotonic()


def drive(cluster: SlurmCluster, scenarios: list[Scenario], timeout: float, memory_mb: int) -> None:
    """Poll every job until each has ended (or ``timeout``), acting on each once it has saved three epochs."""
    end = time.monotonic() + timeout
    pending = list(scenarios)
    while pending and time.monotonic() < end:
        for sc in list(pending):
            info = cluster.job(sc.job)
            sc.seen.update({info.get("JobState", "?"), info.get("Reason", "?")})
            if sc.act and sc.acted_at is None and info.get("JobState") == "RUNNING" and epochs_saved(sc.folder) >= 3:
                act(cluster, sc, memory_mb)
            if info.get("JobState") in FINAL:
                sc.final = info
                pending.remove(sc)
        time.sleep(1.0)
    for sc in pending:
        sc.final = {"JobState": f"still {cluster.job(sc.job).get('JobState')} after {timeout:.0f} s"}
        cluster.cmd("scancel", sc.job, check=False)


QUICKSTART = ""


@pytest.fixture(scope="module")
def slurm_runs(tmp_path_factory: pytest.TempPathFactory):
    """Start Slurm, run the reference and the five jobs to their end; yield (scenarios, reference folder, timings)."""
    global QUICKSTART
    why = missing()
    if why:
        pytest.skip(f"no Slurm here: {why}")
    (QUICKSTART,) = [b.astext() for b in blocks(README, "python")]
    root = tmp_path_factory.mktemp("slurm")
    started = time.monotonic()
    cluster = start_cluster(root / "state")
    reference = root / "reference"
    reference.mkdir()
    (reference / "quickstart.py").write_text(QUICKSTART)
    ref = subprocess.Popen(
        [sys.executable, "quickstart.py", "--epochs", "100000"], cwd=reference, env=ENV,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        per_epoch = calibrate(reference, ref, timeout=300)
        long_e = max(20, math.ceil(LONG_S / per_epoch))
        short_e = max(12, math.ceil(SHORT_S / per_epoch))
        memory = cluster.memory_mb // 2 + 100  # two such jobs cannot share the node
        scenarios = [
            Scenario("timelimit", root / "timelimit", long_e),
            Scenario("deadline", root / "deadline", long_e),
            Scenario("scancel", root / "scancel", short_e, act="scancel"),
            Scenario("scancel_batch", root / "scancel_batch", short_e, act="scancel_batch"),
            Scenario("preempted", root / "preempted", short_e, act="preempt"),
        ]
        for sc in scenarios:
            if sc.name == "timelimit":
                submit(cluster, sc, recipe("00:03:00", sc.epochs))
            elif sc.name == "deadline":
                submit(cluster, sc, recipe("00:02:00", sc.epochs, signal=False))
            elif sc.name == "preempted":
                submit(cluster, sc, recipe("00:10:00", sc.epochs), "-p", "low", f"--mem={memory}M")
            else:
                submit(cluster, sc, recipe("00:10:00", sc.epochs))
        # Bounded by the measured speed: the long jobs' training 6 times over (a busy machine) and their restarts.
        drive(cluster, scenarios, timeout=min(1200.0, 6 * long_e * per_epoch + 300), memory_mb=memory)
        while ref.poll() is None and epochs_saved(reference) < long_e + 1:
            time.sleep(0.5)
        timings = {"per_epoch_s": per_epoch, "total_s": time.monotonic() - started}
        yield {sc.name: sc for sc in scenarios}, reference, timings
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait(timeout=30)
        cluster.stop()


def check(sc: Scenario, reference: Path, saved: str) -> None:
    """``sc``'s job completed after a requeue, its log shows ``saved``, and it ends with the reference's bytes."""
    log = sc.log()
    assert sc.final.get("JobState") == "COMPLETED" and sc.final.get("ExitCode") == "0:0", f"{sc.final}\n{log[-4000:]}"
    assert int(sc.final.get("Restarts", "0")) >= 1, f"never requeued: {sc.final}\n{log[-4000:]}"
    assert re.search(saved, log), f"no {saved!r} in the job's logs:\n{log[-4000:]}"
    last = sc.folder / "save" / "ckpts" / "last"
    assert os.readlink(last) == f"epochs/{sc.epochs:03d}", log[-4000:]
    ours, theirs = state_bytes(last), state_bytes(reference / "save" / "ckpts" / "epochs" / f"{sc.epochs:03d}")
    assert sorted(ours) == sorted(theirs)
    assert [k for k in ours if ours[k] != theirs[k]] == [], "not bit-identical to the uninterrupted run"


def test_time_limit_signal_requeues_until_complete_and_ends_bit_identical(slurm_runs) -> None:
    """--signal=USR1@120 with --time=3: SIGUSR1 saves a checkpoint, exit 99, requeue, resume, to the end.

    The save is a step checkpoint, or the epoch's own when the signal lands at an epoch end (seen in CI).
    """
    scenarios, reference, _ = slurm_runs
    sc = scenarios["timelimit"]
    check(sc, reference, r"SIGUSR1: committed \S+/ckpts/(?:steps|epochs)/\d+ .* exiting with status 99")
    assert len(re.findall(r"requeueing job", sc.log())) == int(sc.final["Restarts"]), sc.log()[-3000:]


def test_scancel_signal_term_requeues_and_ends_bit_identical(slurm_runs) -> None:
    """scancel --signal=TERM (the job step): SIGTERM saves, exit 99, the script requeues, the rerun completes."""
    scenarios, reference, _ = slurm_runs
    check(scenarios["scancel"], reference, r"SIGTERM: committed .* exiting with status 99")


def test_scancel_batch_reaches_the_step_through_the_trap(slurm_runs) -> None:
    """scancel --batch --signal=TERM signals only the batch shell: its trap passes SIGTERM to the step, which saves."""
    scenarios, reference, _ = slurm_runs
    check(scenarios["scancel_batch"], reference, r"SIGTERM: committed .* exiting with status 99")


def test_preemption_by_a_higher_priority_partition_requeues_and_ends_bit_identical(slurm_runs) -> None:
    """A job of the higher-tier partition needs the node's memory: Slurm preempts (REQUEUE); the job saves first."""
    scenarios, reference, _ = slurm_runs
    check(scenarios["preempted"], reference, r"SIGTERM: committed")


def test_deadline_without_signal_finds_the_end_time_on_this_slurm(slurm_runs) -> None:
    """No --signal: ckpt_deadline=auto asks scontrol for the end time (no SLURM_JOB_END_TIME before 23.02) and saves."""
    scenarios, reference, timings = slurm_runs
    sc = scenarios["deadline"]
    check(sc, reference, r"deadline: committed .* exiting with status 99")
    assert re.search(r"deadline in \d+ s \((SLURM_JOB_END_TIME|scontrol show job \d+)", sc.log()), sc.log()[-3000:]
    print(f"slurm scenarios: {timings}")
