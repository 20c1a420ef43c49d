"""The keras-free core: CRC-tracking files, the sidecar, path parsing, the store and durable links."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from locations import REPO

from candle_ckpt.core import fs as durable
from candle_ckpt.core import layout
from candle_ckpt.core.checksum import CrcFile
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint, SidecarError
from candle_ckpt.core.fs import LocalFS, read_link
from candle_ckpt.core.retention import KeepLatest
from candle_ckpt.core.sidecar import MAX_SIDECAR_BYTES, FileEntry, Sidecar
from candle_ckpt.storage.store import CheckpointStore, FileSpec


def _crc(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}"


# -- the core imports no keras ----------------------------------------------------------------------
def test_core_modules_import_neither_keras_nor_tensorflow():
    """Importing the package and every core module in a fresh interpreter loads neither keras nor tensorflow."""
    code = (
        "import sys, candle_ckpt\n"
        "import candle_ckpt.core.layout, candle_ckpt.core.fs, candle_ckpt.core.checksum, candle_ckpt.core.sidecar\n"
        "import candle_ckpt.core.policy, candle_ckpt.config.params, candle_ckpt.storage.store\n"
        "import candle_ckpt.engine.writer\n"
        "import candle_ckpt.engine.engine, candle_ckpt.core.log\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'tensorflow'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


# -- CrcFile ----------------------------------------------------------------------------------------
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 400), st.binary(min_size=0, max_size=80)),  # may leave holes
        st.tuples(st.just("append"), st.integers(-20, 20), st.binary(min_size=1, max_size=40)),  # SEEK_END
        st.tuples(st.just("truncate"), st.integers(0, 400)),
        st.tuples(
            st.just("check"),
        ),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS)
def test_crcfile_knows_the_crc_of_what_it_wrote(ops):
    """After any mix of writes, overwrites, holes and truncates, CrcFile.crc32() equals zlib.crc32 of the file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "f.bin")
        f = CrcFile(path)
        for op in ops:
            if op[0] == "write":
                f.seek(op[1])
                assert f.write(op[2]) == len(op[2])
            elif op[0] == "append":
                f.seek(max(op[1], -f.size), os.SEEK_END)
                f.write(op[2])
            elif op[0] == "truncate":
                f.truncate(op[1])
            else:
                assert f.crc32() == zlib.crc32(Path(path).read_bytes())
        value, size = f.crc32(), f.size
        f.close()
        data = Path(path).read_bytes()
        assert size == len(data)
        assert value == zlib.crc32(data)


