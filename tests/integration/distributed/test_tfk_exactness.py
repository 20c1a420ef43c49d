"""Issue 26 item 3: a tf_keras job SIGKILLed in the middle of epoch 3 and resumed, in fresh processes.

Without random layers and with ``shuffle=False`` the resumed run is bit-identical; with fit's
default ``shuffle=True`` and a ``Dropout`` layer it cannot be (stateful TF random ops), and the
checkpoint log says so in one warning at the first save, naming both causes and the remedies.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from jobserver import JobServer

pytestmark = pytest.mark.tf_only

WARNING = (
    "WARNING tf_keras model: a resumed run will not be bit-identical to an uninterrupted one: fit(shuffle=True) "
    "shuffles the arrays every epoch; random layers (Dropout) draw new numbers at every step; these draw from "
    "stateful TensorFlow random ops whose state candle_ckpt cannot save for tf_keras (Keras 2) models (the "
    "weights and optimizer state resume exactly); for an exact resume train with Keras 3, whose callback saves "
    "the random and input state, or pass fit(shuffle=False) and use no random layers"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One job server for the module (tf_keras imported once)."""
    srv = JobServer("tfk_job.py", tmp_path_factory.mktemp("tfk") / "server.stderr")
    yield srv
    srv.close()


def _runs(server, tmp_path: Path, setup: str) -> tuple[np.lib.npyio.NpzFile, np.lib.npyio.NpzFile, list[str]]:
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    lines, status = server.run(setup, "full", str(full), str(full) + ".npz")
    assert status == 0 and lines[-1] == "done 0", lines
    lines, status = server.run(setup, "kill", str(resumed), str(resumed) + ".npz")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (lines, status)
    lines, status = server.run(setup, "resume", str(resumed), str(resumed) + ".npz")
    assert status == 0 and lines[-1] == "done 2", lines
    log = (resumed / "ckpt.log").read_text().splitlines()
    return np.load(str(full) + ".npz"), np.load(str(resumed) + ".npz"), log


def test_tf_keras_without_shuffle_or_random_layers_resumes_bit_identical(server, tmp_path):
    """shuffle=False, no Dropout: killed in epoch 3 and resumed after epoch 2, every array equals the
    uninterrupted run's byte for byte, and no warning about exactness is logged."""
    a, b, log = _runs(server, tmp_path, "plain")
    assert a.files == b.files and [k for k in a.files if a[k].tobytes() != b[k].tobytes()] == []
    assert not [line for line in log if "bit-identical" in line]


def test_tf_keras_with_shuffle_and_dropout_says_why_once_per_run(server, tmp_path):
    """fit's default shuffle=True and Dropout: each run of the job logs the warning once, at its first save."""
    _, _, log = _runs(server, tmp_path, "defaults")
    assert [line for line in log if "bit-identical" in line] == [line for line in log if line.endswith(WARNING)]
    assert len([line for line in log if line.endswith(WARNING)]) == 2  # the killed run's and the resumed run's
