"""The multi-process protocol's cost, counted: no call on a quiet step, O(N) per meeting, a bounded store.

N processes (1 CPU device each, gloo) run ``jax_count_job.py``: ``restart()``, a fit of 3 epochs x 100
steps with a checkpoint at each epoch end, then a second fit with a second callback. Its counting proxy
around the JAX coordination client counts every call candle_ckpt makes (see the job's docstring). At
N = 2 and 4 (and 8 with ``CANDLE_CKPT_COUNT_8=1``: 8 processes on a small machine take minutes) the test asserts:

- 0 calls from the training thread, and at most one (a watcher's renewed read) from any thread, over 80
  quiet steps;
- a save meeting and a restore meeting cost at most a constant times N calls summed over the processes
  (the old all-to-all cost N * (N - 1) reads per meeting point);
- at most 4N keys under ``candle_ckpt/`` in the middle of the run, and after both fits only the N
  per-rank scope counters.
"""

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

SIZES = [2, 4] + ([8] if os.environ.get("CANDLE_CKPT_COUNT_8") == "1" else [])


@pytest.mark.parametrize("n", SIZES)
def test_calls_per_step_per_meeting_and_keys_left(tmp_path, n: int) -> None:
    """Quiet steps make no call; a save or restore meeting costs O(N) calls; the store stays within 4N keys."""
    job = JaxJob(tmp_path, "c", "dp", tmp_path / "ck", 3, n=n, timeout_s=wait_s(60 + 30 * n), script="jax_count_job.py")
    job.succeed()
    reports = [json.loads(open(str(out) + ".json").read()) for out in job.outs]
    for r in reports:
        assert r["quiet"]["main"] == 0, r
        assert r["quiet"]["all"] <= 1, r
    save = sum(r["save"] for r in reports)
    restore = sum(r["restore"] for r in reports)
    # A save: 3 meeting points (about 3N calls each at most) and nothing else; a restore: a handful of points.
    assert save <= 12 * n, (save, [r["calls"] for r in reports])
    assert restore <= 16 * n, (restore, [r["calls"] for r in reports])
    primary = reports[0]
    assert len(primary["mid_keys"]) <= 4 * n, primary["mid_keys"]
    assert sorted(primary["end_keys"]) == sorted(f"candle_ckpt/opened/{r}" for r in range(n)), primary["end_keys"]
    print(f"N={n}: save {save} calls ({save / n:.1f} per process), restore {restore} ({restore / n:.1f}), "
          f"mid-run keys {len(primary['mid_keys'])}, keys after close {len(primary['end_keys'])}")  # fmt: skip
