"""The ``candle-ckpt`` command line, run for real on directories written by real training.

Every command runs in a subprocess as ``python -m candle_ckpt ...`` with
``PYTHONPATH`` set to the root of the repository holding this file. That is the
same entry point as the installed ``candle-ckpt`` console script
(``candle_ckpt.__main__:run``), but the installed
script imports the package from wherever it was ``pip install -e``-ed, which
need not be the tree under test (a worktree, a CI checkout); ``-m`` with an
explicit ``PYTHONPATH`` always runs this tree's code.

The checkpoint directory is written once per module by a real ``model.fit``
with :class:`~candle_ckpt.keras.callback.CandleCheckpointCallback` (tiny Dense model,
6 epochs, a checkpoint every epoch). Its validation targets are the negated
training targets, so ``val_loss`` rises as the model learns: ``best`` is an early
epoch and ``last`` the final one, which lets the tests tell them apart. Tests
that change the directory work on a copy.
"""

from __future__ import annotations

import os

from locations import REPO

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

import fcntl  # noqa: E402
import json  # noqa: E402
import pty  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import termios  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from candle_ckpt.core import layout as L  # noqa: E402
from candle_ckpt.storage.store import CheckpointStore  # noqa: E402

EPOCHS = 6


# -- helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trained:
    """A checkpoint directory written by real training, and what the test saw during it."""

    directory: Path
    weights: dict[int, list[np.ndarray]]  # model weights at the end of each epoch (completed-epoch count)
    best: int
    last: int


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env.pop("CANDLE_CKPT_DEBUG", None)
    return env


def cli(*args: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m candle_ckpt ARGS`` and return the finished process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", "candle_ckpt", *map(str, args)],
        capture_output=True,
        text=True,
        env=env or _env(),
        cwd=REPO,
        timeout=300,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """The process failed with ``code`` and exactly one stderr line holding every needle, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("candle-ckpt: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def build_model(seed: int = 0):
    """A compiled Dense 8 -> 16 -> 1 model with Adam, seeded."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    return model


def make_params(directory: Path, **overrides: Any) -> dict[str, Any]:
    """gParameters of the module's training job."""
    params = {
        "epochs": EPOCHS,
        "ckpt_directory": str(directory),
        "ckpt_restart_mode": "auto",
        "ckpt_save_best_metric": "val_loss",
        "ckpt_save_interval": 1,
    }
    params.update(overrides)
    return params


def copy_of(trained: Trained, tmp_path: Path) -> Path:
    """A private copy of the trained directory (links copied as links)."""
    dst = tmp_path / "save"
    shutil.copytree(trained.directory, dst, symlinks=True)
    return dst


def flip_byte(path: Path) -> None:
    """Invert one byte in the middle of ``path`` (same size, different content)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_sidecar(directory: Path, epoch: int) -> Path:
    """Alter a value in the sidecar of ``epoch`` (still valid JSON, wrong sidecar CRC)."""
    path = directory / "ckpts" / "epochs" / L.epoch_name(epoch) / L.SIDECAR
    text = path.read_text()
    assert '"reason": "' in text
    path.write_text(text.replace('"reason": "', '"reason": "X', 1))
    return path


def tree(directory: Path) -> list[tuple[str, int]]:
    """Every path under ``directory`` with its size (links as their target string length)."""
    out = []
    for p in sorted(directory.rglob("*")):
        out.append((str(p.relative_to(directory)), len(os.readlink(p)) if p.is_symlink() else p.lstat().st_size))
    return out


def epochs_on_disk(directory: Path) -> list[int]:
    return CheckpointStore(directory).epochs()


# -- the trained directory ----------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Train 6 epochs with CandleCheckpointCallback once for the module; record weights per epoch."""
    import keras

    from candle_ckpt import CandleCheckpointCallback

    directory = tmp_path_factory.mktemp("cli") / "save"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1))).astype("float32")
    model = build_model()
    weights: dict[int, list[np.ndarray]] = {}

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            weights[epoch + 1] = [np.array(w, copy=True) for w in self.model.get_weights()]

    ckpt = CandleCheckpointCallback(make_params(directory), logger=None)
    model.fit(
        x,
        y,
        validation_data=(x, -y),
        epochs=EPOCHS,
        batch_size=16,
        shuffle=False,
        verbose=0,
        callbacks=[ckpt, Record()],
    )
    # fit has returned: the callback has released the writer lock, so the CLI may write here.
    store = CheckpointStore(directory)
    best, last = store.link_epoch("best"), store.link_epoch("last")
    assert store.epochs() == list(range(1, EPOCHS + 1))
    # The tests below need best and last apart, and best older than the 2 newest.
    assert last == EPOCHS and best is not None and best < EPOCHS - 2, (best, last)
    return Trained(directory, weights, best, last)


