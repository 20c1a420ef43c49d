"""ckpt_save_steps=auto in a 2-process JAX job: both processes take their step checkpoints at the same steps."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob  # noqa: E402
from pace import wait_s  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]


def stats(job: JaxJob, i: int) -> dict:
    (line,) = [line for line in job.output(i).splitlines() if line.startswith("STATS ")]
    return json.loads(line[len("STATS ") :])


def test_two_processes_take_auto_step_checkpoints_at_the_same_steps(tmp_path) -> None:
    """Each process measures its own times, yet both take the primary's interval, adopted at the same point of the
    run (an asynchronous job: the save after the one that carried it), so their step checkpoints fall on the same
    steps; stats()["steps"] is the same on both."""
    # Steps of 0.1 s at least, and long enough for three intervals an epoch: the interval follows the measured save,
    # which a busy disk stretches (the 2% bound), and an epoch of fixed steps would end before it.
    flags = ["--rows=1600", "--step-sleep=0.1", "--intervals=3", "--mtbf=1", "--print-stats"]
    job = JaxJob(tmp_path, "a", "dp", tmp_path / "ck", 3, extra={0: flags, 1: flags}, timeout_s=wait_s(300))
    job.succeed()
    primary, other = stats(job, 0), stats(job, 1)
    steps = [[(s["epoch"], s["step"]) for s in st["saves"] if s.get("step")] for st in (primary, other)]
    assert steps[0], f"no step checkpoint: {primary['steps']}, {primary['saves']}"
    assert steps[0] == steps[1]
    assert primary["steps"] == other["steps"] and primary["steps"]["reason"] in ("overhead", "young-daly")
    assert {epoch for epoch, _ in steps[0]} == {2}  # adopted at epoch 2's save: none in the first two epochs
    print(f"step checkpoints at {steps[0]}; {primary['steps']}")