@settings(max_examples=100, deadline=None)
@given(ops=_OPS, start=st.integers(0, 450), length=st.integers(0, 450))
def test_crcfile_knows_the_crc_of_any_range(ops, start, length):
    """CrcFile.crc32(start, end) equals zlib.crc32 of that slice of the file, after any mix of writes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "f.bin")
        f = CrcFile(path)
        for op in ops:
            if op[0] == "write":
                f.seek(op[1])
                f.write(op[2])
            elif op[0] == "append":
                f.seek(max(op[1], -f.size), os.SEEK_END)
                f.write(op[2])
            elif op[0] == "truncate":
                f.truncate(op[1])
        value = f.crc32(start, start + length)
        f.close()
        assert value == zlib.crc32(Path(path).read_bytes()[start : start + length])


def test_crcfile_reads_back_what_it_wrote(tmp_path):
    """CrcFile is readable and seekable like a file (h5py reads back what it wrote)."""
    with CrcFile(tmp_path / "f") as f:
        f.write(b"hello world")
        f.seek(6)
        assert f.read(5) == b"world"
        f.seek(0)
        buf = bytearray(5)
        assert f.readinto(buf) == 5 and bytes(buf) == b"hello"
        with pytest.raises(ValueError, match="whence"):
            f.seek(0, 7)
    assert f.closed


# -- the sidecar ------------------------------------------------------------------------------------
def _sidecar(**changes) -> Sidecar:
    base = Sidecar(
        epoch=3,
        generation=2,
        model_file="model.weights.h5",
        files={"model.weights.h5": FileEntry(1234, "0badcafe"), "model.keras": FileEntry(99, None)},
        save_best_metric="val_loss",
        best_metric_last=0.25,
        best_epoch=3,
        save_best_mode="min",
        timestamp="2024-01-01T00:00:00+0000",
        time_elapsed=12.5,
        metadata="run-1",
        logs={"loss": 0.5, "val_loss": 0.25},
        reason="best",
        keras_version="3.15.1",
        backend="tensorflow",
        save_duration_s=0.01,
        save_mb_per_s=12.3,
        extra={"note": "x"},
    )
    return replace(base, **changes)


def _signed(body: dict) -> bytes:
    """Serialise ``body`` with a valid sidecar_crc32 (CRC of the canonical sorted compact JSON)."""
    body = {k: v for k, v in body.items() if k != "sidecar_crc32"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**body, "sidecar_crc32": _crc(canonical)}).encode()


def test_sidecar_round_trips_through_json():
    """Sidecar.from_json(to_json()) gives back the same sidecar, with CANDLE's checksum key."""
    side = _sidecar()
    raw = side.to_json()
    assert Sidecar.from_json(raw) == side
    body = json.loads(raw)
    assert body["checksum"] == "0badcafe" == side.checksum
    assert body["files"]["model.keras"] == {"size": 99, "crc32": None}
    assert Sidecar.from_json(_signed(body)) == side  # the documented canonical form is what is signed


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", r"not valid JSON"),
        (b"\xff\xfe", r"not valid JSON"),
        (b"[1, 2, 3]", r"expected a JSON object, got list"),
        (b" " * (MAX_SIDECAR_BYTES + 1), r"1048577 bytes, larger than the 1048576 allowed"),
    ],
    ids=["not-json", "not-utf8", "list", "huge"],
)
def test_sidecar_rejects_what_is_not_a_sidecar(raw, message):
    """from_json rejects non-JSON, non-objects and anything over 1 MiB, naming the source."""
    with pytest.raises(SidecarError, match=r"^epochs/003/ckpt-info.json: " + message):
        Sidecar.from_json(raw, source="epochs/003/ckpt-info.json")


def _body(**changes) -> dict:
    body = json.loads(_sidecar().to_json())
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_body(schema_version=2), r"schema_version 2 is not supported"),
        (_body(schema_version=None), r"schema_version None is not supported"),
        (_body(model_file="../../x"), r"model_file '../../x' is not one of the checkpoint's files"),
        (_body(model_file="/etc/passwd"), r"model_file '/etc/passwd' is not one of the checkpoint's files"),
        (_body(files={"a/b": {"size": 1, "crc32": None}}), r"file name 'a/b' is not a plain file name"),
        (_body(files={"..": {"size": 1, "crc32": None}}), r"file name '..' is not a plain file name"),
        (_body(files={}), r"'files' must be a non-empty object"),
        (_body(files={"model.weights.h5": {"size": -1, "crc32": None}}), r"size must be >= 0"),
        (_body(files={"model.weights.h5": {"size": 1, "crc32": "xyz"}}), r"crc32 must be 8 hex digits"),
        (_body(epoch="3"), r"epoch must be int"),
        (_body(epoch=True), r"epoch must be int"),
        (_body(logs=[1]), r"'logs' must be an object"),
    ],
)
def test_sidecar_rejects_unsafe_or_malformed_fields(body, message):
    """from_json rejects a wrong schema_version, unsafe file names and malformed fields even with a valid own CRC."""
    with pytest.raises(SidecarError, match=message):
        Sidecar.from_json(_signed(body))


def test_sidecar_rejects_a_flipped_value():
    """A changed value in an otherwise valid sidecar fails the sidecar's own CRC."""
    raw = _sidecar().to_json()
    assert b'"epoch": 3' in raw
    with pytest.raises(SidecarError, match=r"its own CRC does not match"):
        Sidecar.from_json(raw.replace(b'"epoch": 3', b'"epoch": 4'))


