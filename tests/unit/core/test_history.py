"""The restart history's format and the counts read from it (candle_ckpt/core/history.py)."""

from __future__ import annotations

import pytest

from candle_ckpt.core import history as H
from candle_ckpt.core.layout import Layout


def _restart(resumed, t):
    """A restart record at time ``t``, by a process of its own (a pid no other record has)."""
    record = H.new_record("restart", resumed=resumed)
    record["time"], record["pid"] = t, 100000 + int(t * 10)
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


def _failed(restart, t):
    """The failure record of ``restart``'s process, at time ``t``."""
    record = H.new_record("failure", restart=restart["id"], error="ValueError: bad batch")
    record["time"], record["pid"] = t, restart["pid"]
    return record


def test_no_progress_counts_failed_resumes_of_one_checkpoint_and_a_refusal_resets_it():
    """Three resumes of epochs/005 that each failed, after one of epochs/004, count 3; a refusal ends the count."""
    records = []
    for t, name in enumerate(["epochs/004", "epochs/005", "epochs/005", "epochs/005"]):
        records += [_restart(name, 2 * t), _failed(_restart(name, 2 * t), 2 * t + 1)]
        records[-1]["restart"] = records[-2]["id"]
    assert H.no_progress_restarts(records, "epochs/005") == 3
    assert H.no_progress_restarts(records, "epochs/006") == 0
    assert H.no_progress_restarts(records, None) == 0
    refused = H.new_record("refused", resumed="epochs/005", count=3)
    refused["time"] = 4.5
    assert H.no_progress_restarts([*records[:5], refused, *records[6:]], "epochs/005") == 1


def test_a_start_killed_from_outside_neither_counts_nor_ends_the_count():
    """A resume whose process left no failure record (SIGKILL, a lost node) is passed over: killed three times
    before committing is no crash loop; between two failed resumes it does not reset their count."""
    killed = [_restart("epochs/002", t) for t in (1, 2, 3)]
    assert H.no_progress_restarts(killed, "epochs/002") == 0
    first, second = _restart("epochs/002", 4), _restart("epochs/002", 6)
    mixed = [first, _failed(first, 4.5), killed[0], second, _failed(second, 6.5)]
    mixed[2]["time"] = 5
    assert H.no_progress_restarts(mixed, "epochs/002") == 2


def test_merge_is_a_union_by_id_in_time_order_and_rates_count_restarts_after_the_first():
    """Both tiers' copies merge without doubles; two failures over 100 s give (2, 100)."""
    a, b, c = _restart(None, 10), _restart("epochs/001", 50), _restart("epochs/002", 90)
    merged = H.merge([c, a], [a, b])
    assert [r["time"] for r in merged] == [10, 50, 90]
    assert H.failure_rate(merged, now=110) == (2, 100)
    assert H.failure_rate([], now=5) == (0, 0.0)
    # A fresh start leaves no record without a persistent tier: a history that begins with a resume counts the
    # failure of the process before it (the first relaunch knows of the first failure).
    assert H.failure_rate([b, c], now=110) == (2, 60)
    assert H.failure_rate([b], now=60) == (1, 10)
    failure = H.new_record("failure", error="hang", phase="input")
    assert H.last_failure([*merged, failure]) == "hang"
    assert H.last_failure(merged) is None


def test_a_progress_record_ends_the_no_progress_count():
    """A start that committed (a progress record) ends the count, though the next one resumes the same checkpoint
    (its commits were lost with its node before they were drained)."""
    a, b = _restart("epochs/002", 1), _restart("epochs/002", 2)
    records = [a, _failed(a, 1.5), b, _failed(b, 2.5)]
    progress = H.new_record("progress", restart=b["id"])
    progress["time"] = 2.2
    assert H.no_progress_restarts(records, "epochs/002") == 2
    assert H.no_progress_restarts([a, _failed(a, 1.5), b, progress], "epochs/002") == 0
