"""CANDLE compatibility without Keras: its sidecar and links, the flat layout, param(), develop defaults."""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path

import pytest

from candle_ckpt import ModelType, ParamRequired, ParamType, param
from candle_ckpt.config.candle_params import develop_params
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.candle_sidecar import CandleSidecar, candle_crc, from_candle
from candle_ckpt.core.errors import LayoutMismatch, SidecarError
from candle_ckpt.core.layout import Layout, resolve_link_target
from candle_ckpt.core.log import get_logger
from candle_ckpt.core.retention import KeepAll, retention_policy
from candle_ckpt.storage.store import CheckpointStore


def candle_body(epoch: int, checksum: str = "__DISABLED__", **extra) -> dict:
    body = {
        "epoch": epoch,
        "save_best_metric": "val_loss",
        "best_metric_last": float("inf"),
        "model_file": "model.h5",
        "checksum": checksum,
        "timestamp": "2023-05-01 12:00:00",
        "time_elapsed": "__FIRST__",
        "metadata": None,
    }
    body.update(extra)
    return body


def write_candle(ckpts: Path, epoch: int, data: bytes = b"weights", checksum: bool = True, link: str = "abs") -> dict:
    """One checkpoint as CANDLE lays it out (json.dump + newline; link removed then re-made)."""
    this = ckpts / "epochs" / f"{epoch:03d}"
    this.mkdir(parents=True)
    (this / "model.h5").write_bytes(data)
    body = candle_body(epoch, str(zlib.crc32(data)) if checksum else "__DISABLED__")
    (this / "ckpt-info.json").write_text(json.dumps(body) + "\n")
    last = ckpts / "last"
    if os.path.lexists(last):
        os.remove(last)
    os.symlink(this.resolve() if link == "abs" else os.path.relpath(this, ckpts), last)
    return body


def test_flat_layout_has_no_ckpts_level(tmp_path: Path) -> None:
    """The flat layout keeps epochs/, best, last, work and lock in the directory itself; ckpt.log is there in both."""
    flat, nested = Layout.at(tmp_path, flat=True), Layout.at(tmp_path)
    assert flat.epochs == str(tmp_path / "epochs") and flat.lock == str(tmp_path / "lock")
    assert nested.epochs == str(tmp_path / "ckpts" / "epochs")
    assert flat.log == nested.log == str(tmp_path / "ckpt.log")
    assert flat.other == nested and nested.other == flat


@pytest.mark.parametrize(
    ("target", "epoch"),
    [("epochs/002", 2), ("./epochs/002", 2), ("/job/ckpts/epochs/007", 7), ("/real/ckpts/epochs/010", 10)],
)
def test_link_targets_inside_are_followed(target: str, epoch: int) -> None:
    """Relative, normalised-relative and absolute links into <ckpts>/epochs/NNN (as given or real path) resolve."""
    assert resolve_link_target(target, ("/job/ckpts", "/real/ckpts")) == (epoch, "")


def test_link_target_outside_is_refused_saying_so() -> None:
    """An absolute (or ..) link to another directory's epochs is refused, and the reason says it is outside."""
    for target in ("/other/ckpts/epochs/002", "../../other/ckpts/epochs/002"):
        epoch, why = resolve_link_target(target, ("/job/ckpts",))
        assert epoch is None
        assert why == (
            f"it points to {target!r}, which is outside /job/ckpts; a link is followed only to /job/ckpts/epochs/NNN"
        )
    epoch, why = resolve_link_target("/job/ckpts/work", ("/job/ckpts",))
    assert epoch is None and "inside /job/ckpts but not to an epochs/NNN checkpoint" in why


def test_candle_checksum_forms() -> None:
    """CANDLE's decimal CRC becomes 8 hex digits, __DISABLED__ means none, anything else is refused."""
    assert candle_crc("3735928559", "x") == "deadbeef"
    assert candle_crc(3735928559, "x") == "deadbeef"
    assert candle_crc("__DISABLED__", "x") is None
    for bad in ("0xdeadbeef", "-1", str(1 << 32), True, 1.5):
        with pytest.raises(SidecarError, match="checksum must be a decimal CRC32"):
            candle_crc(bad, "x")


