"""Unit checks behind the first-hour experience: readable sizes, short epoch lists, the missing-metric
message and log records on a line of their own (the store's own lock: tests/unit/storage/test_store_lock.py)."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from candle_ckpt.cli.common import epoch_ranges
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.log import ConsoleHandler, human_bytes, track_stdout, untrack_stdout
from candle_ckpt.engine.decision import missing_metric_message


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (42749, "42.7 kB"), (999_999, "1.0 MB"), (2_500_000_000, "2.5 GB")],
)
def test_sizes_are_readable(n: int, text: str) -> None:
    """Byte counts print in B, kB, MB or GB, so a small model is never '0.0 MB'."""
    assert human_bytes(n) == text


def test_long_epoch_lists_are_summarised_as_ranges() -> None:
    """Sixty consecutive epochs print as '1-60'; gaps split the ranges."""
    assert epoch_ranges(range(1, 61)) == "1-60"
    assert epoch_ranges([7, 1, 2, 3, 5, 8]) == "1-3, 5, 7-8"
    assert epoch_ranges([]) == "none"


def test_missing_metric_message_names_the_three_ways_out(tmp_path) -> None:
    """The message names the directory, the metrics present, validation data, another metric and save_best=False."""
    cfg = CkptConfig.from_params({"ckpt_directory": str(tmp_path), "epochs": 3})
    text = missing_metric_message(cfg, 1, {"loss": 0.5})
    assert "'val_loss' is not in the training logs of epoch 1; metrics present: loss" in text
    assert "validation_data" in text and "ckpt_save_best_metric" in text and "ckpt_save_best=False" in text
    assert str(tmp_path) in text


def test_a_log_record_ends_an_unterminated_progress_line_first(monkeypatch) -> None:
    """With stdout tracked, a record written after '...loss: 0.1' (no newline) starts on a new line."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    tracker = track_stdout()
    handler = ConsoleHandler()
    handler.setStream(err)
    log = logging.getLogger("candle_ckpt.test_first_hour")
    log.addHandler(handler)
    log.propagate = False
    try:
        sys.stdout.write("\r3/3 ━━━━ loss: 0.1005")
        log.warning("saved 001")
        sys.stdout.write("\r3/3 ━━━━ loss: 0.1005\n")
        log.warning("saved 002")
    finally:
        log.removeHandler(handler)
        untrack_stdout(tracker)
    assert sys.stdout is out
    assert out.getvalue() == "\r3/3 ━━━━ loss: 0.1005\n\r3/3 ━━━━ loss: 0.1005\n"
    assert err.getvalue().count("saved 00") == 2
