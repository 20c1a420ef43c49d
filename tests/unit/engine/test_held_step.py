"""HeldStep: the state before an epoch's last step, held while fit validates (engine/capture.py), by its rules:
which call holds, what a measured window changes, and what an answer commits."""

from __future__ import annotations

import time

import pytest

from candle_ckpt.engine import capture as capture_module
from candle_ckpt.engine.capture import HOLD_FROM_S, HeldStep


def _held(validates=lambda epoch: True) -> HeldStep:
    held = HeldStep(True)
    held.validates = validates
    return held


def _epoch(held: HeldStep, epoch: int, of: int | None, per: int = 1, calls: list | None = None) -> list[tuple]:
    """Run one epoch's step calls (every ``per`` steps); return what was held after each call."""
    seen = []
    for step in range(per, (of or 6) + 1, per):
        last = of is not None and step >= of
        held.after_step(epoch, step, of, {"loss": step}, lambda copy=False, s=step: calls.append((s, copy)) or s, last)
        seen.append(held.held)
    return seen


def test_the_second_to_last_call_holds_an_owned_copy_until_the_epoch_end() -> None:
    held, calls = _held(), []
    assert _epoch(held, 0, 4, calls=calls) == [None, None, (0, 3), (0, 3)]
    assert calls == [(3, True)]  # one capture an epoch, a copy
    held.epoch_end()
    assert held.held is None and held.window_s is not None


def test_with_steps_per_execution_the_call_before_the_last_holds() -> None:
    held, calls = _held(), []
    assert _epoch(held, 2, 6, per=2, calls=calls) == [None, (2, 4), (2, 4)]
    assert calls == [(4, True)]


@pytest.mark.parametrize(("on", "of"), [(False, 4), (True, None)])
def test_nothing_is_held_when_off_or_when_the_epoch_has_no_known_steps(on: bool, of: int | None) -> None:
    held, calls = _held(), []
    held.on = on
    assert set(_epoch(held, 0, of, calls=calls)) == {None}
    assert calls == []


def test_a_short_window_stops_the_holding_and_a_long_one_brings_it_back(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(capture_module.time, "monotonic", lambda: clock[0])
    held, calls = _held(), []
    _epoch(held, 0, 3, calls=calls)  # the first epoch holds: no window measured yet
    clock[0] += HOLD_FROM_S / 2
    held.epoch_end()
    assert _epoch(held, 1, 3, calls=calls) == [None, None, None]  # validation was quick: waited for, nothing held
    clock[0] += HOLD_FROM_S * 3
    held.epoch_end()
    assert _epoch(held, 2, 3, calls=calls)[1] == (2, 2)
    assert [s for s, _ in calls] == [2, 2]


def test_an_answer_commits_the_held_copy_once_and_nothing_without_one() -> None:
    held, committed = _held(), []

    def save_step(epoch, step, logs, capture, reason):
        committed.append((epoch, step, logs, capture(), reason))

    def due(epoch, step, save) -> bool:
        save("SIGTERM")
        return True

    assert held.answer(due, save_step) is False and committed == []  # nothing held: due is not even asked
    _epoch(held, 1, 4, calls=[])
    assert held.answer(lambda e, s, save: False, save_step) is False and held.held == (1, 3)  # no request yet
    assert held.answer(due, save_step) is True
    assert committed == [(1, 3, {"loss": 3}, 3, "SIGTERM")]
    assert held.held is None


def test_the_window_runs_from_the_last_step_to_the_epoch_end() -> None:
    held = _held()
    _epoch(held, 0, 2, calls=[])
    time.sleep(0.05)
    held.epoch_end()
    assert 0.05 <= held.window_s < 5
    held.drop()
    assert held.held is None


def test_an_epoch_that_does_not_validate_holds_nothing() -> None:
    """No validation data (validates None), or an epoch validation_freq skips: the epoch's end follows its last
    step at once, so no copy is paid for."""
    calls = []
    assert set(_epoch(_held(None), 0, 4, calls=calls)) == {None}
    every_other = _held(lambda epoch: (epoch + 1) % 2 == 0)
    assert set(_epoch(every_other, 0, 4, calls=calls)) == {None}
    assert calls == []
    every_other.epoch_end()
    assert _epoch(every_other, 1, 4, calls=calls)[2] == (1, 3)
