"""``candle-ckpt`` on sharded checkpoints: list, verify, info, rollback, prune and consolidate, for real.

The checkpoints are those of a real Keras model trained with ``fit``'s defaults
(shuffle, validation data): after each epoch, two ranks (threads of a
``ThreadGroup``) save its model and optimizer variables split in halves, with
the model's ``config.json``/``metadata.json`` beside the manifest, as a job of
two processes does. Every command runs as ``python -m candle_ckpt`` in a
subprocess. ``consolidate`` must give a ``model.keras`` that
``keras.models.load_model`` reads with every weight equal bit for bit.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from doclines import DOC_JOB, DOCS, console_examples, matches  # noqa: E402
from locations import REPO  # noqa: E402
from shardkit import run_ranks  # noqa: E402

from candle_ckpt.core.sidecar import Sidecar  # noqa: E402
from candle_ckpt.keras.state import ModelState  # noqa: E402
from candle_ckpt.storage.commit import FileSpec  # noqa: E402
from candle_ckpt.storage.multipart import RankPart, SharedSave, write_rank_part  # noqa: E402
from candle_ckpt.storage.sharded import MANIFEST, Chunk  # noqa: E402
from candle_ckpt.storage.store import CheckpointStore  # noqa: E402
from candle_ckpt.testing.groups import ThreadGroup  # noqa: E402

EPOCHS = 3
ENV = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "candle_ckpt", *args], env=ENV, capture_output=True, text=True, timeout=timeout
    )


def all_variables(model: keras.Model) -> list:
    return [*model.variables, *model.optimizer.variables]


def halves(model: keras.Model, rank: int) -> list[Chunk]:
    """Rank ``rank``'s half (by rows) of every model and optimizer variable; a scalar is rank 0's."""
    chunks = []
    for v in all_variables(model):
        a = np.asarray(keras.ops.convert_to_numpy(v))
        if a.ndim == 0:
            if rank == 0:
                chunks.append(Chunk(v.path, a.dtype.name, (), (), a.copy()))
            continue
        cut = a.shape[0] // 2
        start, stop = (0, cut) if rank == 0 else (cut, a.shape[0])
        index = ((start, stop), *((0, n) for n in a.shape[1:]))
        chunks.append(Chunk(v.path, a.dtype.name, a.shape, index, np.array(a[start:stop], order="C")))
    return chunks


def save_epoch(store: CheckpointStore, model: keras.Model, epoch: int) -> None:
    """Both ranks save the model's state at ``epoch``: each its halves, the primary the config too."""
    config, metadata = ModelState(model).full_model_parts()
    files = [
        FileSpec("config.json", lambda f: f.write(config.encode())),
        FileSpec("metadata.json", lambda f: f.write(metadata.encode())),
    ]
    side = Sidecar(epoch=epoch, generation=0, model_file=MANIFEST, files={}, save_best_metric="val_loss")

    def work(g):
        part = RankPart(halves(model, g.rank), [FileSpec(f"train.state.p{g.rank:05d}.npz", lambda f: f.write(b"s"))])
        if g.rank == 0:
            return store.commit(epoch, files, side, best_epoch=1, shared=SharedSave(g, f"e{epoch}", part, timeout_s=60))
        return write_rank_part(store.layout, g, f"e{epoch}", part, timeout_s=60)

    results = run_ranks(ThreadGroup(2), work)
    assert results[1] == f"epochs/{epoch:03d}", results


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, list[np.ndarray]]]:
    """A directory of 3 sharded checkpoints of a real fit, and the exact variables at each epoch."""
    root = tmp_path_factory.mktemp("sharded") / "save"
    # Names as a job's fresh process gives them (seed_generator, not seed_generator_69 after the suite's
    # earlier models): the consolidated model, built from config in a fresh process, then matches them all.
    keras.backend.clear_session()
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(6, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    store = CheckpointStore(root)
    store.open_for_write()
    values: dict[int, list[np.ndarray]] = {}
    for epoch in range(1, EPOCHS + 1):
        model.fit(x, y, validation_data=(x, -y), initial_epoch=epoch - 1, epochs=epoch, batch_size=16, verbose=0)
        save_epoch(store, model, epoch)
        state = [*model.weights, *model.optimizer.variables]  # what a .keras file holds, in load_model's order
        values[epoch] = [np.array(keras.ops.convert_to_numpy(v)) for v in state]
    store.close()
    return root, values


def copy_of(trained, tmp_path: Path) -> Path:
    dst = tmp_path / "save"
    shutil.copytree(trained[0], dst, symlinks=True)
    return dst


def test_list_verify_and_info_read_a_sharded_checkpoint(trained) -> None:
    """list shows 3 checkpoints, verify checks every part of each, info lists both parts and the manifest."""
    root, _ = trained
    listed = cli("list", str(root))
    assert listed.returncode == 0, listed.stderr
    assert "3 checkpoints" in listed.stdout and "best -> 001, last -> 003" in listed.stdout
    verified = cli("verify", str(root))
    assert verified.returncode == 0, verified.stderr
    assert "epoch 003: ok  9 files" in verified.stdout and "all 3 checkpoints verified" in verified.stdout
    info = cli("info", str(root), "last")
    assert info.returncode == 0, info.stderr
    for name in ("part-00000.bin", "part-00001.bin", "part-00001.json", MANIFEST, "train.state.p00001.npz"):
        assert name in info.stdout, name
    assert "model_file         manifest.json" in info.stdout


def test_a_damaged_part_is_named_and_refused_by_verify_rollback_and_consolidate(trained, tmp_path: Path) -> None:
    """A flipped byte in epoch 2's part-00001.bin: verify exits 1 naming it; rollback and consolidate refuse."""
    root = copy_of(trained, tmp_path)
    part = root / "ckpts" / "epochs" / "002" / "part-00001.bin"
    raw = bytearray(part.read_bytes())
    raw[3] ^= 0x40
    part.write_bytes(bytes(raw))
    verified = cli("verify", str(root))
    assert verified.returncode == 1
    assert "epochs/002/part-00001.bin: CRC32 is" in verified.stdout + verified.stderr
    rolled = cli("rollback", str(root), "2")
    assert rolled.returncode == 1 and "refusing to roll back to epoch 2" in rolled.stderr
    out = tmp_path / "m.keras"
    consolidated = cli("consolidate", str(root), str(out), "--epoch", "2")
    assert consolidated.returncode == 1 and "part-00001.bin" in consolidated.stderr
    assert not out.exists()


def test_rollback_and_prune_work_on_sharded_checkpoints(trained, tmp_path: Path) -> None:
    """prune --keep-limit 1 keeps best (1) and last (3), removing 2 whole; rollback then re-points last at 1."""
    root = copy_of(trained, tmp_path)
    pruned = cli("prune", str(root), "--keep-limit", "1")
    assert pruned.returncode == 0, pruned.stderr
    store = CheckpointStore(root)
    assert store.epochs() == [1, 3]
    assert not [p for p in os.listdir(store.layout.ckpts) if p.startswith("trash-")]
    rolled = cli("rollback", str(root), "1")
    assert rolled.returncode == 0, rolled.stderr
    assert store.link_epoch("last") == 1
    store.verify(1)


def test_consolidate_gives_a_model_keras_that_load_model_reads_bit_for_bit(trained, tmp_path: Path) -> None:
    """consolidate writes OUT.keras; keras.models.load_model gives every weight and optimizer variable bit for bit."""
    root, values = trained
    out = tmp_path / "model.keras"
    epoch = 2  # neither best (1) nor last (3): --epoch picks it
    done = cli("consolidate", str(root), str(out), "--epoch", str(epoch))
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout and f"epochs/{epoch:03d}" in done.stdout
    loaded = keras.models.load_model(out)
    got = [np.array(keras.ops.convert_to_numpy(v)) for v in [*loaded.weights, *loaded.optimizer.variables]]
    want = values[epoch]
    assert len(got) == len(want) >= 20
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), f"variable {i} differs"
    assert not any(np.array_equal(got[0], values[e][0]) for e in (1, 3))  # the epochs differ: epoch 2 was read