# -- layout -----------------------------------------------------------------------------------------
def test_parse_epoch_accepts_only_digit_names():
    """parse_epoch reads NNN directory names and refuses anything else."""
    assert layout.parse_epoch("007") == 7
    assert layout.parse_epoch("1234") == 1234
    for name in ("abc", "7", "../x", "007/", ".007", "-01", "", "0x1"):
        assert layout.parse_epoch(name) is None, name


@pytest.mark.parametrize(
    "target", ["../x", "/abs", "/tmp/ckpts/epochs/007", "epochs/../../x", "epochs/abc", "epochs/007/../../x", "007"]
)
def test_parse_link_target_refuses_anything_but_epochs_nnn(target):
    """A best/last target other than the exact relative form epochs/NNN is refused."""
    assert layout.parse_link_target(target) is None


def test_parse_link_target_reads_the_relative_form():
    """epochs/NNN (with an optional trailing slash or newline) gives the epoch number."""
    assert layout.parse_link_target("epochs/012") == 12
    assert layout.parse_link_target("epochs/012/") == 12
    assert layout.parse_link_target("epochs/012\n") == 12
    assert layout.link_target(12) == "epochs/012"


def test_step_names_round_trip_and_nothing_else_parses_as_one():
    """steps/GGG is written and read back by Layout's two functions; an epoch's name or a path is not one."""
    assert layout.step_name(12) == "steps/012"
    assert layout.parse_step_name(layout.step_name(12)) == 12
    assert layout.parse_step_name(layout.step_name(1234)) == 1234
    for name in ("epochs/012", "steps/12", "steps/012/", "/x/steps/012", "steps/../012", "error: x"):
        assert layout.parse_step_name(name) is None, name


# -- the store, with a fake writer ------------------------------------------------------------------
def test_a_store_of_a_config_has_its_directory_layout_and_checksum(tmp_path):
    """CheckpointStore.of(cfg) is the store every job builds: ckpt_directory, ckpt_layout, ckpt_checksum."""
    from candle_ckpt.config.params import CkptConfig

    fs = LocalFS()
    cfg = CkptConfig.from_params({"ckpt_directory": str(tmp_path), "ckpt_layout": "flat", "ckpt_checksum": False})
    store = CheckpointStore.of(cfg, fs=fs)
    assert (store.layout, store.checksum, store.fs) == (layout.Layout.of(cfg), False, fs)
    assert store.layout.epochs == str(tmp_path / "epochs")
    nested = CheckpointStore.of(CkptConfig.from_params({"ckpt_directory": str(tmp_path)}))
    assert (nested.layout.epochs, nested.checksum) == (str(tmp_path / "ckpts" / "epochs"), True)


def _files(**named: bytes) -> list[FileSpec]:
    return [FileSpec(name, lambda f, data=data: f.write(data)) for name, data in named.items()]


_TEMPLATE = Sidecar(epoch=0, generation=0, model_file="model.bin", files={})


def _commit(s: CheckpointStore, epoch: int, data: bytes, **kw) -> Sidecar:
    return s.commit(epoch, _files(**{"model.bin": data, "aux.txt": b"aux-%d" % epoch}), _TEMPLATE, **kw)


def _open(tmp_path: Path) -> CheckpointStore:
    s = CheckpointStore(tmp_path / "save")
    s.open_for_write()
    return s


def test_commit_writes_an_epoch_directory_with_sizes_and_crcs(tmp_path):
    """commit() publishes epochs/NNN with every file, a sidecar of sizes and CRCs, and moves last."""
    s = _open(tmp_path)
    side = _commit(s, 1, b"weights-1")
    ckpts = tmp_path / "save" / "ckpts"
    assert sorted(p.name for p in (ckpts / "epochs" / "001").iterdir()) == ["aux.txt", "ckpt-info.json", "model.bin"]
    assert side.files == {"model.bin": FileEntry(9, _crc(b"weights-1")), "aux.txt": FileEntry(5, _crc(b"aux-1"))}
    assert Sidecar.from_json((ckpts / "epochs" / "001" / "ckpt-info.json").read_bytes()) == side
    assert os.readlink(ckpts / "last") == "epochs/001"
    assert not os.path.lexists(ckpts / "work")
    assert _commit(s, 2, b"weights-2").generation == side.generation + 1


