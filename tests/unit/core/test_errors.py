"""One exception hierarchy: users catch CheckpointError for every checkpoint problem, and import each from the root."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import candle_ckpt
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import errors
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.resume import select_checkpoint
from candle_ckpt.storage.store import CheckpointStore, FileSpec

# Not about a checkpoint: a missing optional package for the CLI's plots (an ImportError, with the pip command).
NOT_CHECKPOINT_ERRORS = {"MissingDependency"}
# Raised inside the store and reported as CorruptCheckpoint: a user never sees it.
INTERNAL = {"SidecarError"}
# A value that does not fit: these stay ValueError, which callers caught before the hierarchy existed.
VALUE_ERRORS = {"ModelMismatch", "LayoutMismatch", "SidecarError"}


def _classes() -> dict[str, type]:
    return {n: c for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, Exception)}


def test_every_checkpoint_error_is_a_checkpoint_error_and_users_import_it_from_the_root() -> None:
    """Every exception of core.errors but MissingDependency is a CheckpointError; the ones users catch are in
    candle_ckpt.__all__; those about a value that does not fit are ValueErrors too."""
    classes = _classes()
    assert {n for n, c in classes.items() if not issubclass(c, errors.CheckpointError)} == NOT_CHECKPOINT_ERRORS
    assert set(classes) - NOT_CHECKPOINT_ERRORS - INTERNAL <= set(candle_ckpt.__all__)
    assert {n for n, c in classes.items() if issubclass(c, ValueError)} == VALUE_ERRORS
    for name in set(classes) - NOT_CHECKPOINT_ERRORS - INTERNAL:
        assert getattr(candle_ckpt, name) is classes[name]


def test_a_step_checkpoint_with_a_malformed_sidecar_is_skipped_and_superseded(tmp_path: Path) -> None:
    """A step checkpoint whose ckpt-info.json is not JSON is reported and skipped by restart (it used to escape as
    a ValueError), and the next epoch commit removes it."""
    store = CheckpointStore(tmp_path)
    store.open_for_write()
    files = [FileSpec("w.bin", lambda f: f.write(b"w"))]
    store.commit(1, files, Sidecar(1, 0, "w.bin", {}))
    step = store.steps.commit(files, replace(Sidecar(1, 0, "w.bin", {}), step=3))
    sidecar = Path(store.layout.step_dir(step.generation)) / "ckpt-info.json"
    sidecar.write_bytes(b"{not json")
    seen: list[str] = []
    log = OpsLog(None, None)
    log.warning = seen.append  # type: ignore[method-assign]
    chosen = select_checkpoint(CkptConfig(directory=str(tmp_path)), log, reads=[], steps=True)
    assert chosen.sidecar.step is None and chosen.epoch == 1
    assert any("skipping step checkpoint" in m and "not valid JSON" in m for m in seen), seen
    assert store.steps.supersede(2) == [step.generation]
    store.close()