def test_cli_rst_consolidate_example_is_real_output(trained, tmp_path: Path) -> None:
    """docs/cli.rst's consolidate example, run as shown in a folder whose ./save holds these checkpoints, prints
    the line shown (numbers only have to be numbers; the page's job folder is /home/me/job) and writes the file."""
    ((command, expected),) = [(c, e) for c, e in console_examples(DOCS / "cli.rst") if "consolidate" in c.split()[:2]]
    words = command.split()  # candle-ckpt consolidate ./save OUT.keras ...
    copy_of(trained, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "candle_ckpt", *words[1:]], cwd=tmp_path, env=ENV, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    got = (done.stdout + done.stderr).replace(str(tmp_path), DOC_JOB).splitlines()
    assert done.returncode == 0 and matches(expected, got), (command, expected, got)
    assert (tmp_path / words[3]).is_file()


SAVE_ONE = """
import sys
sys.path[:0] = sys.argv[2:]
import keras
from test_sharded_cli import save_epoch
from candle_ckpt.storage.store import CheckpointStore
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile(optimizer="adam", loss="mse")
model.optimizer.build(model.trainable_variables)
store = CheckpointStore(sys.argv[1])
store.open_for_write()
save_epoch(store, model, 1)
store.close()
"""


@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=pytest.mark.needs_package("jax"))])
def test_consolidate_prints_no_tensorflow_startup_lines(tmp_path: Path, backend: str) -> None:
    """Issue 40 item 1: `candle-ckpt consolidate` run as a user runs it (TF_CPP_MIN_LOG_LEVEL unset) prints its one
    line and none of TensorFlow's start-up lines: on TensorFlow, Keras's import loads it; on JAX, Keras's
    serialization imports TensorFlow inside model.save (it printed them there). The checkpoint is saved by two
    ranks under the same backend (a checkpoint's variable dtypes follow its backend)."""
    env = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["KERAS_BACKEND"] = backend
    here = str(Path(__file__).parent)
    subprocess.run(
        [sys.executable, "-c", SAVE_ONE, str(tmp_path / "save"), here, str(REPO / "tests")],
        env=dict(env, TF_CPP_MIN_LOG_LEVEL="3"), check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "candle_ckpt", "consolidate", str(tmp_path / "save"), str(tmp_path / "m.keras")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "" and done.stdout.startswith(f"wrote {tmp_path / 'm.keras'}: "), done.stdout + done.stderr


def test_consolidate_refuses_what_it_cannot_do(trained, tmp_path: Path) -> None:
    """A wrong output name, an unknown epoch: one line on stderr, exit 2, nothing written."""
    root, _ = trained
    bad = cli("consolidate", str(root), str(tmp_path / "model.h5"))
    assert bad.returncode == 2 and "must end in .keras" in bad.stderr
    missing = cli("consolidate", str(root), str(tmp_path / "m.keras"), "--epoch", "9")
    assert missing.returncode == 2 and "no checkpoint for epoch 9" in missing.stderr
    assert not list(tmp_path.iterdir())


def test_paths_match_across_name_scopes_and_refuse_ambiguity() -> None:
    """A config-built model's paths find the script's scoped ones, optimizer names follow, a clash is refused."""
    from candle_ckpt.cli.consolidate import match_paths

    saved = {"sequential/dense/kernel", "sequential/dense_1/kernel", "adam/iteration"}
    saved |= {"adam/sequential_dense_kernel_momentum", "adam/sequential_dense_1_kernel_momentum"}
    paths = ["dense/kernel", "dense_1/kernel", "adam/iteration", "adam/dense_kernel_momentum"]
    paths += ["adam/dense_1_kernel_momentum", "seed_generator/seed_generator_state"]
    assert match_paths(paths, saved, "adam/") == {
        "dense/kernel": "sequential/dense/kernel",
        "dense_1/kernel": "sequential/dense_1/kernel",
        "adam/iteration": "adam/iteration",
        "adam/dense_kernel_momentum": "adam/sequential_dense_kernel_momentum",
        "adam/dense_1_kernel_momentum": "adam/sequential_dense_1_kernel_momentum",
    }
    with pytest.raises(ValueError, match="matches several saved variables"):
        match_paths(["dense/kernel"], {"a/dense/kernel", "b/dense/kernel"}, None)
    with pytest.raises(ValueError, match="holds no value for the model's dense/bias"):
        match_paths(["dense/bias"], saved, "adam/")
