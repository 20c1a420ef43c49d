"""Preemption under MultiWorkerMirroredStrategy: a signal to one worker, every worker saves the same step.

Two real worker processes on localhost (``mw_preempt_job.py``), each with its own
``TF_CONFIG``. The non-chief waits after a known batch until SIGTERM has
reached it; it sets the notice key of TensorFlow's coordination service at its
next step, the workers agree once on one step (that one, or the next if the
chief had passed it), both save it, the chief commits it, and both stop (or
exit with ``ckpt_preempt_exit_code``). The restarted cluster continues from that
step and ends bit-identical to an uninterrupted run of the same shape (two
replicas: each all-reduced element is ``a + b``, exact on CPU).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from cluster import WorkerCluster
from pace import wait_s

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]

RUN_TIMEOUT_S = wait_s(100)  # one cluster run, scaled to the machine (pace); a hang fails instead of blocking CI


class Cluster(WorkerCluster):
    """Worker processes of ``mw_preempt_job.py`` (two; one for ``mirrored``); ``extra[i]``: worker ``i``'s arguments."""

    def __init__(self, tmp: Path, name: str, kind: str, directory: Path, epochs: int, extra=None) -> None:
        n = 1 if kind.startswith("mirrored") else 2
        super().__init__("mw_preempt_job.py", tmp, name, kind, directory, epochs, n, extra, timeout_s=RUN_TIMEOUT_S)

    def wait(self) -> list[int]:
        """Wait for the workers (bounded); return their exit codes."""
        return self.exit_codes()


def run_to_end(tmp: Path, name: str, kind: str, directory: Path, epochs: int) -> Cluster:
    cluster = Cluster(tmp, name, kind, directory, epochs)
    codes = cluster.wait()
    for i in range(len(codes)):
        assert codes[i] == 0 and "DONE" in cluster.output(i), f"worker {i} exited {codes[i]}:\n{cluster.output(i)}"
    return cluster


def preempt(tmp: Path, kind: str, directory: Path, epochs: int, wait_at: str, exit_code: int | None) -> Cluster:
    """Run a cluster, SIGTERM the non-chief while it waits after batch ``wait_at``; return the stopped cluster."""
    extra = ["--exit-code", str(exit_code)] if exit_code is not None else []
    last = 0 if kind.startswith("mirrored") else 1  # the process that gets the signal: the non-chief
    extras = {0: extra, last: [*extra, "--wait-at", wait_at]}
    cluster = Cluster(tmp, "run", kind, directory, epochs, extra=extras)
    cluster.wait_for(last, "WAITING")
    os.kill(cluster.procs[last].pid, signal.SIGTERM)
    codes = cluster.wait()
    expected = 143 if exit_code is None else exit_code  # the default: 128 + SIGTERM, on every worker
    for i in range(len(codes)):
        assert codes[i] == expected, f"worker {i} exited {codes[i]}:\n{cluster.output(i)[-3000:]}"
    return cluster


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def step_checkpoints(directory: Path) -> list[dict]:
    """The sidecars of the chief's committed step checkpoints, oldest first."""
    root = directory / "ckpts" / "steps"
    return [json.loads((d / "ckpt-info.json").read_text()) for d in sorted(root.iterdir())] if root.is_dir() else []


def assert_preempted_at(
    cluster: Cluster, directory: Path, epoch: int, step: int, files: list[str], reason: str = "SIGTERM"
) -> int:
    """Both workers saved the same step S of ``epoch``, ``step`` or the next (the workers agree once, through
    the coordination service, on one more than the steps they had passed when the notice came: the chief may
    have passed ``step`` already); the chief committed exactly that, recording the signal's own reason (not
    "peer"), the non-chief nothing. Returns S."""
    said = {cluster.line(i, r"^PREEMPTED (\d+):(\d+)").groups() for i in range(len(cluster.procs))}
    assert len(said) == 1, said
    ((at_epoch, at_step),) = said
    assert int(at_epoch) == epoch and int(at_step) in (step, step + 1), said
    (side,) = step_checkpoints(directory)
    assert (side["epoch"], side["step"], side["reason"]) == (epoch, int(at_step), reason)
    assert sorted(side["files"]) == files
    assert not any((directory / "ckpts").glob(".tmp-worker-*"))  # the non-chief's scratch copy is gone
    assert os.readlink(directory / "ckpts" / "last") == f"epochs/{epoch:03d}"  # the epochs before it
    return int(at_step)