# -- list -----------------------------------------------------------------------------------


def test_list_table_shows_every_checkpoint_with_marks(trained: Trained) -> None:
    """`list` prints a header and one row per epoch, best and last marked, every row ok."""
    proc = cli("list", trained.directory)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["EPOCH", "SAVED", "SIZE", "METRIC"] and "SIDECAR" in lines[0]
    rows = {int(line.split()[0]): line for line in lines[1 : EPOCHS + 1]}
    assert sorted(rows) == list(range(1, EPOCHS + 1))
    for epoch, line in rows.items():
        assert line.rstrip().endswith("ok"), line
        assert "val_loss=" in line
        assert ("best" in line) == (epoch == trained.best), line
        assert ("last" in line) == (epoch == trained.last), line
    assert f"best -> {L.epoch_name(trained.best)}, last -> {L.epoch_name(trained.last)}" in proc.stdout


def test_list_json_matches_the_sidecars(trained: Trained) -> None:
    """`list --json` gives every epoch with its marks, validity and the monitored metric from its sidecar."""
    proc = cli("list", trained.directory, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["best"] == trained.best and out["last"] == trained.last
    rows = out["checkpoints"]
    assert [r["epoch"] for r in rows] == list(range(1, EPOCHS + 1))
    store = CheckpointStore(trained.directory)
    for r in rows:
        side = store.read_sidecar(r["epoch"])
        assert r["valid"] is True and r["problem"] is None and r["verified"] is False
        assert r["best"] == (r["epoch"] == trained.best) and r["last"] == (r["epoch"] == trained.last)
        assert r["metric"] == "val_loss" and r["metric_value"] == side.logs["val_loss"]
        assert r["bytes"] == side.total_bytes and r["generation"] == side.generation


def test_list_reads_sidecars_and_verify_flags_the_flipped_byte(trained: Trained, tmp_path: Path) -> None:
    """Without --verify a damaged weights file still lists as ok (sidecars only); --verify flags it, exit 1."""
    d = copy_of(trained, tmp_path)
    flip_byte(d / "ckpts" / "epochs" / "004" / L.MODEL_FILE)
    plain = json.loads(cli("list", d, "--json").stdout)
    assert all(r["valid"] for r in plain["checkpoints"])
    proc = cli("list", d, "--verify", "--json")
    assert proc.returncode == 1
    rows = {r["epoch"]: r for r in json.loads(proc.stdout)["checkpoints"]}
    assert all(r["verified"] for r in rows.values())
    assert [e for e, r in rows.items() if not r["valid"]] == [4]
    assert rows[4]["problem"].startswith(f"{L.MODEL_FILE}: CRC32 is ")
    table = cli("list", d, "--verify")
    assert table.returncode == 1
    line4 = next(line for line in table.stdout.splitlines() if line.startswith("004"))
    assert f"INVALID: {L.MODEL_FILE}: CRC32 is" in line4


def test_list_ignores_a_last_link_that_leaves_the_directory(trained: Trained, tmp_path: Path) -> None:
    """A tampered `last` link pointing outside ckpts/epochs is not followed; list warns once and still works."""
    d = copy_of(trained, tmp_path)
    (d / "ckpts" / "last").unlink()
    (d / "ckpts" / "last").symlink_to("../../outside")
    proc = cli("list", d, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["last"] is None and not any(r["last"] for r in out["checkpoints"])
    assert proc.stderr.strip().splitlines() == [
        f"candle-ckpt: WARNING: ignoring {d / 'ckpts' / 'last'}: it points to '../../outside', which is outside "
        f"{d / 'ckpts'}; a link is followed only to {d / 'ckpts' / 'epochs' / 'NNN'}"
    ]


def test_list_shows_a_corrupt_sidecar_as_invalid(trained: Trained, tmp_path: Path) -> None:
    """A sidecar whose own CRC fails is listed as invalid with the reason, the other rows still shown."""
    d = copy_of(trained, tmp_path)
    corrupt_sidecar(d, 2)
    rows = {r["epoch"]: r for r in json.loads(cli("list", d, "--json").stdout)["checkpoints"]}
    assert len(rows) == EPOCHS
    assert [e for e, r in rows.items() if not r["valid"]] == [2]
    assert rows[2]["problem"].startswith(f"{L.SIDECAR}: its own CRC does not match")


# -- verify ---------------------------------------------------------------------------------


def test_verify_clean_directory_exits_0(trained: Trained) -> None:
    """`verify` checks every checkpoint's CRC32 and exits 0 when all match."""
    proc = cli("verify", trained.directory)
    assert proc.returncode == 0, proc.stderr
    ok = [line for line in proc.stdout.splitlines() if "CRC32 ok" in line]
    assert len(ok) == EPOCHS
    assert f"all {EPOCHS} checkpoints verified" in proc.stdout
    assert "%|" not in proc.stdout  # no progress bar when stdout is a pipe


def test_verify_flipped_byte_exits_1_naming_file_and_reason(trained: Trained, tmp_path: Path) -> None:
    """After one flipped byte `verify` exits 1, names the damaged file and says the CRC differs."""
    d = copy_of(trained, tmp_path)
    bad = d / "ckpts" / "epochs" / "003" / L.MODEL_FILE
    flip_byte(bad)
    recorded = CheckpointStore(d).read_sidecar(3).files[L.MODEL_FILE].crc32
    proc = cli("verify", d)
    assert proc.returncode == 1
    assert f"epoch 003: FAILED  {bad}: CRC32 is " in proc.stdout
    assert f"but the sidecar recorded {recorded}" in proc.stdout
    assert "1 of 6 checkpoints FAILED" in proc.stdout
    assert_one_line_error(proc, 1, "verification failed", str(bad))
    # --epoch narrows the check: another epoch passes, the damaged one fails.
    assert cli("verify", d, "--epoch", 5).returncode == 0
    assert cli("verify", d, "--epoch", 3).returncode == 1


def test_verify_shows_a_progress_bar_on_a_terminal(trained: Trained) -> None:
    """With stdout on a pseudo-terminal `verify` draws a tqdm byte progress bar per checkpoint."""
    master, slave = pty.openpty()
    # A fresh pty is 0x0; tqdm draws nothing in zero columns, as no real terminal is.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "candle_ckpt", "verify", str(trained.directory), "--epoch", "1"],
        stdout=slave,
        stderr=subprocess.PIPE,
        env=_env(),
        cwd=REPO,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    proc.stderr.close()
    out = b"".join(chunks).decode()
    assert "epoch 001:" in out and "%|" in out, out
    assert "epoch 001: ok" in out


# -- info -----------------------------------------------------------------------------------


def test_info_pretty_prints_the_last_sidecar(trained: Trained) -> None:
    """`info DIR` shows the sidecar of `last`: every field, each file with size and CRC, the logs."""
    proc = cli("info", trained.directory)
    assert proc.returncode == 0, proc.stderr
    side = CheckpointStore(trained.directory).read_sidecar(trained.last)
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert lines[0] == f"checkpoint {trained.directory / 'ckpts' / 'epochs' / '006'}  [last]"
    fields = {line.split()[0]: line.split()[1:] for line in lines[1:] if line}
    assert fields["epoch"] == ["6"] and fields["generation"] == [str(side.generation)]
    assert fields["save_best_metric"] == ["val_loss"] and fields["best_epoch"] == [str(trained.best)]
    assert fields["keras_version"] == [side.keras_version]
    for name, entry in side.files.items():
        assert fields[name][-2:] == ["crc32", entry.crc32]
    assert fields["val_loss"] == [f"{side.logs['val_loss']:.6g}"]
    assert fields["schema_version"] == ["1"]


def test_info_named_epoch_and_json(trained: Trained) -> None:
    """`info DIR best` marks the best checkpoint; `info DIR N --json` is exactly the sidecar's dict."""
    best = cli("info", trained.directory, "best")
    assert best.returncode == 0, best.stderr
    assert best.stdout.splitlines()[0].endswith(f"{L.epoch_name(trained.best)}  [best]")
    proc = cli("info", trained.directory, 2, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(
        json.dumps(CheckpointStore(trained.directory).read_sidecar(2).to_dict())
    )


# -- rollback -------------------------------------------------------------------------------


def test_rollback_then_restart_resumes_there(trained: Trained, tmp_path: Path) -> None:
    """After `rollback DIR 3`, restart() in a fresh model loads epoch 3's weights bit for bit."""
    from candle_ckpt import restart

    d = copy_of(trained, tmp_path)
    proc = cli("rollback", d, 3)
    assert proc.returncode == 0, proc.stderr
    assert "last -> epochs/003 (was epochs/006)" in proc.stdout
    assert os.readlink(d / "ckpts" / "last") == "epochs/003"
    assert "rollback: 'last' re-pointed from epochs/006 to epochs/003" in (d / "ckpt.log").read_text()
    assert epochs_on_disk(d) == list(range(1, EPOCHS + 1))  # nothing deleted
    model = build_model(seed=123)
    info = restart(make_params(d), model, logger=None)
    assert info is not None and info["epoch"] == 3
    for got, want in zip(model.get_weights(), trained.weights[3], strict=True):
        np.testing.assert_array_equal(got, want)


def test_after_a_rollback_list_marks_the_abandoned_lineage_verify_names_it_and_prune_removes_it(
    trained: Trained, tmp_path: Path
) -> None:
    """Issue 40 item 7: `rollback DIR 3` and one more epoch of training (a new epoch 4) leave epochs 5-6 of the
    abandoned run on disk. `list` marks them 'abandoned' (and --json says so), `verify` checks them too and names
    them (issue 47: a damaged one fails it, as every file on disk is checked), `prune --abandoned` removes exactly
    them and logs it."""
    import keras

    from candle_ckpt import CandleCheckpointCallback, restart

    d = copy_of(trained, tmp_path)
    assert cli("rollback", d, 3).returncode == 0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1))).astype("float32")
    model = build_model(seed=5)
    params = make_params(d, epochs=4)
    info = restart(params, model, logger=None)
    assert info["epoch"] == 3
    ckpt = CandleCheckpointCallback(params, logger=None)
    model.fit(x, y, validation_data=(x, -y), epochs=4, initial_epoch=3, batch_size=16, verbose=0, callbacks=[ckpt])
    keras.backend.clear_session()
    assert os.readlink(d / "ckpts" / "last") == "epochs/004" and epochs_on_disk(d) == list(range(1, EPOCHS + 1))

    proc = cli("list", d)
    assert proc.returncode == 0, proc.stderr
    marks = {int(line.split()[0]): line.split()[-2] for line in proc.stdout.splitlines()[1 : EPOCHS + 1]}
    assert [e for e, mark in marks.items() if "abandoned" in mark] == [5, 6], proc.stdout
    assert "last" in marks[4]
    assert (
        f"2 checkpoints (5-6) of a lineage a rollback abandoned: not on the way to last, never restored; "
        f"candle-ckpt prune {d} --abandoned removes them"
    ) in proc.stdout
    listed = json.loads(cli("list", d, "--json").stdout)
    assert [c["epoch"] for c in listed["checkpoints"] if c["abandoned"]] == [5, 6]

    flip_byte(d / "ckpts" / "epochs" / "006" / "model.keras")
    proc = cli("verify", d)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "epoch 005: ok  " in proc.stdout and "epoch 006: FAILED  " in proc.stdout
    assert [line for line in proc.stdout.splitlines() if line.endswith("(abandoned by a rollback)")][0].startswith(
        "epoch 005: ok"
    )
    assert "2 checkpoints (5-6) of a lineage a rollback abandoned were checked too" in proc.stdout
    assert "1 of 6 checkpoints FAILED verification" in proc.stdout

    proc = cli("prune", d, "--abandoned")
    assert proc.returncode == 0, proc.stderr
    assert "removed       epochs/005" in proc.stdout and "removed       epochs/006" in proc.stdout
    assert "pruned 2 of 6 checkpoints" in proc.stdout
    assert epochs_on_disk(d) == [1, 2, 3, 4]
    assert "pruned epochs 5-6 by candle-ckpt (abandoned)" in (d / "ckpt.log").read_text()
    assert "abandoned" not in cli("list", d).stdout


