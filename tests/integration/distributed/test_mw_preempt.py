"""Preemption under MultiWorkerMirroredStrategy: a signal to one worker, every worker saves the same step.

Two real worker processes on localhost (``mw_preempt_job.py``), each with its own
``TF_CONFIG``. The non-chief waits after a known batch until SIGTERM has
reached it; the workers' next agreement (an all-reduce after every step) makes
both save the following step, the chief commits it, and both stop (or exit
with ``ckpt_preempt_exit_code``). The restarted cluster continues from that
step and ends bit-identical to an uninterrupted run of the same shape (two
replicas: each all-reduced element is ``a + b``, exact on CPU).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from locations import REPO, job_script

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]

JOB = job_script("mw_preempt_job.py")
RUN_TIMEOUT_S = 300  # one cluster run; a hang fails instead of blocking CI


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    """Worker processes of ``mw_preempt_job.py`` (two; one for ``mirrored``); ``extra[i]``: worker ``i``'s arguments."""

    def __init__(self, tmp: Path, name: str, kind: str, directory: Path, epochs: int, extra=None) -> None:
        n = 1 if kind.startswith("mirrored") else 2
        self.outs = [tmp / f"{name}-w{i}.npz" for i in range(n)]
        self.logs = [tmp / f"{name}-w{i}.log" for i in range(n)]
        workers = [f"localhost:{p}" for p in _free_ports(n)]
        self.procs: list[subprocess.Popen] = []
        for i in range(n):
            env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
            env.pop("TF_CONFIG", None)
            if n > 1:
                task = {"type": "worker", "index": i}
                env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": task})
            if kind == "tfk":
                env["TF_USE_LEGACY_KERAS"] = "1"
            args = [sys.executable, str(JOB), kind, str(directory), str(epochs), str(self.outs[i])]
            args += list((extra or {}).get(i, []))
            with open(self.logs[i], "wb") as log:
                self.procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))

    def output(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)

    def wait_for(self, i: int, marker: str) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while marker not in self.output(i):
            if self.procs[i].poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"worker {i} never printed {marker!r}:\n{self.output(i)[-3000:]}")
            time.sleep(0.1)

    def wait(self) -> list[int]:
        """Wait for both workers (bounded); return their exit codes."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for i, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"cluster timed out; worker {i}:\n{self.output(i)[-3000:]}")
        return [p.returncode for p in self.procs]

    def line(self, i: int, pattern: str) -> re.Match:
        found = re.search(pattern, self.output(i), re.MULTILINE)
        assert found, f"worker {i} printed no {pattern!r}:\n{self.output(i)[-3000:]}"
        return found

    def final(self, i: int) -> dict[str, np.ndarray]:
        return dict(np.load(self.outs[i]))

    def restored(self, i: int) -> dict[str, np.ndarray]:
        return dict(np.load(str(self.outs[i]) + ".restored.npz"))


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
    expected = 0 if exit_code is None else exit_code
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
    cluster: Cluster, directory: Path, epoch: int, step: int, files: list[str], reason: str = "peer"
) -> None:
    """Both workers saved ``step`` steps of ``epoch``; the chief committed exactly that (its reason: ``peer``,
    the signal went to another worker), the non-chief nothing."""
    for i in range(len(cluster.procs)):
        assert cluster.line(i, r"^PREEMPTED (\d+):(\d+)").groups() == (str(epoch), str(step))
    (side,) = step_checkpoints(directory)
    assert (side["epoch"], side["step"], side["reason"]) == (epoch, step, reason)
    assert sorted(side["files"]) == files
    assert not any((directory / "ckpts").glob(".tmp-worker-*"))  # the non-chief's scratch copy is gone
    assert os.readlink(directory / "ckpts" / "last") == f"epochs/{epoch:03d}"  # the epochs before it


def test_job_runner_sigterm_to_non_chief_both_save_same_step_and_exit_with_code(tmp_path: Path) -> None:
    """JobRunner on 2 workers: SIGTERM to worker 1 after batch 1 of epoch 1; both save step 3 of epoch 1,
    the chief commits it, both exit 42; the restarted cluster continues from that step (model, optimizer
    and loop state) and ends bit-identical to an uninterrupted run."""
    ckpt, ref_dir = tmp_path / "ckpt", tmp_path / "ref"
    ref = Cluster(tmp_path, "ref", "k3", ref_dir, 3)  # runs alongside
    run = preempt(tmp_path, "k3", ckpt, 3, "1:1", exit_code=42)
    assert_preempted_at(run, ckpt, 1, 3, ["loop_state.json", "model.weights.h5"])
    again = run_to_end(tmp_path, "again", "k3", ckpt, 3)
    for i in range(2):
        assert again.line(i, r"^RESTORED epoch=(\d+) step=(\d+) batches=(\d+)").groups() == ("1", "3", "11")
    assert_same(again.restored(0), again.restored(1))
    assert ref.wait() == [0, 0]
    for i in range(2):
        assert_same(again.final(i), ref.final(0))
    # The resumed epoch's loss is the whole epoch's (its sum is loop state), as in the uninterrupted run.
    sidecars = [json.loads((d / "ckpts" / "epochs" / "002" / "ckpt-info.json").read_text()) for d in (ckpt, ref_dir)]
    assert sidecars[0]["logs"] == sidecars[1]["logs"]


def test_tf_keras_fit_sigterm_to_non_chief_both_save_same_step_and_stop(tmp_path: Path) -> None:
    """tf_keras fit on 2 workers: SIGTERM to worker 1 after batch 0 of epoch 1; both save step 2 of
    epoch 1 and stop training (exit 0); restart() on every worker returns that epoch and step, and the
    cluster that fits the rest ends bit-identical to an uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    ref = Cluster(tmp_path, "ref", "tfk", tmp_path / "ref", 3)
    run = preempt(tmp_path, "tfk", ckpt, 3, "1:0", exit_code=None)
    assert_preempted_at(run, ckpt, 1, 2, ["model.h5", "model_weights.h5", "optimizer.npz"])
    again = run_to_end(tmp_path, "again", "tfk", ckpt, 3)
    for i in range(2):
        assert again.line(i, r"^RESTORED epoch=(\d+) step=(\d+)").groups() == ("1", "2")
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