def test_commit_refuses_unsafe_file_names_and_keeps_nothing_partial(tmp_path):
    """A file name with a slash is refused and neither work/ nor a partial epoch is left behind."""
    s = _open(tmp_path)
    with pytest.raises(ValueError, match=r"checkpoint file name '../evil' is not allowed"):
        s.commit(1, _files(**{"../evil": b"x"}), _TEMPLATE)
    assert s.epochs() == []
    assert not os.path.lexists(s.layout.work)


def test_commit_needs_open_for_write(tmp_path):
    """commit() before open_for_write() raises CheckpointError saying so."""
    with pytest.raises(CheckpointError, match=r"open_for_write\(\) must be called"):
        _commit(CheckpointStore(tmp_path / "save"), 1, b"x")


def test_verify_returns_the_bytes_and_catches_damage(tmp_path):
    """verify() returns the checked bytes and names the file whose size or CRC is wrong."""
    s = _open(tmp_path)
    _commit(s, 1, b"weights-1")
    side, contents = s.verify(1, reads=["model.bin"])
    assert contents == {"model.bin": b"weights-1"} and side.epoch == 1
    model = Path(s.layout.epoch_dir(1)) / "model.bin"
    model.write_bytes(b"weights-X")
    with pytest.raises(CorruptCheckpoint, match=r"model.bin: CRC32 is .* but the sidecar recorded"):
        s.verify(1)
    model.write_bytes(b"short")
    with pytest.raises(CorruptCheckpoint, match=r"model.bin: size is 5 bytes but the sidecar recorded 9"):
        s.verify(1)
    model.unlink()
    with pytest.raises(CorruptCheckpoint, match=r"model.bin: file is missing"):
        s.verify(1)


def test_find_valid_falls_back_by_generation_and_reports_why(tmp_path):
    """When last is damaged, find_valid() returns the newest valid checkpoint by commit order, reporting each reject."""
    s = _open(tmp_path)
    for epoch in (1, 2, 3):
        _commit(s, epoch, b"weights-%d" % epoch)
    (Path(s.layout.epoch_dir(3)) / "model.bin").write_bytes(b"weights-X")
    (Path(s.layout.epoch_dir(2)) / "ckpt-info.json").write_text("{broken")
    problems: list[tuple[int, str]] = []
    epoch, side, contents = s.find_valid(reads=["model.bin"], on_problem=lambda e, why: problems.append((e, why)))
    assert (epoch, contents) == (1, {"model.bin": b"weights-1"})
    assert [e for e, _ in problems] == [3]  # epoch 2's sidecar is unreadable: its generation is unknown, tried last
    assert "CRC32" in problems[0][1]
    (Path(s.layout.epoch_dir(1)) / "aux.txt").unlink()
    problems.clear()
    assert s.find_valid(on_problem=lambda e, why: problems.append((e, why))) is None
    assert [e for e, _ in problems] == [3, 1, 2]
    assert "aux.txt: file is missing" in problems[1][1] and "not valid JSON" in problems[2][1]


def test_find_valid_reads_no_listing_when_last_is_valid(tmp_path, monkeypatch):
    """A restart whose 'last' checkpoint verifies never lists or reads the other checkpoints (O(1) in their number)."""
    s = _open(tmp_path)
    for epoch in (1, 2, 3):
        _commit(s, epoch, b"weights-%d" % epoch)

    def refuse():
        raise AssertionError("epochs/ was listed")

    monkeypatch.setattr(s, "epochs", refuse)
    assert s.find_valid(reads=["model.bin"])[0] == 3
    os.unlink(s.layout.link("last"))
    os.symlink("epochs/007", s.layout.link("last"))  # 'last' to a checkpoint that is gone: only now list
    with pytest.raises(AssertionError, match="epochs/ was listed"):
        s.find_valid()


