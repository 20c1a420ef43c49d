"""Scripts in the shape of both CANDLE generations, SIGKILLed mid-run and rerun unchanged, end bit-identical.

``candle_job.py`` runs once uninterrupted (the reference: both generations
train the same model on the same data), then, for each generation, in fresh
processes: once killed with SIGKILL as soon as the checkpoint of epoch 2 is
committed (``last`` points to it; the job is then in epoch 3, or pausing
after epoch 2); and once more,
unchanged, which resumes and trains to the end. The final weights and
optimizer variables must equal the uninterrupted run's bit for bit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from locations import REPO, job_script
from pace import wait_s
from pipe_lines import PipeLines

from candle_ckpt.storage.store import CheckpointStore

ENV = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
EPOCHS = 4


def last_epoch(generation: str, workdir: Path) -> int | None:
    """The epoch the job's ``last`` link points to (master: <workdir>/save/ckpts, develop: <workdir>/ckpts)."""
    if generation == "master":
        return CheckpointStore(workdir / "save").link_epoch("last")
    return CheckpointStore(workdir / "ckpts", flat=True).link_epoch("last")


def wait_for_commit(generation: str, workdir: Path, epoch: int) -> None:
    """Wait until ``last`` reaches ``epoch`` (the commit point), however the job orders its callbacks."""
    deadline = time.monotonic() + 30
    while (last_epoch(generation, workdir) or 0) < epoch:
        assert time.monotonic() < deadline, f"epoch {epoch} was never committed"
        time.sleep(0.01)


def run(generation: str, workdir: Path, out: Path, kill_after: int | None = None) -> list[str]:
    """Run the job; with ``kill_after``, SIGKILL it once that epoch is committed (mid-run). Return its lines."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(job_script("candle_job.py")), generation, str(workdir), str(EPOCHS), str(out)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
    lines = []
    try:
        for line in PipeLines(child.stdout).each(wait_s(120)):
            lines.append(line.strip())
            if kill_after is not None and line.strip() == f"committed {kill_after}":
                wait_for_commit(generation, workdir, kill_after)
                os.kill(child.pid, signal.SIGKILL)
                break
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    stderr = child.stderr.read()
    child.stdout.close()
    child.stderr.close()
    if kill_after is not None:
        assert child.returncode == -signal.SIGKILL, stderr[-3000:]
    else:
        assert child.returncode == 0 and lines[-1] == "done", stderr[-3000:]
    return lines


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The final state of an uninterrupted run (checkpointing does not change the arithmetic of training)."""
    root = tmp_path_factory.mktemp("reference")
    run("develop", root / "job", root / "reference.npz")
    return root / "reference.npz"


@pytest.mark.parametrize(
    "generation",
    ["master", "develop"],
)
def test_killed_and_rerun_unchanged_is_bit_identical(tmp_path: Path, reference: Path, generation: str) -> None:
    """SIGKILL mid-run, then the same script rerun unchanged: it resumes after epoch 2 or 3 and its final weights
    and optimizer state equal an uninterrupted run's exactly."""
    lines = run(generation, tmp_path / "job", tmp_path / "unused.npz", kill_after=2)
    assert lines[0] == "ready 0" and "committed 2" in lines
    lines = run(generation, tmp_path / "job", tmp_path / "resumed.npz")
    assert lines[0] in ("ready 2", "ready 3"), lines
    expected, resumed = np.load(reference), np.load(tmp_path / "resumed.npz")
    assert sorted(expected.files) == sorted(resumed.files)
    for name in expected.files:
        np.testing.assert_array_equal(resumed[name], expected[name], err_msg=name)


def test_uno_shaped_script_killed_and_rerun_unchanged_is_bit_identical(tmp_path: Path) -> None:
    """Uno's calls unchanged (ckpt.restart(params) with the parameter dict before compile, a Sequence shuffled in
    place, EarlyStopping, ReduceLROnPlateau, LR warm-up, MultiGPUCheckpoint): SIGKILL after epoch 2's commit, rerun,
    and the final weights and optimizer state equal an uninterrupted run's bit for bit."""
    run("uno", tmp_path / "reference", tmp_path / "reference.npz")
    lines = run("uno", tmp_path / "job", tmp_path / "unused.npz", kill_after=2)
    assert lines[0] == "ready 0" and "committed 2" in lines
    lines = run("uno", tmp_path / "job", tmp_path / "resumed.npz")
    assert lines[0] in ("ready 2", "ready 3"), lines
    assert (tmp_path / "job" / "model.h5").is_file()  # MultiGPUCheckpoint saved the template model
    expected, resumed = np.load(tmp_path / "reference.npz"), np.load(tmp_path / "resumed.npz")
    assert sorted(expected.files) == sorted(resumed.files)
    for name in expected.files:
        np.testing.assert_array_equal(resumed[name], expected[name], err_msg=name)


def test_uno_sigterm_mid_epoch_adopts_the_step_checkpoint_and_ends_bit_identical(tmp_path: Path) -> None:
    """Uno's calls unchanged, SIGTERM in the middle of epoch 3: the preemption saves a step checkpoint and exits;
    rerun, ckpt.restart(params) resumes that step checkpoint, the callback adopts that very record (not its
    epoch's), and the final weights and optimizer state equal an uninterrupted run's bit for bit."""
    env = {**ENV, "CANDLE_JOB_STEP_SLEEP": "0.3"}

    def job(workdir: Path, out: Path, sigterm_at: str | None = None) -> tuple[int, list[str], str]:
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(job_script("candle_job.py")), "uno", str(workdir), str(EPOCHS), str(out)]
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        try:
            lines = []
            for line in PipeLines(child.stdout).each(wait_s(120)):
                lines.append(line.strip())
                if line.strip() == sigterm_at:
                    os.kill(child.pid, signal.SIGTERM)
            _, stderr = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        return child.returncode, lines, stderr

    code, lines, stderr = job(tmp_path / "reference", tmp_path / "reference.npz")
    assert code == 0 and lines[-1] == "done", stderr[-3000:]
    code, lines, stderr = job(tmp_path / "job", tmp_path / "unused.npz", sigterm_at="batch 2:0")
    assert code == 128 + signal.SIGTERM, stderr[-3000:]
    steps = CheckpointStore(tmp_path / "job" / "ckpts", flat=True).steps
    (generation,) = steps.generations()
    saved = steps.read_sidecar(generation)
    assert (saved.epoch, saved.step) == (2, 2)
    code, lines, stderr = job(tmp_path / "job", tmp_path / "resumed.npz")
    assert code == 0 and lines[-1] == "done", stderr[-3000:]
    assert lines[:2] == ["ready 2", f"adopted epoch=2 step=2 generation={generation} J.step=2"], lines[:3]
    expected, resumed = np.load(tmp_path / "reference.npz"), np.load(tmp_path / "resumed.npz")
    assert sorted(expected.files) == sorted(resumed.files)
    for name in expected.files:
        np.testing.assert_array_equal(resumed[name], expected[name], err_msg=name)