def test_rollback_to_corrupt_epoch_is_refused(trained: Trained, tmp_path: Path) -> None:
    """`rollback` to a checkpoint that fails its CRC exits 1 with one line, and `last` stays put."""
    d = copy_of(trained, tmp_path)
    bad = d / "ckpts" / "epochs" / "002" / L.MODEL_FILE
    flip_byte(bad)
    proc = cli("rollback", d, 2)
    assert_one_line_error(proc, 1, "refusing to roll back to epoch 2", str(bad), "CRC32")
    assert os.readlink(d / "ckpts" / "last") == "epochs/006"


@pytest.mark.parametrize("command", [["rollback", "2"], ["prune", "--keep-limit", "1"]])
def test_writing_commands_refuse_while_a_job_holds_the_lock(
    trained: Trained, tmp_path: Path, command: list[str]
) -> None:
    """With the writer lock held by a live process, rollback and prune exit 2, print nothing and change nothing."""
    d = copy_of(trained, tmp_path)
    store = CheckpointStore(d)
    store.open_for_write()  # this test process plays the running training job
    try:
        before = tree(d)
        proc = cli(command[0], d, *command[1:])
    finally:
        store.close()
    assert_one_line_error(proc, 2, "in use by another writer", f"pid {os.getpid()}")
    assert proc.stdout == ""  # refused before printing anything (no plan header)
    assert tree(d) == before