def test_a_save_cut_before_last_moved_resumes_the_previous_last(tmp_path):
    """Killed after epochs/NNN was renamed in but before 'last' moved: restart takes 'last'; the redo replaces NNN.

    The commit point is the move of 'last' (step 3 of the protocol), so the epoch whose save was cut is the one
    in flight and is redone; its complete but unpublished directory is replaced only once the new one is whole.
    """
    s = _open(tmp_path)
    for epoch in (1, 2, 3):
        _commit(s, epoch, b"weights-%d" % epoch)
    ckpts = tmp_path / "save" / "ckpts"
    os.unlink(ckpts / "last")
    os.symlink("epochs/002", ckpts / "last")  # the state a kill between the rename and the link move leaves
    assert s.find_valid(reads=["model.bin"])[0] == 2
    _commit(s, 3, b"weights-3-redone")
    assert os.readlink(ckpts / "last") == "epochs/003"
    assert (ckpts / "epochs" / "003" / "model.bin").read_bytes() == b"weights-3-redone"
    assert s.find_valid(reads=["model.bin"])[0] == 3


def test_find_valid_returns_none_when_nothing_is_valid(tmp_path):
    """find_valid() returns None when every checkpoint is damaged."""
    s = _open(tmp_path)
    _commit(s, 1, b"w")
    (Path(s.layout.epoch_dir(1)) / "ckpt-info.json").unlink()
    assert s.find_valid() is None


def test_prune_keeps_best_last_and_protected(tmp_path):
    """prune() deletes what the policy drops but never best, last or a protected epoch."""
    s = _open(tmp_path)
    for epoch in range(1, 7):
        _commit(s, epoch, b"w%d" % epoch, best_epoch=2)
    assert os.readlink(s.layout.link("best")) == "epochs/002"
    deleted = s.prune(KeepLatest(1).select, protected=[4])
    assert deleted == [1, 3, 5]
    assert s.epochs() == [2, 4, 6]
    assert s.prune(KeepLatest(1).select, protected=[4]) == []  # pruning twice = once
    assert not [n for n in os.listdir(s.layout.ckpts) if n.startswith("trash-")]


def test_recommit_of_an_existing_epoch_replaces_it(tmp_path):
    """Committing an epoch that exists (a rollback) replaces it with the new content and a newer generation."""
    s = _open(tmp_path)
    first = _commit(s, 1, b"old")
    second = _commit(s, 1, b"new-lineage")
    assert s.verify(1, reads=["model.bin"])[1] == {"model.bin": b"new-lineage"}
    assert second.generation > first.generation
    assert s.epochs() == [1]


def test_open_for_write_cleans_a_crashed_writers_debris(tmp_path):
    """A new writer removes work/, trash-* and .tmp-* left by a crash, and never lists them as checkpoints."""
    s = _open(tmp_path)
    _commit(s, 1, b"w")
    s.close()
    ckpts = Path(s.layout.ckpts)
    (ckpts / "work").mkdir()
    (ckpts / "work" / "model.bin").write_bytes(b"partial")
    (ckpts / "trash-001-deadbeef").mkdir()
    (ckpts / ".tmp-last-1234").symlink_to("epochs/001")
    (ckpts / "epochs" / "notanepoch").mkdir()
    again = CheckpointStore(tmp_path / "save")
    assert again.epochs() == [1]
    again.open_for_write()
    assert sorted(os.listdir(ckpts)) == ["epochs", "last", "lock"]
    assert again.verify(1)[0].epoch == 1


def test_next_writer_continues_the_generation_count(tmp_path):
    """A new writer on an existing directory commits with a generation above every existing one."""
    s = _open(tmp_path)
    last = _commit(s, 5, b"w")
    s.close()
    again = _open(tmp_path)
    assert _commit(again, 1, b"w").generation == last.generation + 1