def test_job_runner_sigterm_to_non_chief_both_save_same_step_and_exit_with_code(tmp_path: Path) -> None:
    """JobRunner on 2 workers: SIGTERM to worker 1 after batch 1 of epoch 1; both save step 3 (or 4) of epoch 1,
    the chief commits it, both exit 42; the restarted cluster continues from that step (model, optimizer
    and loop state) and ends bit-identical to an uninterrupted run."""
    ckpt, ref_dir = tmp_path / "ckpt", tmp_path / "ref"
    ref = Cluster(tmp_path, "ref", "k3", ref_dir, 3)  # runs alongside
    run = preempt(tmp_path, "k3", ckpt, 3, "1:1", exit_code=42)
    at = assert_preempted_at(run, ckpt, 1, 3, ["loop_state.json", "model.weights.h5"])
    again = run_to_end(tmp_path, "again", "k3", ckpt, 3)
    for i in range(2):  # 8 batches per epoch
        assert again.line(i, r"^RESTORED epoch=(\d+) step=(\d+) batches=(\d+)").groups() == ("1", str(at), str(8 + at))
    assert_same(again.restored(0), again.restored(1))
    assert ref.wait() == [0, 0]
    for i in range(2):
        assert_same(again.final(i), ref.final(0))
    # The resumed epoch's loss is the whole epoch's (its sum is loop state), as in the uninterrupted run.
    sidecars = [json.loads((d / "ckpts" / "epochs" / "002" / "ckpt-info.json").read_text()) for d in (ckpt, ref_dir)]
    assert sidecars[0]["logs"] == sidecars[1]["logs"]


def test_tf_keras_fit_sigterm_to_non_chief_both_save_same_step_and_stop(tmp_path: Path) -> None:
    """tf_keras fit on 2 workers: SIGTERM to worker 1 after batch 0 of epoch 1; both save step 2 (or 3) of
    epoch 1 and exit 143 (the default, the chief too); restart() on every worker returns that epoch and step, and the
    cluster that fits the rest ends bit-identical to an uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    ref = Cluster(tmp_path, "ref", "tfk", tmp_path / "ref", 3)
    run = preempt(tmp_path, "tfk", ckpt, 3, "1:0", exit_code=None)
    at = assert_preempted_at(run, ckpt, 1, 2, ["model.h5", "model_weights.h5", "optimizer.npz", "train.state.npz"])
    again = run_to_end(tmp_path, "again", "tfk", ckpt, 3)
    for i in range(2):
        assert again.line(i, r"^RESTORED epoch=(\d+) step=(\d+)").groups() == ("1", str(at))
    assert_same(again.restored(0), again.restored(1))
    assert ref.wait() == [0, 0]
    for i in range(2):
        assert_same(again.final(i), ref.final(0))


def test_mirrored_keras3_fit_sigterm_saves_the_next_step_and_resumes_bit_identical(tmp_path: Path) -> None:
    """Keras 3 fit under MirroredStrategy on 2 logical CPUs with the Keras 3 callback: SIGTERM after batch 1
    of epoch 1 saves step 3 of epoch 1 and exits 42; restart() and fit continue from that step and end
    bit-identical to an uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    ref = Cluster(tmp_path, "ref", "mirrored-fit", tmp_path / "ref", 3)
    run = preempt(tmp_path, "mirrored-fit", ckpt, 3, "1:1", exit_code=42)
    (side,) = step_checkpoints(ckpt)
    assert (side["epoch"], side["step"], side["reason"]) == (1, 3, "SIGTERM")
    assert run.line(0, r"^PREEMPTED (\d+):(\d+)").groups() == ("1", "3")
    again = run_to_end(tmp_path, "again", "mirrored-fit", ckpt, 3)
    assert again.line(0, r"^RESTORED epoch=(\d+) step=(\d+)").groups() == ("1", "3")
    assert ref.wait() == [0]
    assert_same(again.final(0), ref.final(0))
