"""The goodput benchmark's pure parts (benchmarks/goodput_lib.py): its seeded schedules and the split of lost time.

No Keras, no process: the processes are dicts of timestamps as the job writes them.
"""

from __future__ import annotations

import sys

import pytest
from locations import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import goodput_lib as G  # noqa: E402


def test_a_schedule_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    """Every contender draws the same list from one seed; another seed draws another list."""
    assert G.schedule("A", 3) == G.schedule("A", 3)
    assert G.schedule("A", 3) != G.schedule("A", 4)
    assert G.schedule("A", 3) != G.schedule("B", 3)


def test_schedule_a_mixes_sigterm_and_sigkill_every_10_to_20_s_and_b_only_kills_every_30_to_90_s() -> None:
    """(A): intervals in [10, 20] s, SIGTERM and SIGKILL at about even odds; (B): SIGKILL only, in [30, 90] s."""
    a = G.schedule("A", 0, count=400)
    assert all(10 <= s <= 20 for s, _ in a)
    terms = sum(kind == "TERM" for _, kind in a)
    assert 150 < terms < 250 and {kind for _, kind in a} == {"TERM", "KILL"}
    b = G.schedule("B", 0, count=100)
    assert all(30 <= s <= 90 for s, _ in b) and {kind for _, kind in b} == {"KILL"}


def test_an_unknown_schedule_is_named_in_the_error() -> None:
    """A schedule name other than A or B raises, naming the choices."""
    with pytest.raises(ValueError, match=r"schedule must be one of \['A', 'B'\], not 'C'"):
        G.schedule("C", 0)


def _process(launch: float, resumed: int, first: float | None, steps: list, exit_: float, signal_at=None) -> dict:
    return {
        "launch": launch,
        "built": launch + 4.0,
        "restored": launch + 5.0,
        "first": first,
        "resumed": resumed,
        "steps": steps,
        "exit": exit_,
        "signal_at": signal_at,
    }


def test_the_split_adds_up_to_the_wall_time_lost_and_charges_the_redone_work() -> None:
    """Two launches: the first is killed 3 s after step 30, the next resumes at step 20 (its last save).

    Start-up 4 s, restore 1 s, compile 2.1 s beyond a 0.1 s step, lost work from step 20 (at 10 s) to the kill
    (at 14 s): 4 s; 10 steps lost; the parts and "other" add up to wall minus the uninterrupted time."""
    steps1 = [[8.0 + 0.1 * k, k] for k in range(1, 31)]  # step k ends at 8 + 0.1 k: step 20 at 10.0, 30 at 11.0
    first = _process(0.0, 0, 8.1, steps1, exit_=14.5, signal_at=14.0)
    steps2 = [[22.1 + 0.1 * k, 20 + k] for k in range(1, 101)]  # 100 more steps, from step 20
    second = _process(15.0, 20, 22.2, steps2, exit_=32.5)
    out = G.split([first, second], uninterrupted_s=18.0)
    per = out["per_interruption"]
    assert out["interruptions"] == 1 and out["wall_s"] == pytest.approx(32.5)
    assert out["step_s"] == pytest.approx(0.1)
    assert per["startup"] == pytest.approx(4.0) and per["restore"] == pytest.approx(1.0)
    assert per["compile"] == pytest.approx(22.2 - 20.0 - 0.1)
    assert per["lost_work"] == pytest.approx(14.0 - 10.0)
    assert out["lost_steps"] == 10
    parts = sum(per[k] for k in ("startup", "restore", "compile", "lost_work", "other"))
    assert parts == pytest.approx(per["total"]) == pytest.approx(32.5 - 18.0)
    assert out["goodput"] == pytest.approx(18.0 / 32.5)


def test_a_lost_checkpoint_charges_all_the_killed_process_trained_and_the_steps_below_it() -> None:
    """When the next launch resumes below where the killed one began (its checkpoint lost), everything the killed
    one trained is lost, and so are the steps between the two starting points (at the median step time)."""
    steps = [[10.0 + 0.5 * k, 40 + k] for k in range(1, 11)]  # from step 40: 10 steps, 0.5 s each
    killed = _process(0.0, 40, 10.5, steps, exit_=16.0, signal_at=15.5)
    seconds, lost = G.lost_work(killed, resumed=30, step_s=0.5)
    assert seconds == pytest.approx((15.5 - 10.5) + 10 * 0.5)
    assert lost == 20