def test_candle_sidecar_parsed_and_returned_unchanged() -> None:
    """A CANDLE ckpt-info.json (Infinity, __FIRST__, no schema_version) parses; to_dict() is CANDLE's object."""
    body = candle_body(3, str(zlib.crc32(b"abc")), best_metric_last=0.25)
    side = from_candle(json.dumps(body).encode(), source="s", model_size=3, best_epoch=2)
    assert isinstance(side, CandleSidecar) and side.to_dict() == body
    assert (side.epoch, side.generation, side.best_epoch, side.best_metric_last) == (3, 0, 2, 0.25)
    assert side.files["model.h5"].size == 3 and side.checksum == f"{zlib.crc32(b'abc'):08x}"
    inf = from_candle(json.dumps(candle_body(1)).encode(), source="s", model_size=1, best_epoch=1)
    assert inf.best_metric_last == float("inf") and inf.best_epoch is None
    with pytest.raises(SidecarError, match="model_file '../x' is not a plain file name"):
        from_candle(json.dumps(candle_body(1, model_file="../x")).encode(), source="s", model_size=1)


def test_store_adopts_candle_directory_and_checks_decimal_crc(tmp_path: Path) -> None:
    """The store finds CANDLE's last (an absolute link), verifies its decimal CRC, and rejects a damaged file."""
    ckpts = tmp_path / "save" / "ckpts"
    write_candle(ckpts, 1, b"one")
    write_candle(ckpts, 2, b"two")
    store = CheckpointStore(tmp_path / "save")
    assert store.link_epoch("last") == 2
    epoch, side, _ = store.find_valid()
    assert epoch == 2 and isinstance(side, CandleSidecar)
    (ckpts / "epochs" / "002" / "model.h5").write_bytes(b"tw0")
    problems = []
    epoch, _, _ = store.find_valid(on_problem=lambda e, why: problems.append((e, why)))
    assert epoch == 1 and problems[0][0] == 2 and "CRC32 is" in problems[0][1]


def test_flat_store_reads_develop_directory_with_relative_links(tmp_path: Path) -> None:
    """A develop-generation directory (epochs/ directly inside, relative link, checksum disabled) is found flat."""
    root = tmp_path / "out" / "ckpts"
    write_candle(root, 4, checksum=False, link="rel")
    store = CheckpointStore(root, flat=True)
    assert store.link_epoch("last") == 4 and store.find_valid()[0] == 4


def test_layouts_never_mixed(tmp_path: Path) -> None:
    """A flat writer refuses a directory holding nested checkpoints, and the other way round, naming both."""
    write_candle(tmp_path / "a" / "ckpts", 1)
    with pytest.raises(LayoutMismatch, match=r"holds checkpoints in the nested layout .* uses the flat layout"):
        CheckpointStore(tmp_path / "a", flat=True).open_for_write()
    write_candle(tmp_path / "b", 1)
    with pytest.raises(LayoutMismatch, match=r"holds checkpoints in the flat layout .* set ckpt_layout='flat'"):
        CheckpointStore(tmp_path / "b").open_for_write()
    assert not (tmp_path / "a" / "lock").exists() and not (tmp_path / "b" / "ckpts").exists()


def test_param_converts_and_checks_like_candle() -> None:
    """param() converts strings, applies defaults for missing or 'None', enforces ParamRequired and allowed."""
    p = {"a": "3", "b": "yes", "c": "0.5", "d": "None", "e": "-1"}
    assert param(p, "a", 0, ParamType.INTEGER_GZ) == 3
    assert param(p, "b", False, ParamType.BOOLEAN) is True
    assert param(p, "c", 0.0, ParamType.FLOAT_NN) == 0.5
    assert param(p, "d", "linear", ParamType.STRING, allowed=["linear", "all"]) == "linear"
    assert param(p, "missing", None, ParamType.FLOAT) is None
    with pytest.raises(ValueError, match="parameter 'epochs' is required"):
        param(p, "epochs", ParamRequired(), ParamType.INTEGER_NN)
    with pytest.raises(TypeError, match="parameter 'e' is '-1' but must be INTEGER_NN"):
        param(p, "e", 0, ParamType.INTEGER_NN)
    with pytest.raises(ValueError, match=r"parameter 'a' is '3'; allowed values: \['1'\]"):
        param(p, "a", "x", ParamType.STRING, allowed=["1"])
    with pytest.raises(TypeError, match="gParameters must be the parameter dict"):
        param(["a"], "a", 0)
    assert [m.name for m in ModelType] == ["KERAS", "PYTORCH"]
    assert [t.name for t in ParamType] == [
        "STRING",
        "BOOLEAN",
        "INTEGER",
        "INTEGER_NN",
        "INTEGER_GZ",
        "FLOAT",
        "FLOAT_NN",
    ]


