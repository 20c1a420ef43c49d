"""Issue 11: a resumed run ends bit-identical to an uninterrupted one, however the job is written.

Each setup of ``exact_job.py`` runs three ways in fresh processes (forked by
one server that imported TensorFlow once): uninterrupted; killed with SIGKILL
in the middle of epoch 3; resumed with ``restart()`` + ``fit``. The final
weights and optimizer variables must be bit-identical, the ``best`` sidecars
must agree, and the resumed run's checkpoints must record where it resumed
from (and keep that checkpoint).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import importlib.util  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from doclines import assert_log_example  # noqa: E402
from jobserver import JobServer  # noqa: E402
from locations import FIGURES, job_script  # noqa: E402
from testkit import assert_said_once, finished_line  # noqa: E402

_spec = importlib.util.spec_from_file_location("exact_job", job_script("exact_job.py"))
job = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(job)

SETUPS = [
    "arrays_shuffle",
    "tfdata_reshuffle",
    "tfdata_repeat",
    "tfdata_map_parallel",
    "pydataset_np",
    "pydataset_inplace",
    "pydataset_shuffle_inplace",
    "pydataset_workers",
    "pydataset_endless",
    "pydataset_endless_workers",
    "reduce_lr_after",
    "reduce_lr_before",
    "early_stopping",
    "lr_scheduler",
    "restart_before_compile",
    "callback_before_restart",
    "sample_weights",
    "validation_freq",
    "class_weight",
    "ema",
    "grad_accum",
    "cosine_decay",
    "mixed_float16",
    "vae",
    "gan",
    "steps_per_execution",
    "no_initial_epoch",
]
# Every setup at the defaults (ckpt_async=auto: asynchronous); these four also with ckpt_async=false.
SYNC_SETUPS = ["tfdata_reshuffle", "reduce_lr_after", "early_stopping", "restart_before_compile"]
CASES = [(s, None) for s in SETUPS] + [(s, False) for s in SYNC_SETUPS]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One job server for the module (TensorFlow imported once)."""
    srv = JobServer("exact_job.py", tmp_path_factory.mktemp("exact") / "server.stderr")
    yield srv
    srv.close()


def _sidecar(directory: Path, name: str) -> dict:
    return json.loads((directory / "ckpts" / name / "ckpt-info.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("setup", "use_async"), CASES, ids=[f"{s}{'-sync' if a is False else ''}" for s, a in CASES])
def test_killed_and_resumed_run_is_bit_identical(server, tmp_path, setup, use_async):
    """Uninterrupted vs killed mid-epoch 3 and resumed: same final weights and optimizer variables,
    the same best checkpoint, and the resumed run records and keeps the checkpoint it resumed from."""
    mode = ["sync"] if use_async is False else []
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    lines, status = server.run(setup, "full", str(full), str(full) + ".npz", *mode)
    assert status == 0 and lines[-1].startswith("done 0"), lines
    lines, status = server.run(setup, "kill", str(resumed), str(resumed) + ".npz", *mode)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (lines, status)
    lines, status = server.run(setup, "resume", str(resumed), str(resumed) + ".npz", *mode)
    assert status == 0, lines
    start = int(lines[0].split()[1])
    assert 1 <= start < job.KILL_AT, f"the resumed run started at epoch {start}"
    a, b = np.load(str(full) + ".npz"), np.load(str(resumed) + ".npz")
    assert a.files == b.files and any(k.startswith("opt") for k in a.files)
    differ = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
    assert differ == [], f"{setup}: resumed != uninterrupted in {differ}"
    best_a, best_b = _sidecar(full, "best"), _sidecar(resumed, "best")
    assert (best_a["epoch"], best_a["best_metric_last"]) == (best_b["epoch"], best_b["best_metric_last"])
    last = _sidecar(resumed, "last")
    assert last["resumed_from"] == start
    assert (resumed / "ckpts" / "epochs" / f"{start:03d}").is_dir(), "the checkpoint resumed from was pruned"
    _figure(
        f"{setup}{'-sync' if use_async is False else ''}", {"resumed_from": start, "variables_compared": len(a.files)}
    )


def _figure(key: str, value) -> None:
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / "exact_resume.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def test_job_server_reports_a_crashed_child(server, tmp_path):
    """A job that fails (its ckpt_directory is under a regular file) is reported as failed, not hidden."""
    bad = tmp_path / "file"
    bad.write_text("x")
    lines, status = server.run("arrays_shuffle", "full", str(bad / "sub"), str(tmp_path / "o.npz"))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1, (lines, status)


@pytest.mark.parametrize(("setup", "stopped"), [("early_stopping", 4), ("arrays_shuffle", 5)])
def test_a_finished_run_rerun_trains_nothing(server, tmp_path, setup, stopped):
    """A run that EarlyStopping ended (after epoch 4 of 5), or that reached its epochs, rerun unchanged in a fresh
    process: fit trains no epoch, the weights stay bit-identical and ckpt.log says so in one line naming the
    checkpoint (which exists) and how to train on, as docs/exactness.rst shows it. Also the tripwire of
    fit_hooks.set_first_epoch."""
    directory = tmp_path / "job"
    lines, status = server.run(setup, "full", str(directory), str(tmp_path / "first.npz"))
    assert status == 0 and lines[-1] == f"done 0 {stopped}", lines
    lines, status = server.run(setup, "resume", str(directory), str(tmp_path / "again.npz"))
    assert status == 0 and lines[-1] == f"done {stopped} 0", lines  # restored epoch `stopped`, ran no epoch
    a, b = np.load(tmp_path / "first.npz"), np.load(tmp_path / "again.npz")
    assert [k for k in a.files if a[k].tobytes() != b[k].tobytes()] == []
    where = directory / "ckpts" / "epochs" / f"{stopped:03d}"
    expected = finished_line(where, stopped, "EarlyStopping" if setup == "early_stopping" else None)
    assert_said_once(directory / "ckpt.log", expected, "run is finished", "no epoch")
    assert where.is_dir()
    if setup == "early_stopping":
        log = (directory / "ckpt.log").read_text().splitlines()
        said = next(line for line in log if line.endswith(expected))
        assert_log_example("exactness.rst", said, "WARNING the run is finished")
