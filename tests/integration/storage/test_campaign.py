"""A campaign at scale on one machine (issue 39): 32 concurrent Quickstart runs, each with its own fast tier and
all draining into one shared persistent directory, each killed with SIGKILL three times at random moments and
restarted on an EMPTY fast tier, as on a new node.

The runs are forked by one server that imported Keras once (``jobs/campaign_job.py``); the TensorFlow backend,
measured cheaper per life than JAX for this model (docs/campaigns.rst).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from campaign_job import Campaign
from pace import wait_s

pytestmark = pytest.mark.slow

RUNS, KILLS, EPOCHS, SEEDS = 32, 3, 10, 8


@pytest.fixture
def campaign(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    c = Campaign(tmp_path, RUNS, KILLS, EPOCHS, seeds=SEEDS, rng_seed=int.from_bytes(os.urandom(2), "little"))
    c.start_server(wait_s(120))
    yield c
    c.close()


def test_32_runs_killed_three_times_each_end_bit_identical_and_never_resume_behind_the_persistent_tier(
    campaign: Campaign, tmp_path: Path
) -> None:
    """Every run is SIGKILLed three times and ends bit-identical to its uninterrupted twin; every restart (on an
    empty fast tier) resumes from at least the newest persistent checkpoint recorded right after the kill; the
    persistent tier holds two files per checkpoint."""
    campaign.play(silence_s=wait_s(120))
    for run in campaign.runs:
        killed = [s for s in run.statuses if os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGKILL]
        assert len(killed) == KILLS and run.statuses[-1] == 0, (run.index, run.statuses)
        assert len(run.resumes) == KILLS + 1 and run.resumes[0] is None
        for k, held in enumerate(run.at_kill):
            resumed = run.resumes[k + 1]
            assert held is None or (resumed is not None and resumed >= held), (run.index, k, held, resumed)
        got = np.load(campaign.out(run) + ".npz")
        want = np.load(str(tmp_path / "out" / f"twin-{run.seed}.npz"))
        assert [k for k in want.files if not np.array_equal(want[k], got[k])] == [], run.index
    shared = tmp_path / "shared"
    for run_dir in sorted(shared.iterdir()):
        for checkpoint in [*run_dir.glob("epochs/*"), *run_dir.glob("steps/*")]:
            assert sorted(os.listdir(checkpoint)) in (["ckpt-info.json", "ckpt.tar"], ["ckpt.tar"]), checkpoint