# -- links ------------------------------------------------------------------------------------------
def test_set_link_falls_back_to_a_pointer_file(tmp_path, monkeypatch):
    """Where os.symlink fails (no symlink support), set_link writes a pointer file that read_link and the store read."""
    s = _open(tmp_path)
    _commit(s, 1, b"w1")
    _commit(s, 2, b"w2")

    def no_symlinks(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(durable.os, "symlink", no_symlinks)
    assert LocalFS().set_link(s.layout.link("best"), "epochs/001") == "pointer"
    best = Path(s.layout.link("best"))
    assert best.is_file() and not best.is_symlink()
    assert best.read_text() == "epochs/001\n"
    assert read_link(str(best)) == "epochs/001"
    assert s.link_epoch("best") == 1
    s.set_link("last", 1)  # replacing an existing symlink by a pointer file
    assert s.link_epoch("last") == 1 and Path(s.layout.link("last")).is_file()
    assert not [n for n in os.listdir(s.layout.ckpts) if n.startswith(".tmp-")]


def test_set_link_does_not_hide_a_full_disk(tmp_path, monkeypatch):
    """An ENOSPC from os.symlink is raised, not turned into a pointer file, and the old link stays."""
    s = _open(tmp_path)
    _commit(s, 1, b"w1")
    _commit(s, 2, b"w2")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable.os, "symlink", disk_full)
    with pytest.raises(OSError, match="No space left"):
        s.set_link("last", 1)
    assert os.readlink(s.layout.link("last")) == "epochs/002"


@pytest.mark.parametrize("target", ["/etc", "../../etc", "epochs/../../save/ckpts/epochs/001", "epochs/abc"])
def test_a_link_pointing_outside_ckpts_is_ignored(tmp_path, target):
    """A best/last link that leads outside ckpts/epochs is ignored by link_epoch and by the restart order."""
    s = _open(tmp_path)
    _commit(s, 1, b"w1")
    _commit(s, 2, b"w2")
    last = s.layout.link("last")
    os.unlink(last)
    os.symlink(target, last)
    assert s.link_epoch("last") is None
    assert list(s.candidates()) == [2, 1]
    assert s.find_valid()[0] == 2


def test_an_oversized_pointer_file_is_ignored(tmp_path):
    """A pointer file larger than a pointer is refused by read_link and ignored by link_epoch."""
    s = _open(tmp_path)
    _commit(s, 1, b"w1")
    best = Path(s.layout.link("best"))
    best.write_text("epochs/001\n" + "x" * 400)
    with pytest.raises(ValueError, match=r"larger than 256 bytes"):
        read_link(str(best))
    assert s.link_epoch("best") is None


def test_a_leftover_that_cannot_be_removed_is_logged_and_the_store_opens(tmp_path, caplog):
    """Debris that rmtree cannot remove is reported by path; opening the store for writing still succeeds."""
    from candle_ckpt.testing.faultfs import FaultFS

    s = CheckpointStore(str(tmp_path / "save"))
    s.open_for_write()
    _commit(s, 1, b"one")
    s.close()
    (Path(s.layout.ckpts) / "trash-001-dead").mkdir()
    again = CheckpointStore(str(tmp_path / "save"), fs=FaultFS(fail_at=1, kinds=("rmtree",)))
    with caplog.at_level("WARNING", logger="candle_ckpt"):
        again.open_for_write()
    assert "could not remove leftover" in caplog.text and "trash-001-dead" in caplog.text
    assert (Path(s.layout.ckpts) / "trash-001-dead").is_dir()
    assert again.epochs() == [1]


def test_delete_whose_rmtree_fails_still_removes_the_epoch(tmp_path, caplog):
    """If the trash of a deleted epoch cannot be removed, the epoch is gone anyway and the leftover is logged."""
    from candle_ckpt.testing.faultfs import FaultFS

    fs = FaultFS()
    s = CheckpointStore(str(tmp_path / "save"), fs=fs)
    s.open_for_write()
    _commit(s, 1, b"one")
    _commit(s, 2, b"two")
    fs.arm(("rmtree",), 1)
    with caplog.at_level("WARNING", logger="candle_ckpt"):
        s.delete(1)
    assert s.epochs() == [2]
    assert "goes at the next start" in caplog.text
    assert [p.name for p in Path(s.layout.ckpts).glob("trash-*")]


