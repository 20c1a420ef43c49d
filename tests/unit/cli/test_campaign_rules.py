"""The pure rules of ``candle-ckpt campaign`` (candle_ckpt/cli/campaign_state.py): each state, the counts, the
stale threshold, the summary and the order of the rows. No file, no Keras."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candle_ckpt.cli import campaign_state as S

NOW = 1_800_000_000.0


def commit(epoch: int = 6, age: float = 5.0, **fields) -> S.Commit:
    """A commit ``age`` seconds old, 20 s of training per epoch, 10 epochs to go in all."""
    values = {"generation": epoch, "time_elapsed": 20.0 * epoch, "reason": "best", "limit": 10, "metric": "val_loss"}
    values.update(best=0.5, best_epoch=epoch, mode="min")
    values.update(fields)
    return S.Commit(epoch=epoch, time=NOW - age, **values)


def rec(event: str, age: float, host: str = "node-a", **fields) -> dict:
    return {"event": event, "time": NOW - age, "host": host, **fields}


def facts(newest: S.Commit | None = None, history=(), **fields) -> S.RunFacts:
    return S.RunFacts("run-1", "/c/run-1", "persistent", newest, list(history), **fields)


def state(f: S.RunFacts) -> str:
    return S.classify(f, NOW)[0]


def test_keras_is_not_imported() -> None:
    """The rules and the reader are light: importing them in a fresh interpreter loads neither Keras nor TensorFlow."""
    heavy = "{'keras', 'tensorflow', 'matplotlib'}"
    code = f"import sys, candle_ckpt.cli.campaign; print(sorted({heavy} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.parametrize(
    "newest",
    [commit(10, reason="best"), commit(4, reason="final", limit=None), commit(3, finished=True, limit=None)],
    ids=["epoch limit reached", "final reason", "a callback ended it"],
)
def test_a_run_whose_newest_epoch_checkpoint_ends_it_is_done(newest: S.Commit) -> None:
    """Done: the sidecar's epoch limit is reached, the save is the final one, or EarlyStopping ended it."""
    assert state(facts(newest)) == "done"


def test_a_step_checkpoint_at_the_limit_is_not_done_and_an_old_sidecar_without_the_limit_trains_on() -> None:
    """A step checkpoint is inside an epoch, never the end; a sidecar without 'epochs' and with reason best is
    not taken for done."""
    assert state(facts(commit(10, step=3, reason="steps"))) == "training"
    assert state(facts(commit(10, limit=None))) == "training"


def test_a_preemption_save_not_restarted_since_is_preempted_and_a_restart_after_it_trains() -> None:
    """A SIGTERM save is preempted until a restart record comes after it."""
    newest = commit(6, step=2, reason="SIGTERM", age=100.0)
    assert state(facts(newest, [rec("restart", 500.0)])) == "preempted"
    assert state(facts(newest, [rec("restart", 500.0), rec("restart", 50.0)])) == "training"


def test_a_failure_after_the_newest_commit_is_failed_until_a_restart() -> None:
    """The newest record is a failure after the commit: failed; a later restart makes it train again."""
    history = [rec("restart", 500.0), rec("failure", 2.0, error="ValueError: nan")]
    assert S.classify(facts(commit(age=5.0), history), NOW) == ("failed", "the process failed: ValueError: nan")
    assert state(facts(commit(age=5.0), [*history, rec("restart", 1.0)])) == "training"


def test_a_crash_loop_refusal_is_refused_until_the_run_restarts_or_commits() -> None:
    """A refused record as the newest restart-or-refusal is refused; a later restart or commit clears it."""
    loop = [rec("restart", 90.0), rec("refused", 60.0, resumed="epochs/006", count=3)]
    assert S.classify(facts(commit(age=100.0), loop), NOW)[0] == "refused"
    assert "epochs/006 resumed 3 times" in S.classify(facts(commit(age=100.0), loop), NOW)[1]
    assert state(facts(commit(age=100.0), [*loop, rec("restart", 10.0)])) == "training"
    assert state(facts(commit(age=5.0), loop)) == "training"


def test_a_lineage_refusal_in_ckpt_log_is_refused_even_when_done() -> None:
    """The drain's lineage refusal outranks every other state: the persistent tier does not hold this run."""
    assert state(facts(commit(10), lineage_refusal="ckpt_persistent_url P: it holds ...")) == "refused"


def test_stale_after_k_times_the_runs_own_epoch_time_with_a_floor() -> None:
    """20 s per epoch: stale after max(300 s, 3 x 20 s); 200 s per epoch: after 600 s; the clock restarts at a
    restart record."""
    assert S.stale_after(commit(6)) == 300.0
    assert S.stale_after(commit(6, time_elapsed=1200.0)) == 600.0
    assert S.stale_after(None) == S.STALE_FLOOR_S
    assert state(facts(commit(age=299.0))) == "training"
    assert state(facts(commit(age=301.0))) == "stale"
    assert state(facts(commit(age=500.0, time_elapsed=1200.0))) == "training"
    assert state(facts(commit(age=601.0, time_elapsed=1200.0))) == "stale"
    assert state(facts(commit(age=900.0), [rec("restart", 100.0)])) == "training"
    assert S.classify(facts(commit(age=400.0)), NOW, factor=30.0, floor=1.0)[0] == "training"


