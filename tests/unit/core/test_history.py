"""The restart history's format and the counts read from it (candle_ckpt/core/history.py)."""

from __future__ import annotations

import pytest

from candle_ckpt.core import history as H
from candle_ckpt.core.layout import Layout


def _restart(resumed, t):
    record = H.new_record("restart", resumed=resumed)
    record["time"] = t
    return record


def test_appended_records_read_back_and_a_cut_line_is_skipped(tmp_path):
    """Records appended to the file read back in order; a half-written last line is skipped, not an error."""
    path = Layout.at(tmp_path).history
    assert path == str(tmp_path / "ckpts" / "restarts.jsonl")
    first, second = H.new_record("restart", resumed=None), H.new_record("failure", error="ValueError: x")
    H.append_local(path, first)
    H.append_local(path, second)
    with open(path, "ab") as f:
        f.write(b'{"v":1,"event":"restart","ti')
    assert [r["id"] for r in H.read_local(path)] == [first["id"], second["id"]]
    assert H.read_local(str(tmp_path / "missing.jsonl")) == []


def test_unknown_event_is_refused():
    """An event outside the documented ones is a programming error, named with the choices."""
    with pytest.raises(ValueError, match="history event must be one of restart, failure, refused, progress"):
        H.new_record("started")


def test_no_progress_counts_the_newest_run_of_one_checkpoint_and_a_refusal_resets_it():
    """Three restarts of epochs/005 after one of epochs/004 count 3; a refusal in between ends the count."""
    records = [
        _restart("epochs/004", 1),
        _restart("epochs/005", 2),
        _restart("epochs/005", 3),
        _restart("epochs/005", 4),
    ]
    assert H.no_progress_restarts(records, "epochs/005") == 3
    assert H.no_progress_restarts(records, "epochs/006") == 0
    assert H.no_progress_restarts(records, None) == 0
    refused = H.new_record("refused", resumed="epochs/005", count=3)
    refused["time"] = 3.5
    assert H.no_progress_restarts([*records[:3], refused, records[3]], "epochs/005") == 1


def test_merge_is_a_union_by_id_in_time_order_and_rates_count_restarts_after_the_first():
    """Both tiers' copies merge without doubles; two failures over 100 s give (2, 100)."""
    a, b, c = _restart(None, 10), _restart("epochs/001", 50), _restart("epochs/002", 90)
    merged = H.merge([c, a], [a, b])
    assert [r["time"] for r in merged] == [10, 50, 90]
    assert H.failure_rate(merged, now=110) == (2, 100)
    assert H.failure_rate([], now=5) == (0, 0.0)
    failure = H.new_record("failure", error="hang", phase="input")
    assert H.last_failure([*merged, failure]) == "hang"
    assert H.last_failure(merged) is None


def test_a_progress_record_ends_the_no_progress_count():
    """A start that committed (a progress record) is no crash loop, though the next one resumes the same checkpoint
    (its commits were lost with its node before they were drained)."""
    records = [_restart("epochs/002", 1), _restart("epochs/002", 2)]
    progress = H.new_record("progress", restart=records[1]["id"])
    progress["time"] = 2.5
    assert H.no_progress_restarts(records, "epochs/002") == 2
    assert H.no_progress_restarts([*records, progress, _restart("epochs/002", 3)], "epochs/002") == 1
