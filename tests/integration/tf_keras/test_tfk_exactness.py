"""Issue 26 item 3: a tf_keras job SIGKILLed in the middle of epoch 3 and resumed, in fresh processes.

The global RNGs (a ``Sequence`` shuffled with ``np.random``) and the state of ``EarlyStopping`` and
``ReduceLROnPlateau`` resume too (``train.state.npz``).

``fit`` runs with its defaults (``shuffle=True``) and validation data. Without random layers, or with
a ``Dropout`` under ``enable_tf_random_generator()``, the resumed run is bit-identical. A ``Dropout``
as it comes draws from TF1 stateful kernels, whose state cannot be saved: the checkpoint log says so
in one warning at the first save, naming the cause and the remedy.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from jobserver import JobServer
from testkit import assert_said_once, checkpoint_files, finished_line

pytestmark = pytest.mark.tf_only

WARNING = (
    "WARNING tf_keras model: a resumed run will not be bit-identical to an uninterrupted one: random layers "
    "(Dropout) draw from stateful TF1 random kernels, whose state cannot be saved; call "
    "tf_keras.backend.experimental.enable_tf_random_generator() before building the model: they then draw from "
    "tf.random.Generator states, which the checkpoint keeps (the weights, the optimizer state and the order of "
    "fit's shuffle resume exactly)"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One job server for the module (tf_keras imported once)."""
    srv = JobServer("tfk_job.py", tmp_path_factory.mktemp("tfk") / "server.stderr")
    yield srv
    srv.close()


def _runs(
    server, tmp_path: Path, setup: str, ran: tuple[int, int] = (5, 3)
) -> tuple[np.lib.npyio.NpzFile, np.lib.npyio.NpzFile, list[str]]:
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    lines, status = server.run(setup, "full", str(full), str(full) + ".npz")
    assert status == 0 and lines[-1] == f"done 0 ran {ran[0]}", lines
    lines, status = server.run(setup, "kill", str(resumed), str(resumed) + ".npz")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (lines, status)
    lines, status = server.run(setup, "resume", str(resumed), str(resumed) + ".npz")
    assert status == 0 and lines[-1] == f"done 2 ran {ran[1]}", lines
    log = (resumed / "ckpt.log").read_text().splitlines()
    return np.load(str(full) + ".npz"), np.load(str(resumed) + ".npz"), log


@pytest.mark.parametrize("setup", ["plain", "generator", "mirrored", "no_initial_epoch"])
def test_tf_keras_with_shuffle_and_a_generator_dropout_resumes_bit_identical(server, tmp_path, setup):
    """fit's default shuffle=True, validation data, and no random layer or a Dropout under
    enable_tf_random_generator() (also under a MirroredStrategy, which distributes fit's input), and a script whose
    fit is not given initial_epoch: killed in epoch 3 and resumed after epoch 2, every array equals the
    uninterrupted run's byte for byte, and no warning about exactness is logged."""
    a, b, log = _runs(server, tmp_path, setup)
    assert a.files == b.files and [k for k in a.files if a[k].tobytes() != b[k].tobytes()] == []
    assert not [line for line in log if "bit-identical" in line]
    saved = tmp_path / "resumed" / "ckpts" / "epochs" / "002" / "random_layers.npz"
    assert saved.is_file() == (setup in ("generator", "mirrored"))


@pytest.mark.parametrize(("setup", "ran"), [("sequence", (5, 3)), ("plateau", (4, 2))])
def test_tf_keras_global_rngs_and_callback_state_resume_bit_identical(server, tmp_path, setup, ran):
    """Killed in epoch 3 and resumed after epoch 2, bit-identical: a Sequence input that fit reorders with
    Python's random and whose on_epoch_end shuffles its index with np.random.shuffle and draws from TensorFlow's
    global generator (``sequence``), and an
    EarlyStopping in the middle of its patience and a ReduceLROnPlateau that has lowered the rate (``plateau``:
    EarlyStopping stops after epoch 4 in both runs, and the rate is halved after epochs 2, 3 and 4 in both)."""
    a, b, log = _runs(server, tmp_path, setup, ran)
    assert a.files == b.files and [k for k in a.files if a[k].tobytes() != b[k].tobytes()] == []
    if setup == "plateau":
        assert a["lr"] == b["lr"] == np.float32(1e-2) / 8
    assert not [line for line in log if "bit-identical" in line]
    assert (tmp_path / "resumed" / "ckpts" / "epochs" / "002" / "train.state.npz").is_file()


def test_tf_keras_with_a_tf1_dropout_says_why_once_per_run(server, tmp_path):
    """A Dropout as it comes (TF1 stateful kernels): the resumed run differs, and each run of the job logs the
    warning once, at its first save, naming the cause and the remedy."""
    a, b, log = _runs(server, tmp_path, "defaults")
    assert [k for k in a.files if a[k].tobytes() != b[k].tobytes()] != []
    assert [line for line in log if "bit-identical" in line] == [line for line in log if line.endswith(WARNING)]
    assert len([line for line in log if line.endswith(WARNING)]) == 2  # the killed run's and the resumed run's


@pytest.mark.parametrize(("setup", "stopped"), [("early_stopping", 3), ("plain", 5)])
def test_a_finished_tf_keras_run_rerun_trains_nothing(server, tmp_path, setup, stopped):
    """A tf_keras run that EarlyStopping (after the checkpoint callback in the list) ended after epoch 3 of 5,
    or that reached its epochs, rerun unchanged in a fresh process: fit begins no epoch, the weights stay
    bit-identical, no checkpoint file changes and ckpt.log says so in one line naming the checkpoint and how
    to train on."""
    directory = tmp_path / "job"
    lines, status = server.run(setup, "full", str(directory), str(tmp_path / "first.npz"))
    assert status == 0 and lines[-1] == f"done 0 ran {stopped}", lines
    before = checkpoint_files(directory)
    lines, status = server.run(setup, "resume", str(directory), str(tmp_path / "again.npz"))
    assert status == 0 and lines[-1] == f"done {stopped} ran 0", lines
    a, b = np.load(tmp_path / "first.npz"), np.load(tmp_path / "again.npz")
    assert a.files == b.files and [k for k in a.files if a[k].tobytes() != b[k].tobytes()] == []
    assert checkpoint_files(directory) == before
    where = directory / "ckpts" / "epochs" / f"{stopped:03d}"
    expected = finished_line(where, stopped, "EarlyStopping" if setup == "early_stopping" else None)
    assert_said_once(directory / "ckpt.log", expected, "run is finished")
    assert where.is_dir()