def test_a_run_with_no_commit_is_judged_by_its_newest_restart_or_its_files() -> None:
    """Nothing committed: a recent restart trains, an old one is stale; with no history, the files' mtime."""
    assert state(facts(None, [rec("restart", 30.0)])) == "training"
    assert state(facts(None, [rec("restart", 3000.0)])) == "stale"
    assert state(facts(None, seen=NOW - 3000.0)) == "stale"
    assert state(facts(None)) == "training"


def test_restarts_count_resumes_and_moves_count_host_changes() -> None:
    """A fresh start on a, resumes on a, b, a: 3 restarts, 2 moves; a fresh start is no restart; the newest restart
    on another host than the start before it is moved."""
    resumed = {"resumed": "epochs/001"}
    history = [rec("restart", 40, "a"), rec("restart", 30, "a", **resumed), rec("failure", 25, "a")]
    history.append(rec("restart", 20, "b", **resumed))
    assert S.restarts_and_moves(history) == (2, 1)
    assert state(facts(commit(age=1.0), history)) == "moved"
    history.append(rec("restart", 10, "a", **resumed))
    assert S.restarts_and_moves(history) == (3, 2)
    history.append(rec("restart", 5, "b"))  # started afresh by hand on b: a start, not a restart nor a move
    assert S.restarts_and_moves(history) == (3, 2)
    assert S.restarts_and_moves([]) == (0, 0)


def test_summary_counts_states_and_names_the_best_run_by_the_metrics_mode() -> None:
    """The summary counts every state; the best run is the lowest val_loss (min) or highest accuracy (max)."""
    rows = [
        S.row(facts(commit(10, best=0.3, best_epoch=8)), NOW) | {"run": "r1"},
        S.row(facts(commit(6, best=0.2, best_epoch=5)), NOW) | {"run": "r2"},
        S.row(facts(commit(6, age=9999.0, best=0.4)), NOW) | {"run": "r3"},
    ]
    info = S.summary(rows)
    assert info["states"] == {**dict.fromkeys(S.STATES, 0), "done": 1, "training": 1, "stale": 1}
    assert info["best"] == {"run": "r2", "metric": "val_loss", "best": 0.2, "best_epoch": 5}
    assert S.summary_line(info) == "3 runs: 1 done, 1 training, 1 stale, 0 refused; best val_loss 0.2 in r2 at epoch 5"
    acc = [S.row(facts(commit(6, metric="acc", mode="max", best=b)), NOW) | {"run": f"a{b}"} for b in (0.7, 0.9)]
    assert S.best_row(acc)["run"] == "a0.9"
    assert S.summary_line(S.summary([])) == "0 runs: 0 done, 0 training, 0 stale, 0 refused; no monitored metric"


def test_rows_sort_by_each_key() -> None:
    """--sort: run names, states in their order, oldest first, best first, most restarts first."""
    rows = [
        {"run": "b", "state": "stale", "age_s": 10.0, "best": 0.3, "mode": "min", "epoch": 2, "restarts": 0},
        {"run": "a", "state": "done", "age_s": 99.0, "best": 0.1, "mode": "min", "epoch": 9, "restarts": 3},
        {"run": "c", "state": "training", "age_s": None, "best": None, "mode": None, "epoch": None, "restarts": 1},
    ]
    assert [r["run"] for r in S.sort_rows(rows, "run")] == ["a", "b", "c"]
    assert [r["run"] for r in S.sort_rows(rows, "state")] == ["a", "c", "b"]
    assert [r["run"] for r in S.sort_rows(rows, "age")] == ["a", "b", "c"]
    assert [r["run"] for r in S.sort_rows(rows, "best")] == ["a", "b", "c"]
    assert [r["run"] for r in S.sort_rows(rows, "restarts")] == ["a", "c", "b"]
    assert [r["run"] for r in S.sort_rows(rows, "epoch")] == ["a", "b", "c"]


def test_ages_keep_one_shape() -> None:
    """H:MM:SS whatever the age, hours past 24 included; no age is '-'."""
    assert [S.fmt_age(s) for s in (4.4, 61, 3600 * 30 + 5, None)] == ["0:00:04", "0:01:01", "30:00:05", "-"]


def test_timestamps_parse_with_their_offset_and_bad_ones_are_none() -> None:
    """The sidecar's local time with its offset is one instant; a malformed stamp is unknown, not an error."""
    assert S.parse_timestamp("2026-11-28T18:05:34+0000") == S.parse_timestamp("2026-11-28T19:05:34+0100")
    assert S.parse_timestamp("yesterday") is None and S.parse_timestamp("") is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["restart", "failure", "refused"]), st.floats(0, 1e4), st.sampled_from("ab")),
        max_size=8,
    ),
    st.one_of(st.none(), st.floats(0, 1e4)),
    st.sampled_from(["best", "final", "SIGTERM", "interval"]),
)
def test_every_run_gets_exactly_one_known_state(events, age, reason) -> None:
    """Whatever the history and the newest commit, a run is in one of the documented states, with a reason."""
    history = sorted((rec(e, a, h) for e, a, h in events), key=lambda r: r["time"])
    newest = commit(age=age, reason=reason) if age is not None else None
    got, why = S.classify(facts(newest, history), NOW)
    assert got in S.STATES and why
