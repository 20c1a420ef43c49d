"""The save rule's one owner, SaveDecisionPolicy: the rule's order, forced saves, and a best still in flight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.engine.decision import DecisionContext, SaveDecisionPolicy, checkpointing_off


def policy(tmp_path: Path, **params: Any) -> SaveDecisionPolicy:
    """A policy for 10 epochs, interval 2, best on ``loss``, plus ``params``."""
    base = {"ckpt_directory": str(tmp_path), "epochs": 10, "ckpt_save_interval": 2, "ckpt_save_best_metric": "loss"}
    return SaveDecisionPolicy(CkptConfig.from_params(base | params))


def reasons(rule: SaveDecisionPolicy, losses: list[float]) -> list[str | None]:
    """The reason of every epoch end 1, 2, ... with these losses, each save accepted and committed."""
    found = []
    for epoch, loss in enumerate(losses, start=1):
        decision = rule.should_save(epoch, {"loss": loss})
        found.append(decision.reason)
        if decision.reason is not None:
            rule.submitted(decision.best)
            rule.committed(decision.best)
    return found


def test_rule_order_best_then_final_then_interval(tmp_path: Path) -> None:
    """An improvement saves as best before final and interval; the last epoch is final; the interval saves."""
    losses = [5, 6, 7, 4, 8, 9, 9, 9, 9, 9]
    assert reasons(policy(tmp_path), losses) == [
        "best", "interval", None, "best", None, "interval", None, "interval", None, "final",
    ]  # fmt: skip


def test_skip_epochs_and_no_save_best(tmp_path: Path) -> None:
    """Epochs below ckpt_skip_epochs never save; without ckpt_save_best an improvement is no reason."""
    assert reasons(policy(tmp_path, ckpt_skip_epochs=3), [5, 4, 3, 2]) == [None, None, "best", "best"]
    assert reasons(policy(tmp_path, ckpt_save_best=False), [5, 4, 3, 2]) == [None, "interval", None, "interval"]


def test_checkpointing_off_saves_nothing_not_even_a_forced_save(tmp_path: Path) -> None:
    """ckpt_save_interval=0: no best, no final and no forced save; checkpointing_off is the one check."""
    rule = policy(tmp_path, ckpt_save_interval=0)
    assert rule.off and checkpointing_off(rule.cfg) and not policy(tmp_path).off
    assert reasons(rule, [3, 2, 1] + [0.5] * 7) == [None] * 10
    assert rule.should_save(1, {}, DecisionContext(forced="SIGTERM")).reason is None


def test_forced_save_keeps_its_reason_and_tracks_the_best(tmp_path: Path) -> None:
    """A forced save carries its reason; with the metric logged it still tracks the best, without it nothing."""
    rule = policy(tmp_path)
    decision = rule.should_save(3, {"loss": 1.0}, DecisionContext(forced="SIGTERM"))
    assert decision.reason == "SIGTERM" and decision.best.epoch == 3
    decision = rule.should_save(0, {}, DecisionContext(forced="init"))
    assert decision.reason == "init" and decision.best == rule.best


def test_missing_metric_is_an_error_at_every_epoch_end(tmp_path: Path) -> None:
    """A metric absent from the logs raises at epoch 1, even a skipped one, naming the metric and the fix."""
    with pytest.raises(ValueError, match=r"ckpt_save_best_metric 'loss' is not in the training logs of epoch 1"):
        policy(tmp_path, ckpt_skip_epochs=5).should_save(1, {"acc": 0.5})


def test_a_best_still_in_flight_asks_again_and_a_failure_sets_best_back(tmp_path: Path) -> None:
    """Epoch 2 beats the durable best but not the one being written: ask again after the write; if that write
    fails, best tracking goes back to the durable best and epoch 2 is the new best."""
    rule = policy(tmp_path, ckpt_save_interval=5)
    first = rule.should_save(1, {"loss": 5.0})
    rule.submitted(first.best)
    rule.committed(first.best)
    pending = rule.should_save(2, {"loss": 3.0})
    rule.submitted(pending.best)  # epoch 2's best is being written
    busy = rule.should_save(3, {"loss": 4.0}, DecisionContext(saving_in_progress=True))
    assert busy.reason is None and busy.ask_again
    assert not rule.should_save(3, {"loss": 4.0}).ask_again  # no write in flight: nothing to wait for
    rule.failed(2)
    assert rule.best == first.best
    assert rule.should_save(3, {"loss": 4.0}).reason == "best"
