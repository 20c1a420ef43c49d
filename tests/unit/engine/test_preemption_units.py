"""Issue 16's pure parts: the preemption parameters, the watcher's deadline, step checkpoints in the store (no keras).

The signal handlers are tests/unit/engine/test_signals.py's.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.config.preemption import parse_deadline, parse_signals, resolve_deadline, signal_numbers
from candle_ckpt.core.errors import CorruptCheckpoint
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.preempt import PreemptionWatcher
from candle_ckpt.engine.resume import checkpoint_dir, select_checkpoint
from candle_ckpt.storage.store import CheckpointStore, FileSpec

# -- parameters -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("SIGTERM", ("SIGTERM",)),
        ("term, usr1", ("SIGTERM", "SIGUSR1")),
        (f"{int(signal.SIGUSR1)},SIGTERM,TERM", ("SIGUSR1", "SIGTERM")),
        (["SIGUSR2", int(signal.SIGINT)], ("SIGUSR2", "SIGINT")),
        ("none", ()),
        ("", ()),
    ],
)
def test_signals_are_read_as_names_numbers_and_lists(value, names):
    """ckpt_preempt_signals takes names with or without SIG, numbers, lists and 'none', kept as canonical names."""
    assert parse_signals(value) == names
    assert signal_numbers(names) == tuple(int(getattr(signal.Signals, n)) for n in names)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("SIGKILL", ValueError, "cannot be caught"),
        ("SIGFOO", ValueError, "not a signal name"),
        ("999", ValueError, "not a signal number"),
        (True, TypeError, "ckpt_preempt_signals"),
        (1.5, TypeError, "ckpt_preempt_signals"),
    ],
)
def test_bad_signals_name_the_parameter(value, error, match):
    """A signal that does not exist or cannot be caught is refused with the key and what is allowed."""
    with pytest.raises(error, match=match):
        CkptConfig.from_params({"ckpt_preempt_signals": value})


def test_preemption_defaults_and_none():
    """By default SIGTERM is caught and the deadline is auto; the word none turns each off (not 'the default')."""
    cfg = CkptConfig.from_params({})
    assert (cfg.preempt_signals, cfg.deadline, cfg.deadline_margin) == (("SIGTERM",), "auto", 60)
    assert (cfg.save_steps, cfg.mtbf) == ("auto", "auto")
    assert cfg.preempt_exit_code == "signal"
    assert CkptConfig.from_params({"ckpt_preempt_exit_code": " Return"}).preempt_exit_code == "return"
    off = CkptConfig.from_params({"ckpt_preempt_signals": "None", "ckpt_deadline": "none"})
    assert (off.preempt_signals, off.deadline) == ((), "off")
    assert CkptConfig.from_params({"ckpt_preempt_signals": None}).preempt_signals == ("SIGTERM",)
    both = CkptConfig.from_params({"ckpt_preempt_signals": "TERM,USR1", "ckpt_preempt_exit_code": "42"})
    assert both.replace() == both  # coercion is idempotent


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"ckpt_preempt_exit_code": 256}, "ckpt_preempt_exit_code must be <= 255"),
        ({"ckpt_preempt_exit_code": -1}, "ckpt_preempt_exit_code must be >= 0"),
        ({"ckpt_save_steps": -2}, r"ckpt_save_steps must be auto or an integer >= 0 \(0 disables\); got -2"),
        ({"ckpt_save_steps": "often"}, r"ckpt_save_steps must be auto or an integer >= 0 \(0 disables\); got 'often'"),
        ({"ckpt_mtbf": 0}, r"ckpt_mtbf must be auto or seconds > 0; got 0"),
        ({"ckpt_mtbf": "never"}, r"ckpt_mtbf must be auto or seconds > 0; got 'never'"),
        ({"ckpt_deadline_margin": "soon"}, "ckpt_deadline_margin must be a number"),
        ({"ckpt_deadline": "tomorrow"}, "ckpt_deadline must be auto, none"),
        ({"ckpt_deadline": "+ten"}, "ckpt_deadline: '\\+ten' must be \\+ followed by"),
    ],
)
def test_bad_preemption_values_name_the_parameter(params, match):
    """Out-of-range or unreadable values raise with the key and what is allowed."""
    with pytest.raises((ValueError, TypeError), match=match):
        CkptConfig.from_params(params)


def test_deadline_forms_resolve_to_epoch_seconds():
    """auto reads SLURM_JOB_END_TIME (else off), +S counts from the start, epoch seconds and ISO times are absolute."""
    assert resolve_deadline(parse_deadline("auto"), 100.0, {"SLURM_JOB_END_TIME": "5000"}) == (
        5000.0,
        "SLURM_JOB_END_TIME",
    )
    assert resolve_deadline("auto", 100.0, {})[0] is None
    assert resolve_deadline(parse_deadline("+30"), 100.0, {})[0] == 130.0
    assert resolve_deadline(parse_deadline(1767225600), 0.0, {})[0] == 1767225600.0
    iso = parse_deadline("2026-01-01T00:00:00+00:00")
    assert resolve_deadline(iso, 0.0, {})[0] == 1767225600.0
    assert resolve_deadline(parse_deadline("off"), 0.0, {"SLURM_JOB_END_TIME": "5"})[0] is None


@pytest.mark.parametrize("word", ["none", "OFF", "false", "No", " ", ""])
def test_every_switch_off_parameter_takes_the_same_words_for_off(word):
    """A word that turns ckpt_preempt_signals off turns ckpt_deadline and ckpt_hang_timeout off too (one
    vocabulary, OFF_WORDS), parsed alone and through a params dict as a user's flags arrive."""
    assert parse_signals(word) == ()
    assert parse_deadline(word) == "off"
    assert resolve_deadline(parse_deadline(word), 0.0, {"SLURM_JOB_END_TIME": "5"}) == (None, "off")
    keys = ("ckpt_preempt_signals", "ckpt_deadline", "ckpt_hang_timeout")
    config = CkptConfig.from_params(dict.fromkeys(keys, word))
    assert (config.preempt_signals, config.deadline, config.hang_timeout) == ((), "off", "none")