# -- prune ----------------------------------------------------------------------------------


def test_prune_dry_run_prints_the_plan_and_removes_nothing(trained: Trained, tmp_path: Path) -> None:
    """`prune --dry-run` lists what it would remove and leaves every file in place."""
    d = copy_of(trained, tmp_path)
    before = tree(d)
    proc = cli("prune", d, "--keep-limit", 2, "--keep-mode", "linear", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    would = [int(line.split()[2].split("/")[1]) for line in proc.stdout.splitlines() if line.startswith("would remove")]
    assert would == [e for e in range(1, EPOCHS + 1) if e not in (trained.best, 5, 6)]
    assert "dry run: would remove 3 of 6 checkpoints" in proc.stdout
    assert tree(d) == before


def test_prune_linear_removes_old_but_never_best_or_last(trained: Trained, tmp_path: Path) -> None:
    """`prune --keep-limit 2` keeps the 2 newest plus best, deletes the rest and prints each removal."""
    d = copy_of(trained, tmp_path)
    proc = cli("prune", d, "--keep-limit", 2, "--keep-mode", "linear")
    assert proc.returncode == 0, proc.stderr
    kept = sorted({trained.best, 5, 6})
    assert epochs_on_disk(d) == kept
    removed = [int(line.split()[1].split("/")[1]) for line in proc.stdout.splitlines() if line.startswith("removed ")]
    assert removed == [e for e in range(1, EPOCHS + 1) if e not in kept]
    store = CheckpointStore(d)
    assert store.link_epoch("best") == trained.best and store.link_epoch("last") == trained.last
    assert "pruned epochs" in (d / "ckpt.log").read_text()
    assert cli("verify", d).returncode == 0  # what is left is intact


def test_prune_exponential_does_what_its_dry_run_said(trained: Trained, tmp_path: Path) -> None:
    """For exponential mode with limit 1, the real prune removes exactly the dry-run plan; best and last stay."""
    d = copy_of(trained, tmp_path)
    plan = cli("prune", d, "--keep-limit", 1, "--keep-mode", "exponential", "--dry-run")
    would = [int(line.split()[2].split("/")[1]) for line in plan.stdout.splitlines() if line.startswith("would remove")]
    proc = cli("prune", d, "--keep-limit", 1, "--keep-mode", "exponential")
    assert proc.returncode == 0, proc.stderr
    removed = [int(line.split()[1].split("/")[1]) for line in proc.stdout.splitlines() if line.startswith("removed ")]
    assert removed == would and removed
    assert epochs_on_disk(d) == sorted({trained.best, trained.last})


# -- plot -----------------------------------------------------------------------------------


def test_plot_writes_a_png_that_decodes_headless(trained: Trained, tmp_path: Path) -> None:
    """`plot -o metrics.png` works with no display (even with a GUI MPLBACKEND set) and writes a real PNG."""
    import matplotlib.image

    out = tmp_path / "metrics.png"
    env = _env()
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    env["MPLBACKEND"] = "TkAgg"  # pyplot would try a GUI here; the command must not care
    proc = cli("plot", trained.directory, "-o", out, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.01  # something was drawn


# -- errors ---------------------------------------------------------------------------------

COMMANDS_ON_DIR = [
    ["list"],
    ["verify"],
    ["info"],
    ["rollback", "{dir}", "1"],
    ["prune", "{dir}", "--keep-limit", "1"],
    ["plot", "{dir}", "-o", "{tmp}/m.png"],
]


def _args(command: list[str], directory: Path, tmp: Path) -> list[str]:
    if len(command) == 1:
        return [command[0], str(directory)]
    return [a.format(dir=directory, tmp=tmp) for a in command]


@pytest.mark.parametrize("command", COMMANDS_ON_DIR, ids=lambda c: c[0])
def test_not_a_checkpoint_dir_is_one_line_exit_2(command: list[str], tmp_path: Path) -> None:
    """Every command on a directory without ckpts/epochs/, a missing one or a file fails with one line naming it and
    what it is, exit 2."""
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli(*_args(command, empty, tmp_path))
    assert_one_line_error(proc, 2, f"{empty} is not a checkpoint directory")
    missing = tmp_path / "missing"
    assert_one_line_error(cli(*_args(command, missing, tmp_path)), 2, f"{missing}: no such directory")
    a_file = tmp_path / "notadir"  # issue 40 item 3: it said "no such directory"
    a_file.write_text("x")
    proc = cli(*_args(command, a_file, tmp_path))
    assert_one_line_error(proc, 2, f"{a_file} is a file, not a checkpoint directory")


def test_pointing_at_ckpts_suggests_the_parent(trained: Trained) -> None:
    """Giving DIR/ckpts instead of DIR fails with a hint naming the real ckpt_directory."""
    proc = cli("list", trained.directory / "ckpts")
    assert_one_line_error(proc, 2, "is not a checkpoint directory", f"did you mean {trained.directory}")


def test_empty_checkpoint_dir_lists_nothing_and_plot_says_why(tmp_path: Path) -> None:
    """A ckpt_directory with no checkpoint yet lists as empty (exit 0); plot and info fail in one line."""
    (tmp_path / "save" / "ckpts" / "epochs").mkdir(parents=True)
    d = tmp_path / "save"
    listed = cli("list", d)
    assert listed.returncode == 0 and listed.stdout.startswith(f"no checkpoints in {d}")
    assert_one_line_error(cli("plot", d, "-o", tmp_path / "m.png"), 2, "nothing to plot")
    assert_one_line_error(cli("info", d), 2, "ckpts/last is missing")
    assert not (tmp_path / "m.png").exists()


def test_plot_unknown_image_format_is_one_line_exit_2(trained: Trained, tmp_path: Path) -> None:
    """`plot -o file.xyz` fails with matplotlib's reason on one line, exit 2, and writes nothing."""
    proc = cli("plot", trained.directory, "-o", tmp_path / "m.xyz")
    assert_one_line_error(proc, 2, "cannot plot", "xyz")
    assert not (tmp_path / "m.xyz").exists()


@pytest.mark.parametrize(
    "command", [["info", "{dir}", "99"], ["rollback", "{dir}", "99"], ["verify", "{dir}", "--epoch", "99"]]
)
def test_unknown_epoch_is_one_line_exit_2(trained: Trained, tmp_path: Path, command: list[str]) -> None:
    """Asking for an epoch that has no checkpoint fails with one line listing the epochs, exit 2."""
    proc = cli(*_args(command, trained.directory, tmp_path))
    assert_one_line_error(proc, 2, "no checkpoint for epoch 99", "epochs on disk: 1-6")


def test_corrupt_sidecar_is_one_line_exit_2(trained: Trained, tmp_path: Path) -> None:
    """`info` on a checkpoint whose sidecar was altered fails with one line naming the sidecar, exit 2."""
    d = copy_of(trained, tmp_path)
    path = corrupt_sidecar(d, 4)
    assert_one_line_error(cli("info", d, 4), 2, str(path), "its own CRC does not match")
    # verify counts it as corruption (exit 1); plot skips it with a warning and still draws.
    assert cli("verify", d, "--epoch", 4).returncode == 1
    plot = cli("plot", d, "-o", tmp_path / "m.png")
    assert plot.returncode == 0 and "skipping epoch 4" in plot.stderr and "Traceback" not in plot.stderr


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["info", "{dir}", "abc"], "an epoch must be an integer >= 0; got 'abc'"),
        (["prune", "{dir}", "--keep-limit", "0"], "argument --keep-limit: must be an integer > 0; got 0"),
        (["prune", "{dir}", "--keep-limit", "2", "--keep-mode", "log"], "argument --keep-mode: invalid choice"),
        (["prune", "{dir}"], "one of the arguments --keep-limit --abandoned is required"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_usage_errors_are_one_line_exit_2(trained: Trained, tmp_path: Path, argv: list[str], needle: str) -> None:
    """Bad arguments give argparse's reason on one line (no usage dump) and exit 2."""
    proc = cli(*[a.format(dir=trained.directory) for a in argv])
    assert_one_line_error(proc, 2, needle, "--help")


# -- help, imports, demo ------------------------------------------------------------------

HELP_MENTIONS = {
    "list": ["DIR", "--verify", "--json"],
    "verify": ["DIR", "--epoch"],
    "info": ["DIR", "EPOCH", "--json"],
    "rollback": ["DIR", "EPOCH"],
    "prune": ["DIR", "--keep-limit", "--keep-mode", "linear", "exponential", "--dry-run"],
    "plot": ["DIR", "-o", "--output", "--dpi"],
    "consolidate": ["DIR", "OUT.keras", "--epoch"],
    "campaign": ["ROOT", "--sort", "--state", "--json", "--plot", "--html", "--stale-factor", "--stale-floor"],
}


@pytest.mark.parametrize("command", sorted(HELP_MENTIONS))
def test_help_of_every_command_mentions_each_option(command: str) -> None:
    """`COMMAND --help` exits 0 with a description, an example and every option of the command."""
    proc = cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: candle-ckpt {command}")
    assert "example:\n  candle-ckpt " + command in proc.stdout
    for option in HELP_MENTIONS[command]:
        assert option in proc.stdout, option


def test_top_level_help_lists_every_command() -> None:
    """`candle-ckpt --help` exits 0 and names each command with its summary."""
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    for command in [*HELP_MENTIONS, "demo"]:
        assert f"\n    {command} " in proc.stdout, command


def test_every_option_has_help_text() -> None:
    """Each argument of each subcommand carries a help string (nothing undocumented in --help)."""
    import argparse

    from candle_ckpt.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == sorted([*HELP_MENTIONS, "demo"])
    for name, parser in sub.choices.items():
        assert parser.description, name
        for action in parser._actions:
            assert action.help, (name, action.dest)


def test_inspection_commands_do_not_import_keras_or_tensorflow(trained: Trained, tmp_path: Path) -> None:
    """list, verify, info, rollback, prune and plot run without importing keras or tensorflow."""
    d = copy_of(trained, tmp_path)
    script = (
        "import sys\n"
        "from candle_ckpt.cli.main import main\n"
        f"d = {str(d)!r}\n"
        "codes = [main(['list', d, '--verify']), main(['verify', d]), main(['info', d]),\n"
        "         main(['prune', d, '--keep-limit', '3', '--dry-run']), main(['rollback', d, '4']),\n"
        f"         main(['plot', d, '-o', {str(tmp_path / 'm.png')!r}])]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'tensorflow', 'tf_keras'))\n"
        "print('CODES', codes, 'HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CODES [0, 0, 0, 0, 0, 0] HEAVY []" in proc.stdout


def test_demo_without_the_demo_module_is_one_line_error() -> None:
    """If candle_ckpt.cli.demo cannot be imported, `demo` says so in one line and exits 2."""
    script = (
        "import sys\n"
        "sys.modules['candle_ckpt.cli.demo'] = None  # makes the import fail as if the module were absent\n"
        "from candle_ckpt.cli.main import main\n"
        "sys.exit(main(['demo', '--epochs', '1']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=60)
    assert_one_line_error(proc, 2, "the demo job is not available")


def test_demo_runs_and_writes_checkpoints_the_cli_lists(tmp_path: Path) -> None:
    """`demo --epochs 2 --ckpt_directory D` trains for real; `list --json` then shows epochs 1 and 2."""
    d = tmp_path / "demo"
    help_proc = cli("demo", "--help")
    assert help_proc.returncode == 0 and "--epochs" in help_proc.stdout and "--ckpt_directory" in help_proc.stdout
    proc = cli("demo", "--epochs", 2, "--ckpt_directory", d)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(cli("list", d, "--json").stdout)
    assert [r["epoch"] for r in out["checkpoints"]] == [1, 2] and out["last"] == 2


def _add_step(directory: Path, epoch: int, step: int) -> int:
    """Commit a step checkpoint holding the files of ``epoch``'s (a valid one); return its generation."""
    from dataclasses import replace

    from candle_ckpt.storage.store import FileSpec

    store = CheckpointStore(directory)
    store.open_for_write()
    try:
        side = store.read_sidecar(epoch)
        where = Path(store.layout.epoch_dir(epoch))
        files = [FileSpec(name, lambda f, p=where / name: f.write(p.read_bytes())) for name in side.files]
        return store.steps.commit(files, replace(side, step=step, reason="SIGTERM", files={})).generation
    finally:
        store.close()


def test_list_verify_and_rollback_show_step_checkpoints(trained: Trained, tmp_path: Path) -> None:
    """list and verify show a step checkpoint after the epochs (verify fails on its flipped byte), and
    rollback removes it, so the next restart() resumes from the rolled-back epoch."""
    from candle_ckpt import restart

    d = copy_of(trained, tmp_path)
    generation = _add_step(d, EPOCHS, 2)
    name = f"steps/{generation:03d}"
    proc = cli("list", d)
    assert proc.returncode == 0, proc.stderr
    assert name in proc.stdout and f"epoch {EPOCHS + 1}, step 2" in proc.stdout  # as ckpt.log names it
    assert "\n1 step checkpoint:" in proc.stdout
    listed = json.loads(cli("list", d, "--json").stdout)
    assert [(s["generation"], s["epoch"], s["step"]) for s in listed["steps"]] == [(generation, EPOCHS, 2)]
    proc = cli("verify", d)
    assert proc.returncode == 0, proc.stdout
    assert f"{name}: ok" in proc.stdout and f"all {EPOCHS + 1} checkpoints verified" in proc.stdout
    step_dir = d / "ckpts" / "steps" / f"{generation:03d}"
    flip_byte(step_dir / json.loads((step_dir / "ckpt-info.json").read_text())["model_file"])
    proc = cli("verify", d)
    assert proc.returncode == 1 and f"{name}: FAILED" in proc.stdout, proc.stdout
    proc = cli("rollback", d, 3)
    assert proc.returncode == 0, proc.stderr
    assert f"removed the step checkpoints {name}" in proc.stdout
    assert not list((d / "ckpts" / "steps").iterdir())
    info = restart(make_params(d), build_model(seed=123), logger=None)
    assert info["epoch"] == 3 and info["step"] is None