def test_develop_params_defaults() -> None:
    """candle_lib develop: ckpt_directory None -> <output_dir>/ckpts, relative -> under output_dir, flat layout."""
    cfg = CkptConfig.from_params(develop_params({"output_dir": "/o", "ckpt_directory": "None"}))
    assert (cfg.directory, cfg.layout) == ("/o/ckpts", "flat")
    assert develop_params({"output_dir": "/o", "ckpt_directory": "c"})["ckpt_directory"] == "/o/c"
    assert develop_params({})["ckpt_directory"] == os.path.join(".", "ckpts")
    assert develop_params({"ckpt_layout": "nested"})["ckpt_layout"] == "nested"
    with pytest.raises(TypeError, match="output_dir must be a path"):
        develop_params({"output_dir": 3})


def test_none_strings_take_defaults_and_keep_all() -> None:
    """'None' strings from config files mean the default for every key; keep_mode all keeps everything."""
    cfg = CkptConfig.from_params({k: "None" for k in ("ckpt_directory", "ckpt_keep_mode", "ckpt_save_best_metric")})
    assert (cfg.directory, cfg.keep_mode, cfg.save_best_metric) == ("./save", "linear", "val_loss")
    policy = retention_policy("all", 1)
    assert isinstance(policy, KeepAll) and policy.select([1, 2, 3]) == {1, 2, 3}
    assert CkptConfig.from_params({"ckpt_best_metric_last": "Infinity"}).best_metric_last == float("inf")


def test_quiet_logger_drops_info_keeps_warnings() -> None:
    """verbose=False gives a logger whose INFO lines never reach the console handlers, but whose warnings do."""
    quiet = get_logger("DEFAULT", verbose=False)
    assert quiet.name == "candle_ckpt.quiet"
    assert not quiet.isEnabledFor(logging.INFO) and quiet.isEnabledFor(logging.WARNING)
    assert get_logger("DEFAULT", verbose=True).isEnabledFor(logging.INFO)


def test_ckpt_defs_leave_the_layout_to_the_api() -> None:
    """ckpt_layout's definition defaults to None, so a parser built from ckpt_defs keeps each API's layout."""
    from candle_ckpt.config.cli_args import ckpt_defs

    defaults = {d["name"]: d["default"] for d in ckpt_defs()}
    assert defaults["ckpt_layout"] is None
    assert CkptConfig.from_params(defaults).layout == "nested"
    assert CkptConfig.from_params(develop_params(defaults | {"ckpt_directory": None})).layout == "flat"


def test_candle_work_leftover_is_removed_and_its_checkpoints_kept(tmp_path: Path) -> None:
    """A work/ that CANDLE left by dying mid-save is debris to the next writer; CANDLE's epochs stay as they were."""
    ckpts = tmp_path / "save" / "ckpts"
    body = write_candle(ckpts, 1)
    (ckpts / "work").mkdir()
    (ckpts / "work" / "model.h5").write_bytes(b"half")
    store = CheckpointStore(tmp_path / "save")
    store.open_for_write()
    try:
        assert sorted(os.listdir(ckpts)) == ["epochs", "last", "lock"]
        assert json.loads((ckpts / "epochs" / "001" / "ckpt-info.json").read_text()) == body
        assert store.read_sidecar(1).to_dict() == body
    finally:
        store.close()