# -- the watcher ----------------------------------------------------------------------------


def test_watcher_deadline_is_due_within_the_needed_time_plus_margin():
    """The deadline is due once the time left is below the caller's step and save time plus the margin."""
    watcher = PreemptionWatcher((), deadline=time.time() + 10, margin=2)
    assert watcher.active and watcher.due(need_s=1) is None
    got = watcher.due(need_s=9)
    assert got is not None and got.reason == "deadline" and got.signum is None
    assert watcher.trigger("peer") is got, "the first request is kept"


# -- step checkpoints in the store ----------------------------------------------------------


def _files(data: bytes) -> list[FileSpec]:
    return [FileSpec("model.bin", lambda f: f.write(data))]


_TEMPLATE = Sidecar(epoch=0, generation=0, model_file="model.bin", files={})


def _store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "job")
    store.open_for_write()
    return store


def _step(store: CheckpointStore, epoch: int, step: int, data: bytes = b"step") -> Sidecar:
    return store.steps.commit(_files(data), replace(_TEMPLATE, epoch=epoch, step=step))


def test_step_checkpoints_live_beside_epochs_and_only_the_newest_is_kept(tmp_path):
    """A step commit writes steps/GGG (its generation), never epochs/ or the links; the next one replaces it."""
    store = _store(tmp_path)
    first = store.commit(1, _files(b"epoch"), replace(_TEMPLATE, epoch=1))
    a = _step(store, 1, 2)
    assert a.generation > first.generation and (a.epoch, a.step) == (1, 2)
    assert store.steps.generations() == [a.generation] and store.epochs() == [1]
    assert store.link_epoch("last") == 1
    b = _step(store, 1, 3)
    assert store.steps.generations() == [b.generation]
    assert checkpoint_dir(store.layout, b) == str(tmp_path / "job" / "ckpts" / "steps" / f"{b.generation:03d}")
    assert store.steps.verify(b.generation)[0] == b
    store.close()
    again = _store(tmp_path)
    assert again.commit(2, _files(b"e2"), replace(_TEMPLATE, epoch=2)).generation > b.generation
    again.close()


def test_an_epoch_commit_supersedes_the_step_checkpoints_of_earlier_epochs(tmp_path):
    """supersede(E) removes step checkpoints of epochs before E (and unreadable ones), not later ones."""
    store = _store(tmp_path)
    side = _step(store, 1, 2)
    assert store.steps.supersede(1) == []
    assert store.steps.supersede(2) == [side.generation]
    assert store.steps.generations() == []
    assert not [p for p in os.listdir(store.layout.ckpts) if p.startswith("trash")]
    store.close()


def test_restart_prefers_a_valid_step_checkpoint_newer_than_last(tmp_path):
    """select_checkpoint(steps=True) picks the newest verified step checkpoint after last, and falls back to
    last when its CRC fails; without steps=True (or with an exact epoch) step checkpoints are ignored."""
    store = _store(tmp_path)
    store.commit(1, _files(b"epoch"), replace(_TEMPLATE, epoch=1))
    side = _step(store, 1, 3)
    store.close()
    cfg = CkptConfig(directory=str(tmp_path / "job"))
    log = OpsLog(None, None)
    chosen = select_checkpoint(cfg, log, reads=["model.bin"], steps=True)
    assert (chosen.epoch, chosen.sidecar.step, bytes(chosen.contents["model.bin"])) == (1, 3, b"step")
    assert select_checkpoint(cfg, log, reads=[]).sidecar.step is None
    assert select_checkpoint(cfg, log, reads=[], epoch=1, steps=True).sidecar.step is None
    path = Path(store.layout.step_dir(side.generation)) / "model.bin"
    path.write_bytes(b"stop")  # same size, other bytes
    with pytest.raises(CorruptCheckpoint):
        store.steps.verify(side.generation)
    assert select_checkpoint(cfg, log, reads=[], steps=True).sidecar.step is None


def test_a_step_checkpoint_before_any_epoch_is_found(tmp_path):
    """Preempted in the first epoch: no epoch checkpoint and no last, and restart finds the step checkpoint."""
    store = _store(tmp_path)
    _step(store, 0, 2)
    store.close()
    chosen = select_checkpoint(CkptConfig(directory=str(tmp_path / "job")), OpsLog(None, None), reads=[], steps=True)
    assert (chosen.epoch, chosen.sidecar.step) == (0, 2)


def test_a_step_sidecar_must_match_its_directory(tmp_path):
    """A sidecar copied into another steps/GGG, or an epoch's sidecar there, is refused."""
    store = _store(tmp_path)
    side = _step(store, 1, 2)
    other = Path(store.layout.step_dir(side.generation + 5))
    other.mkdir()
    (other / "ckpt-info.json").write_bytes(side.to_json())
    with pytest.raises(CorruptCheckpoint, match="not the step checkpoint of generation"):
        store.steps.read_sidecar(side.generation + 5)
    store.close()
