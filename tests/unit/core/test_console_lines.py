"""A console record starts a line of its own even when it comes from another thread than the progress bar's.

The async saver logs "epoch N: saved ..." from its own thread while the training
thread draws the next epoch's progress bar; stdout and stderr reach a terminal
(or a batch job's output file) as one stream. CI once saw ``1/12 ━━━ loss: 1.19
2026-12-01 ... candle_ckpt INFO: epoch 1: saved``: the bar was drawn between the
handler ending the line and writing its record.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
import time

import pytest

from candle_ckpt.core.log import ConsoleHandler, LineTracker

RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ candle_ckpt INFO: ")


class OnePipe(io.StringIO):
    """stdout and stderr into one pipe; each write gives other threads a chance to run, as a real pipe's does."""

    def write(self, text: str) -> int:
        written = super().write(text)
        time.sleep(0)
        return written


def test_a_record_from_another_thread_never_continues_a_progress_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread drawing a bar (no newline) beside one logging 300 records: every record begins its line."""
    pipe = OnePipe()
    tracker = LineTracker(pipe)
    monkeypatch.setattr(sys, "stdout", tracker)
    handler = ConsoleHandler()
    handler.setStream(pipe)
    logger = logging.getLogger("candle_ckpt.test_console_lines")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    stop = threading.Event()

    def draw_bar() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            tracker.write(f"\r {step % 12 + 1}/12 ━━━━━━ - loss: 1.19")
            tracker.flush()

    bar = threading.Thread(target=draw_bar, daemon=True)
    bar.start()
    try:
        for epoch in range(300):
            logger.info("epoch %d: saved %03d", epoch, epoch)
    finally:
        stop.set()
        bar.join(timeout=10)
        logger.removeHandler(handler)
    assert not bar.is_alive()
    records = [line for line in pipe.getvalue().splitlines() if "candle_ckpt INFO" in line]
    assert len(records) == 300
    mixed = [line for line in records if not RECORD.match(line)]
    assert not mixed, mixed[:3]
