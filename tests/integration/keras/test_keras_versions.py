"""Keras releases: the supported range is one fact, and a checkpoint from before a format change says so.

``.ci/run`` runs the tripwire tests, an exact kill -9 resume, the Quickstart and
the ``.keras`` format tests again on the oldest supported Keras and on
keras-nightly, each in its own virtual environment; it sets
``CANDLE_CKPT_OLD_KERAS_PYTHON`` to the oldest one's interpreter for the
cross-version test here.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

import configparser  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import pytest  # noqa: E402
from locations import JOBS, REPO  # noqa: E402
from testkit import make_params  # noqa: E402

import candle_ckpt as candle  # noqa: E402
from candle_ckpt.core.errors import ModelMismatch  # noqa: E402
from candle_ckpt.keras import internals  # noqa: E402


def test_setup_cfg_range_is_what_ci_runs_and_holds_this_keras() -> None:
    """setup.cfg's keras range is the gateway's SUPPORTED, .ci/run installs its oldest and the nightly of its
    newest, and the Keras running this test is inside it."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    (keras_req,) = [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip().startswith("keras")]
    (low_major, low_minor), (high_major, high_minor) = internals.SUPPORTED
    assert keras_req == f"keras>={low_major}.{low_minor},<{high_major}.{high_minor + 1}"
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(rf"keras=={low_major}\.{low_minor}\.\d+", ci), "CI does not run the oldest supported Keras"
    assert re.search(rf"keras-nightly=={high_major}\.{high_minor}\.0\.dev\d+", ci), "CI does not run the nightly"
    running = tuple(int(p) for p in keras.__version__.split(".")[:2])
    assert internals.SUPPORTED[0] <= running <= internals.SUPPORTED[1], keras.__version__


def test_format_change_names_the_container_groups() -> None:
    """A file from before Keras 3.15 read by 3.15 or later is named as such; the same release or junk is not."""
    running = tuple(int(p) for p in keras.__version__.split(".")[:2])
    note = internals.format_change("3.14.1")
    assert (note is not None and "'container*' groups" in note) == (running >= (3, 15))
    assert internals.format_change(keras.__version__) is None
    assert internals.format_change("3.16.0.dev2026102704") is None
    assert internals.format_change(None) is None and internals.format_change("tf_keras 2.21") is None


def test_a_keras_outside_the_range_is_named() -> None:
    """A Keras before or past the supported range gets a warning naming the range; those inside it none."""
    assert internals.unsupported(keras.__version__) is None
    for inside in ("3.13.0", "3.14.1", "3.15.1", "3.16.0.dev2026102704", "3.16.2"):
        assert internals.unsupported(inside) is None, inside
    for outside in ("3.12.4", "3.17.0", "4.0.0"):
        note = internals.unsupported(outside)
        assert note is not None and f"this is Keras {outside}" in note and "'keras>=3.13,<3.17'" in note, note


NESTED_JOB = JOBS / "nested_container_job.py"


@pytest.mark.skipif(
    not os.environ.get("CANDLE_CKPT_OLD_KERAS_PYTHON"),
    reason="needs a Keras before 3.15 beside this one: .ci/run's oldest-Keras pass sets CANDLE_CKPT_OLD_KERAS_PYTHON",
)
def test_a_checkpoint_from_before_the_container_change_names_both_versions(tmp_path: Path) -> None:
    """A checkpoint of a model with layers nested in lists, written by an older Keras, is refused by restart()
    with both versions and the format change named, and the model is left as it was."""
    old_python = os.environ["CANDLE_CKPT_OLD_KERAS_PYTHON"]
    params = make_params(tmp_path, epochs=1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(JOBS)])}
    done = subprocess.run(
        [old_python, str(NESTED_JOB), params["ckpt_directory"]], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    old_version = done.stdout.split()[-1]
    if internals.format_change(old_version) is None:
        pytest.fail(f"{old_python} runs Keras {old_version}, not a release before the container change")
    sys.path.insert(0, str(JOBS))
    from nested_container_job import build

    model = build()
    before = [keras.ops.convert_to_numpy(v).copy() for v in model.variables]
    with pytest.raises(ModelMismatch) as caught:
        candle.restart({**params, "ckpt_restart_mode": "required"}, model, logger=None, verbose=False)
    message = str(caught.value)
    assert f"written by Keras {old_version} and this is Keras {keras.__version__}" in message
    assert "'container*' groups" in message and f"pip install keras=={old_version}" in message
    after = [keras.ops.convert_to_numpy(v) for v in model.variables]
    assert all((a == b).all() for a, b in zip(before, after, strict=True)), "the model was changed"
