"""Keras 3 on JAX and PyTorch: no TensorFlow needed, kill -9 resume, checkpoints that cross backends.

Every job runs in a fresh process under the backend named in its environment
(``tests/integration/jobs/backend_job.py``), so these tests do not depend on the
backend of the pytest process. A backend that is not installed is skipped
with its reason (the ``needs_package`` marker, tests/conftest.py); ``pip install "jax[cpu]" torch``
(as .ci/run does) runs them all.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from locations import REPO, job_script

JOB = str(job_script("backend_job.py"))
EPOCHS, KILL_IN = 5, 4


def on(*cases: str | tuple[str, ...]) -> list:
    """Each case (a backend, or a tuple of backends) as a pytest param marked ``needs_package`` for the jax or torch
    it runs on (tests/conftest.py skips it, naming the package, where it is missing; TensorFlow is in the test
    extra)."""
    params = []
    for case in cases:
        names = case if isinstance(case, tuple) else (case,)
        optional = [n for n in names if n != "tensorflow"]
        params.append(pytest.param(*names, marks=pytest.mark.needs_package(*optional)))
    return params


def run_job(backend: str, *args: str, expect: int = 0, block_tf: bool = False) -> str:
    """Run ``backend_job.py ARGS`` under ``backend``; check its exit status and return its stdout."""
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["CANDLE_TEST_BLOCK_TF"] = "1" if block_tf else "0"
    out = subprocess.run([sys.executable, JOB, *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == expect, f"exit {out.returncode}:\n{out.stdout}\n{out.stderr[-3000:]}"
    return out.stdout


def differing(a_path: Path, b_path: Path, *, int_width: bool = False) -> list[str]:
    """Names of the arrays that differ (bit for bit) between two ``state_arrays`` files.

    With ``int_width``, integer arrays of equal values but another width are
    equal: the optimizer's step counter is int32 on JAX (no x64) and int64 on
    TensorFlow, as each backend creates it.
    """

    def same(x: np.ndarray, y: np.ndarray) -> bool:
        if x.dtype != y.dtype and not (int_width and x.dtype.kind == y.dtype.kind == "i"):
            return False
        return np.array_equal(x, y)

    with np.load(a_path) as a, np.load(b_path) as b:
        assert sorted(a.files) == sorted(b.files)
        return [k for k in a.files if not same(a[k], b[k])]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """Per backend, lazily: the final state of an uninterrupted run of EPOCHS epochs."""
    root = tmp_path_factory.mktemp("reference")
    done: dict[str, Path] = {}

    def get(backend: str) -> Path:
        if backend not in done:
            out = root / f"{backend}.npz"
            run_job(backend, "train", str(root / backend), str(EPOCHS), str(out))
            done[backend] = out
        return done[backend]

    return get


def kill_and_resume(backend: str, tmp_path: Path, *flags: str) -> Path:
    """Train with SIGKILL in epoch KILL_IN, then resume in a new process to EPOCHS; return the final state."""
    directory = str(tmp_path / "job")
    run_job(backend, "train", directory, str(EPOCHS), str(tmp_path / "killed.npz"), "--kill-in", str(KILL_IN),
            *flags, expect=-signal.SIGKILL)  # fmt: skip
    out = tmp_path / "resumed.npz"
    said = run_job(backend, "train", directory, str(EPOCHS), str(out), *flags)
    # The last epoch end's write is asynchronous (the default): at the kill it may still be in flight, and the
    # resume then takes the epoch before it. Either way the run must end bit-identical.
    assert re.search(rf"initial_epoch=({KILL_IN - 2}|{KILL_IN - 1})\n", said), said
    return out


@pytest.mark.needs_package("jax")
def test_public_api_works_under_jax_with_tensorflow_blocked(tmp_path: Path) -> None:
    """With ``import tensorflow`` failing, the callback, restart(), load_weights, JobRunner and the CLI work on JAX."""
    out = run_job("jax", "no-tf", str(tmp_path), block_tf=True)
    assert "NO-TF OK backend=jax" in out


@pytest.mark.parametrize("backend", on("jax", "torch"))
def test_kill9_resume_with_fit_defaults_is_bit_identical(backend: str, tmp_path: Path, reference) -> None:
    """SIGKILL mid-epoch, restart() in a new process: weights and optimizer equal an uninterrupted run's, bit for
    bit, with shuffle=True and an unseeded Dropout."""
    assert differing(reference(backend), kill_and_resume(backend, tmp_path)) == []


@pytest.mark.parametrize("backend", on("jax", "torch"))
def test_kill9_resume_unshuffled_is_bit_identical(backend: str, tmp_path: Path) -> None:
    """Without shuffling, the unseeded Dropout's SeedGenerator state in the checkpoint makes a resume exact."""
    ref = tmp_path / "ref.npz"
    run_job(backend, "train", str(tmp_path / "ref"), str(EPOCHS), str(ref), "--no-shuffle")
    assert differing(ref, kill_and_resume(backend, tmp_path, "--no-shuffle")) == []


@pytest.mark.parametrize(("saver", "loader"), on(("jax", "tensorflow"), ("tensorflow", "jax"), ("torch", "jax")))
def test_checkpoint_restores_bit_identical_under_another_backend(saver: str, loader: str, tmp_path: Path) -> None:
    """A checkpoint written under one backend restores under another with every weight and optimizer
    variable bit-identical (the step counter keeps its value in the loading backend's integer width)."""
    saved, loaded = tmp_path / "saved.npz", tmp_path / "loaded.npz"
    run_job(saver, "save", str(tmp_path / "job"), str(saved))
    assert "loaded epoch=2" in run_job(loader, "load", str(tmp_path / "job"), str(loaded))
    assert differing(saved, loaded, int_width=True) == []


@pytest.mark.parametrize("backend", on("jax", "torch"))
def test_sync_snapshot_is_a_view_and_async_snapshot_owns_its_arrays(backend: str) -> None:
    """On JAX and torch CPU a sync snapshot aliases the variables (no copy); an async one is a copy that
    keeps its values while training goes on (JAX donates, torch updates in place)."""
    assert "SNAPSHOT OK" in run_job(backend, "snapshot")


DOCS = REPO / "docs" / "backends.rst"


def _doc_examples() -> list[tuple[str, str]]:
    """(backend, script) of each Python example in docs/backends.rst."""
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", DOCS.read_text())
    scripts = ["\n".join(line[3:] for line in block.split("\n")) for block in blocks]
    return [(re.search(r'KERAS_BACKEND"\] = "(\w+)"', s).group(1), s) for s in scripts]


@pytest.mark.parametrize(
    ("backend", "script"),
    [pytest.param(b, s, marks=on(b)[0].marks) for b, s in _doc_examples()],
    ids=lambda v: v if len(v) < 20 else "",
)
def test_docs_jobrunner_example_runs_and_resumes(backend: str, script: str, tmp_path: Path) -> None:
    """Each JobRunner example of docs/backends.rst runs as printed, and a second run resumes at epoch 3."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.startswith("{'loss': "), out.stdout
    directory = next(tmp_path.glob("ckpt_*"))
    assert sorted(p.name for p in (directory / "ckpts" / "epochs").iterdir()) == ["000", "001", "002", "003"]
    log = (directory / "ckpt.log").read_text()
    assert "resumed from" in log and "(after epoch 3," in log