def test_a_process_killed_before_its_first_step_lost_no_work_and_counts_its_start_so_far() -> None:
    """A launch interrupted during its imports lost no training; its start-up counts up to its exit."""
    early = {"launch": 0.0, "exit": 3.0, "signal_at": 2.9, "steps": [], "resumed": 0}
    assert G.lost_work(early, resumed=0, step_s=0.1) == (0.0, 0)
    assert G.start_parts(early, 0.1) == {"startup": 3.0, "restore": 0.0, "compile": 0.0}


def test_the_modelled_goodput_approaches_one_minus_the_overhead_at_a_long_mtbf() -> None:
    """(1 - overhead) MTBF / (MTBF + L): half at MTBF = L without overhead, near 1 - overhead at a long MTBF."""
    assert G.modelled_goodput(10.0, 10.0, 0.0) == pytest.approx(0.5)
    assert G.modelled_goodput(1e9, 10.0, 0.02) == pytest.approx(0.98)
    with pytest.raises(ValueError, match="mtbf_s must be > 0, not 0"):
        G.modelled_goodput(0.0, 1.0, 0.0)


def test_the_events_of_a_finished_runs_rerun_resume_at_its_restored_step_and_a_cut_line_is_skipped(tmp_path) -> None:
    """A launch that restored step 150 and trained no epoch resumed at 150 (not 0); a line cut by a SIGKILL is
    skipped; batch ends gather into one list."""
    import bench_goodput

    lines = [
        '{"ev": "t0", "t": 1.0, "pid": 7}',
        '{"ev": "built", "t": 5.0}',
        '{"ev": "restored", "t": 6.0, "optimizer_step": 150}',
        '{"ev": "done", "t": 7.0, "digests": {"a": "0"}, "state_bytes": 4, "step": 150}',
        '{"ev": "steps", "t": 8.0, "steps": [[7.5, 1',
    ]
    path = tmp_path / "e.jsonl"
    path.write_text("\n".join(lines))
    out = bench_goodput.read_events(path)
    assert (out["t0"], out["built"], out["restored"], out["resumed"], out["done"]) == (1.0, 5.0, 6.0, 150, 7.0)
    assert out["steps"] == [] and out["digests"] == {"a": "0"}
    path.write_text("\n".join([*lines[:3], '{"ev": "resumed", "t": 6.1, "epoch": 3, "step": 45}']))
    assert bench_goodput.read_events(path)["resumed"] == 45


def test_the_overhead_over_interleaved_rounds_is_the_median_of_each_rounds_own_ratio() -> None:
    import bench_goodput

    none = [
        {"train_s": 100.0, "wall_s": 110.0},
        {"train_s": 120.0, "wall_s": 130.0},
        {"train_s": 100.0, "wall_s": 110.0},
    ]
    runs = [
        {"train_s": 101.0, "wall_s": 111.0},
        {"train_s": 126.0, "wall_s": 136.0},
        {"train_s": 103.0, "wall_s": 113.0},
    ]
    got = bench_goodput.overhead_rounds(none, runs)
    assert got["overhead_each"] == pytest.approx([0.01, 0.05, 0.03])
    assert got["overhead"] == pytest.approx(0.03)  # not 126/100 - 1: a slow round is compared with itself
    assert got["overhead_wall"] == pytest.approx(3 / 110)
    with pytest.raises(ValueError):
        bench_goodput.overhead_rounds(none, runs[:2])


def test_the_write_floor_shows_its_overhead_and_no_goodput_and_is_left_out_of_the_plot() -> None:
    import goodput_report as R

    floor = {"name": "floor: state written + fsync each epoch", "completed": False, "floor": True, "overhead": 0.031}
    row = R.cells("write", floor)
    assert row[0] == floor["name"] and row[1] == "-" and row[-2] == "+3.1%" and row[-1] == "-"
    assert len(row) == len(R.HEAD)
    crashed = {"name": "Keras BackupAndRestore", "completed": False, "why": "crashed 5 times", "overhead": 0.06}
    assert R.cells("backup", crashed)[1] == "0"  # a checkpointer that never completes has goodput 0, not "-"