def test_slow_writer_message_states_the_wait_and_the_speeds() -> None:
    """The "writer cannot keep up" line gives the wait, the speed reached and the speed needed for the interval."""
    from candle_ckpt.engine.writer import slow_writer_message

    msg = slow_writer_message(3, 2, 100_000_000, submitted=10.0, wait_start=10.5, wait_end=12.0)
    assert msg.startswith("epoch 3: training waited 1.50 s for the checkpoint write of epoch 2, which was still")
    assert "it wrote 100 MB in 2.00 s (50 MB/s)" in msg
    assert "keeping up with one save every 0.50 s of training needs 200 MB/s" in msg
    tiny = slow_writer_message(3, 2, 2_500, submitted=0.0, wait_start=1.0, wait_end=2.0)
    assert "it wrote 2.5 kB in 2.00 s (1.25 kB/s)" in tiny
    assert "ckpt_save_interval" in msg and "ckpt_save_weights_only" in msg


def test_counts_and_positions_read_as_english() -> None:
    """Issue 40 item 6: one helper for counts ("1 checkpoint", never "1 checkpoints") and one name for a checkpoint's
    place in training, Keras's 1-based epochs: a step checkpoint after step 1 of fit's epoch 21 is "epoch 21, step 1"
    (list said "epoch 20 + 1 steps"); the end-of-run report uses the count helper."""
    from candle_ckpt.core.log import counted, position
    from candle_ckpt.core.policy import BestState
    from candle_ckpt.engine.aftercommit import report_summary

    assert [counted(n, "checkpoint") for n in (0, 1, 2)] == ["0 checkpoints", "1 checkpoint", "2 checkpoints"]
    assert counted(1, "process", "processes") == "1 process" and counted(3, "process", "processes") == "3 processes"
    assert position(20) == "epoch 20" and position(20, 1) == "epoch 21, step 1"
    best = BestState(metric="loss", mode="min")
    line = report_summary([{"epoch": 1, "bytes": 10, "save_s": 0.1}], best, [])
    assert line.startswith("report: 1 checkpoint, 10 B in 0.10 s"), line


def test_said_once_passes_each_message_on_the_first_time_only() -> None:
    """core.log.SaidOnce is the one said-once helper (the Keras 3 and tf_keras train states use it): a message
    given again is dropped, another message is said, and each object keeps its own memory."""
    from candle_ckpt.core.log import SaidOnce

    said: list[str] = []
    warn_once = SaidOnce(said.append)
    for message in ("a", "b", "a", "b", "c"):
        warn_once(message)
    assert said == ["a", "b", "c"]
    SaidOnce(said.append)("a")
    assert said == ["a", "b", "c", "a"]


def test_current_lineage_follows_last_back_through_rollbacks() -> None:
    """Issue 40 item 7: core.lineage.current_lineage reads the job's history from the sidecars (epoch, generation,
    resumed_from): after a rollback to 3 and two new epochs, the old 6-10 are abandoned; a second rollback into the
    old lineage (to 8) abandons the new 4-5 instead; an epoch an older run saved but the current run skipped (another
    save interval) is not the current run's past; no last, nothing can be told apart."""
    from candle_ckpt.core.lineage import Record, current_lineage

    first = {e: Record(e, None) for e in range(1, 11)}  # a run from scratch saved 1-10 (generations 1-10)
    after = {**first, 4: Record(11, 3), 5: Record(12, 3)}  # rollback 3; the resumed run saved 4 and 5
    assert current_lineage(after, 5) == {1, 2, 3, 4, 5}
    assert current_lineage(after, 8) == {1, 2, 3, 6, 7, 8}  # rolled back again, into the first run
    skipped = {**first, 4: Record(11, 2), 6: Record(12, 2)}  # resumed after 2, saving every 2nd epoch
    assert current_lineage(skipped, 6) == {1, 2, 4, 6}
    crash = {**{e: Record(e, None) for e in (1, 2, 3)}, 4: Record(4, 3), 5: Record(5, 3)}  # a plain resume
    assert current_lineage(crash, 5) == {1, 2, 3, 4, 5}
    assert current_lineage(after, None) == set() and current_lineage(after, 99) == set()
    candle = {e: Record(0, None) for e in (1, 2, 3)}  # adopted CANDLE checkpoints: generation 0
    assert current_lineage(candle, 3) == {1, 2, 3}
