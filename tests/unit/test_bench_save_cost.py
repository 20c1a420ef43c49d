"""benchmarks/bench_save_cost.py's analyses: saving stretches paired with their neighbours, drift cancelled.

No Keras, no process: the rows are what its job prints.
"""

from __future__ import annotations

import sys

import pytest
from locations import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import bench_save_cost as B  # noqa: E402


def _rows(times: list[float], saves: int = 3, blocked: float = 0.04, counted: float = 0.05) -> list[dict]:
    return [
        {
            "epoch": e,
            "s": s,
            "saves": saves,
            "blocked": [blocked] * saves if e % 2 else [],
            "counted": [counted] * saves if e % 2 == 0 and e > 1 else [],
        }
        for e, s in enumerate(times)
    ]


def test_a_drifting_machine_cancels_out_of_the_pairs() -> None:
    """Epochs slow down by 0.1 s each (drift); each odd epoch takes 0.15 s more than the mean of its neighbours:
    0.05 s per step checkpoint, whatever the drift. Epoch 1 (next to the compile) is not paired."""
    times = [12.0] + [8.0 + 0.1 * e + (0.15 if e % 2 else 0.0) for e in range(1, 9)]
    out = B.analyse(_rows(times))
    assert out["pairs"] == 3  # epochs 3, 5, 7
    assert out["paired_s"] == pytest.approx(0.05) and out["paired_mean_s"] == pytest.approx(0.05)
    assert out["blocked_s"] == pytest.approx(0.04) and out["counted_s"] == pytest.approx(0.05)
    assert out["overhead_at_bound"] == pytest.approx(0.02)  # counted equals paired: the bound is kept


def test_a_cost_counted_short_shows_as_an_overhead_above_the_bound() -> None:
    """A save that really costs twice what is counted makes the 2% bound cost 4%."""
    times = [12.0] + [8.0 + (0.3 if e % 2 else 0.0) for e in range(1, 8)]
    out = B.analyse(_rows(times, counted=0.05))
    assert out["paired_s"] == pytest.approx(0.1)
    assert out["overhead_at_bound"] == pytest.approx(0.04)
    assert out["overhead_at_every"] == pytest.approx(0.3 / 8.0)


def test_too_few_epochs_to_pair_is_said() -> None:
    with pytest.raises(ValueError, match="--epochs >= 5"):
        B.analyse(_rows([12.0, 8.3, 8.0]))


def test_an_epoch_checkpoints_cost_is_a_saving_blocks_excess_over_its_neighbours_despite_drift() -> None:
    """Blocks of 4 epochs: block 0 compiles (left out), odd blocks save, each saving epoch 0.05 s longer; the
    machine drifts 0.01 s an epoch. Pairs: blocks 3 and 5 (block 1 lacks a whole left neighbour); the run's last
    epoch (always saved) is in no block."""
    times = [3.0] * 4 + [2.0 + 0.01 * e + (0.05 if (e // 4) % 2 else 0.0) for e in range(4, 28)] + [2.5]
    out = B.analyse_blocks(times, 4)
    assert out["pairs"] == 2
    assert out["paired_s"] == pytest.approx(0.05) and out["paired_mean_s"] == pytest.approx(0.05)
    assert out["overhead"] == pytest.approx(0.05 / out["epoch_s"])


def test_too_few_blocks_to_pair_is_said() -> None:
    with pytest.raises(ValueError, match="--epochs >= 21"):
        B.analyse_blocks([2.0] * 17, 4)
