"""Training in phases (docs/exactness.rst, "Training in phases"): a job that trains a head on a frozen base, unfreezes
it and compiles the model again before a second ``fit``, as Keras's transfer-learning guide does.

Every run is a real process (``jobs/phases_job.py``), killed with SIGKILL in the middle of an epoch and run again.
With the recipe (one ``ckpt_directory`` per phase, ``restart()`` after each phase's ``compile()``) the resumed job
ends bit-identical to an uninterrupted one, wherever the kill lands; a job that does otherwise is told so once,
with what to do, before its first failure and again when a resume cannot be exact.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from doclines import assert_log_example
from locations import JOBS, REPO
from pace import wait_s

pytestmark = pytest.mark.slow  # real processes (seconds each)

JOB = JOBS / "phases_job.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
RECIPE = 'give each phase its own ckpt_directory and call restart() before each phase\'s fit() (docs/exactness.rst, "Training in phases")'  # noqa: E501
SAVES_AGAIN = "WARNING: this fit() saves into"
DROPPED = "WARNING: restart() loaded the optimizer state of"


def run(directory: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    """One start of the job, to its end (or its kill)."""
    command = [sys.executable, str(JOB), str(directory), str(out), *args]
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=wait_s(120))


def arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def identical(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def killed_then_resumed(tmp: Path, kill_at: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The job killed by SIGKILL at ``kill_at`` (``E:B``), then run again to its end: (the second run, its OUT)."""
    out = tmp / "out.npz"
    first = run(tmp / "job", out, "--kill-at", kill_at, *args)
    assert first.returncode == -9, first.stderr[-3000:]
    assert not out.exists()
    second = run(tmp / "job", out, *args)
    assert second.returncode == 0, second.stderr[-3000:]
    return second, out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, list[np.ndarray] | str]:
    """Uninterrupted runs: the recipe's, and one directory for both fits with a trainable base: ``{name: its
    arrays, name-stderr: what it wrote on stderr}``."""
    tmp = tmp_path_factory.mktemp("phases-ref")
    got = {}
    for name, args in (("per-phase", ()), ("one-trainable", ("--layout", "one", "--trainable"))):
        proc = run(tmp / name, tmp / f"{name}.npz", *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[name] = arrays(tmp / f"{name}.npz")
        got[f"{name}-stderr"] = proc.stderr
    return got


@pytest.mark.parametrize(
    ("kill_at", "args", "resumed"),
    [
        ("2:5", (), ("phase1 1", "phase2 None")),  # phase 1, mid-epoch: from epoch 1
        ("5:5", (), ("phase1 3", "phase2 4")),  # phase 2, mid-epoch: phase 1 finished, phase 2 from epoch 4
        ("5:6", ("--save-steps", "4"), ("phase1 3", "phase2 4")),  # phase 2, from the step checkpoint after step 4
    ],
    ids=["phase1", "phase2", "phase2-step-checkpoint"],
)
def test_the_recipe_resumes_bit_identical_after_a_kill_in_either_phase(tmp_path, reference, kill_at, args, resumed):
    """One ckpt_directory per phase and restart() after each phase's compile(): SIGKILL in the middle of an epoch
    of either phase (or after a step checkpoint of phase 2), then the same command again: every weight and
    phase 2's optimizer variables equal the uninterrupted run's bit for bit, and nothing is warned about phases."""
    second, out = killed_then_resumed(tmp_path, kill_at, *args)
    assert [line.split(" ", 1)[1] for line in second.stdout.splitlines() if line.startswith("RESUMED")] == list(
        resumed
    ), second.stdout[-2000:]
    if args:
        assert "restart: resumed from" in second.stderr and "phase2/ckpts/steps/" in second.stderr
    assert identical(arrays(out), reference["per-phase"])
    for text in (second.stderr, reference["per-phase-stderr"]):
        assert SAVES_AGAIN not in text and DROPPED not in text


def test_one_directory_for_two_compiled_fits_is_said_in_the_first_run_and_a_resume_that_drops_the_state_too(
    tmp_path, reference
):
    """One directory for both fits, the base trainable (the optimizer's shapes do not change): the uninterrupted
    run says once, when the second fit starts, that its checkpoints cannot be resumed exactly and what to do. Killed
    in phase 2 and run again, restart() loads phase 2's optimizer state into phase 1's optimizer, which the second
    compile() replaces: that fit says so once, and indeed the run does not end bit-identical."""
    said = [line for line in reference["one-trainable-stderr"].splitlines() if SAVES_AGAIN in line]
    assert len(said) == 1 and RECIPE in said[0], reference["one-trainable-stderr"][-3000:]
    second, out = killed_then_resumed(tmp_path, "5:5", "--layout", "one", "--trainable")
    dropped = [line for line in second.stderr.splitlines() if DROPPED in line]
    assert len(dropped) == 1 and "epochs/004 into the optimizer the model had then" in dropped[0], second.stderr
    assert "will not be bit-identical" in dropped[0] and RECIPE in dropped[0]
    log = (tmp_path / "job" / "ckpt.log").read_text().splitlines()
    for words in ("WARNING this fit() saves into", "WARNING restart() loaded the"):  # one of each in ckpt.log
        (line,) = [line for line in log if words in line]
        assert_log_example("exactness.rst", line, words)
    assert not identical(arrays(out), reference["one-trainable"])  # what the warning says


def test_one_directory_with_a_frozen_base_refuses_the_second_fits_checkpoint_naming_the_recipe(tmp_path):
    """One directory, the base frozen in phase 1: restart() before the first fit cannot load a phase-2 checkpoint
    (the optimizer has other variables). It raises ModelMismatch naming the optimizer's variables and the recipe,
    and changes nothing on disk."""
    out = tmp_path / "out.npz"
    first = run(tmp_path / "job", out, "--kill-at", "5:5", "--layout", "one")
    assert first.returncode == -9, first.stderr[-3000:]
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "job" / "ckpts").rglob("*"))
    second = run(tmp_path / "job", out, "--layout", "one")
    assert second.returncode == 1 and not out.exists()
    assert "ModelMismatch: checkpoint" in second.stderr and "epochs/004 (epoch 4) does not match" in second.stderr
    assert "Only the optimizer's variables differ" in second.stderr and RECIPE in second.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "job" / "ckpts").rglob("*")) == before


def test_a_compile_after_restart_is_said_once(tmp_path):
    """restart() after compile(), then compile() again before fit (a script that compiles twice): the optimizer
    state restart() loaded is not in fit's optimizer. The resumed fit says so once, naming the checkpoint."""
    second, _ = killed_then_resumed(tmp_path, "3:2", "--compile-after-restart")
    dropped = [line for line in second.stderr.splitlines() if DROPPED in line]
    assert len(dropped) == 1 and "phase1/ckpts/epochs/002" in dropped[0], second.stderr[-3000:]
    assert "Call restart() after the last compile() before fit()" in dropped[0]
