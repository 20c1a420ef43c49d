"""Issue 16: a preempted job saves at the next step and resumes mid-epoch, bit-identical to an uninterrupted run.

Every job runs in a fresh process forked by ``preempt_job.py``'s server. The
test sends the signal itself (SIGTERM or SIGUSR1) while the job waits at a
chosen batch end, so the callback sees it at exactly that step; the rerun
calls ``restart()`` and ``fit`` as the first run did, and its final weights
and optimizer variables must equal those of the uninterrupted run byte for byte.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jobserver import JobServer  # noqa: E402
from locations import FIGURES  # noqa: E402
from pace import wait_s  # noqa: E402

CODE = 42  # the ckpt_preempt_exit_code the jobs use


class Server(JobServer):
    """``preempt_job.py``, whose jobs can be sent a signal at their ``at <pid>`` line."""

    def run(self, *words: str, send: int | None = None, silence_s: float | None = None) -> tuple[list[str], int]:
        """Run one job; at its ``at <pid>`` line send it ``send``, then let it go on. Return its lines and status."""

        def on_line(got: str) -> None:
            if got.startswith("at ") and send is not None:
                os.kill(int(got.split()[1]), send)
                Path(words[2] + ".go").touch()

        return super().run(*words, on_line=on_line, silence_s=silence_s)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server("preempt_job.py", tmp_path_factory.mktemp("preempt") / "server.stderr")
    yield srv
    srv.close()


_FULL: dict[str, Path] = {}


def full_run(server: Server, setup: str, tmp_path_factory) -> Path:
    """The uninterrupted run of ``setup`` (once per module)."""
    if setup not in _FULL:
        directory = tmp_path_factory.mktemp(f"full-{setup}") / "job"
        lines, status = server.run(setup, "full", str(directory), str(directory) + ".npz")
        assert status == 0 and lines[-1].startswith("done 0"), lines
        _FULL[setup] = Path(str(directory) + ".npz")
    return _FULL[setup]


def assert_identical(a_path: Path, b_path: Path) -> int:
    a, b = np.load(a_path), np.load(b_path)
    assert a.files == b.files and any(k.startswith("opt") for k in a.files)
    differ = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
    assert differ == [], f"resumed != uninterrupted in {differ}"
    return len(a.files)


def step_sidecars(directory: Path) -> list[dict]:
    steps = directory / "ckpts" / "steps"
    return [json.loads((d / "ckpt-info.json").read_text()) for d in sorted(steps.iterdir())] if steps.is_dir() else []


def commit_time(directory: Path) -> float:
    """The signal-to-commit seconds that the job logged."""
    found = re.findall(r"([0-9.]+) s after the request", (directory / "ckpt.log").read_text())
    assert found, (directory / "ckpt.log").read_text()
    return float(found[-1])


def resume_times(directory: Path) -> dict[str, float]:
    """What the rerun logged: restart()'s read+verify and load seconds, and the skip of the done steps."""
    text = (directory / "ckpt.log").read_text()
    verify, load = re.findall(r"read and verified in ([0-9.]+) s, loaded in ([0-9.]+) s", text)[-1]
    count, word, skip = re.findall(r"restart: skipped ([0-9]+) (steps?) of epoch .* in ([0-9.]+) s", text)[-1]
    assert (count == "1") == (word == "step"), text  # "skipped 1 step", never "the 1 steps" (issue 40 item 6)
    return {"restart_verify_s": float(verify), "restart_load_s": float(load), "skip_s": float(skip)}


def figure(key: str, value) -> None:
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / "preemption.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


CASES = [  # setup, signal, at (epoch.batch), extra options
    ("arrays_shuffle", signal.SIGTERM, "3.1", []),
    ("arrays_shuffle", signal.SIGUSR1, "1.2", []),
    ("arrays_noshuffle", signal.SIGTERM, "2.0", []),
    ("tfdata_reshuffle", signal.SIGUSR1, "3.2", []),
    ("tfdata_repeat", signal.SIGTERM, "2.1", []),
    ("pydataset_np", signal.SIGTERM, "3.1", []),
    ("pydataset_inplace", signal.SIGUSR1, "2.2", []),
    ("arrays_shuffle", signal.SIGTERM, "2.0", ["async", "slowfs=1.0"]),
    ("lr_scheduler", signal.SIGTERM, "3.1", []),
    ("reduce_lr_before", signal.SIGUSR1, "3.2", []),
    ("ema", signal.SIGTERM, "3.1", []),  # fit's end replaces the weights by their average after the save
    ("grad_accum", signal.SIGTERM, "2.0", []),  # step 5 of accumulation 3: a partial sum in the step checkpoint
    ("mixed_float16", signal.SIGUSR1, "2.2", []),
    ("vae", signal.SIGTERM, "3.1", []),  # a train_step of its own, no call: model.built stays False
    ("gan", signal.SIGTERM, "2.2", []),  # two optimizers of its own, built by Keras inside the first step
    ("steps_per_execution", signal.SIGTERM, "3.1", []),  # batch 1 ends the first call of 2 steps
]


def case_id(setup: str, sig: signal.Signals, at: str, extra: list[str]) -> str:
    return f"{setup}-{sig.name}-{at}{'-async' if 'async' in extra else ''}"


@pytest.mark.slow
@pytest.mark.tf_only
@pytest.mark.parametrize(
    ("setup", "sig", "at", "extra"),
    CASES,
    ids=[f"{c[0]}-{c[1].name}-{c[2]}{'-async' * ('async' in c[3])}" for c in CASES],
)
def test_signal_saves_the_step_and_the_rerun_is_bit_identical(
    server, tmp_path, tmp_path_factory, setup, sig, at, extra
):
    """A signal at a batch end commits a step checkpoint of exactly that step, the job exits with
    ckpt_preempt_exit_code, and restart() + fit end bit-identical to the uninterrupted run."""
    full = full_run(server, setup, tmp_path_factory)
    directory = tmp_path / "job"
    out = str(directory) + ".npz"
    lines, status = server.run(setup, "signal", str(directory), out, f"at={at}", f"code={CODE}", *extra, send=sig)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CODE, (lines, status)
    epoch, batch = (int(v) for v in at.split("."))
    if "async" in extra:
        assert [ln for ln in lines if ln.startswith("at ")][0].endswith(" 1"), "no async write was in flight"
    (side,) = step_sidecars(directory)
    assert (side["epoch"], side["step"], side["reason"]) == (epoch - 1, batch + 1, sig.name)
    seconds = commit_time(directory)
    lines, status = server.run(setup, "resume", str(directory), out, f"code={CODE}", *extra)
    assert status == 0, lines
    assert lines[0] == f"start {epoch - 1} {batch + 1}", lines
    compared = assert_identical(full, Path(out))
    whole = json.loads(Path(str(full) + ".loss.json").read_text())
    resumed = json.loads(Path(out + ".loss.json").read_text())
    assert resumed == {k: whole[k] for k in resumed}, "the epochs' logged losses differ (metrics not resumed)"
    assert str(epoch - 1) in resumed
    assert step_sidecars(directory) == [], "the next epoch commit did not supersede the step checkpoint"
    times = resume_times(directory)
    figure(case_id(setup, sig, at, extra), {"signal_to_commit_s": seconds, "variables_compared": compared, **times})


@pytest.mark.tf_only
def test_signal_with_the_defaults_commits_then_ends_the_process_with_143(server, tmp_path):
    """With the defaults, SIGTERM in the middle of an epoch commits a step checkpoint and the process ends with
    143 (128 + 15, what SIGTERM itself gives): the script does not go on as if training had completed."""
    directory = tmp_path / "job"
    lines, status = server.run("arrays_shuffle", "signal", str(directory), str(directory) + ".npz", "at=2.1",
                               send=signal.SIGTERM)  # fmt: skip
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143, (lines, status)
    assert not any(line.startswith("done") for line in lines), lines
    assert [(s["epoch"], s["step"]) for s in step_sidecars(directory)] == [(1, 2)]
    log = (directory / "ckpt.log").read_text()
    assert "SIGTERM: committed " in log and "exiting with status 143" in log


@pytest.mark.tf_only
def test_signal_with_return_stops_fit_and_the_job_goes_on(server, tmp_path, tmp_path_factory):
    """With ckpt_preempt_exit_code=return, fit returns after the step checkpoint (stop_training); no epoch
    checkpoint is made of the partial epoch, and stats()["preempt"] records the save."""
    directory = tmp_path / "job"
    lines, status = server.run("arrays_shuffle", "signal", str(directory), str(directory) + ".npz", "at=2.1",
                               "code=return", send=signal.SIGTERM)  # fmt: skip
    assert status == 0, lines
    assert lines[-1].startswith("done 0 2 {") and "'step': 2" in lines[-1], lines
    assert sorted(p.name for p in (directory / "ckpts" / "epochs").iterdir()) == ["001"]
    assert [(s["epoch"], s["step"]) for s in step_sidecars(directory)] == [(1, 2)]


@pytest.mark.tf_only
def test_signal_between_restart_and_fit_is_saved_after_the_first_step(server, tmp_path, tmp_path_factory):
    """A SIGTERM after restart() and before fit (no callback yet) does not kill the job: restart() caught it,
    fit commits a step checkpoint after its first step and exits with the code, and the rerun is bit-identical."""
    full = full_run(server, "arrays_shuffle", tmp_path_factory)
    directory = tmp_path / "job"
    out = str(directory) + ".npz"
    lines, status = server.run("arrays_shuffle", "early", str(directory), out, f"code={CODE}", send=signal.SIGTERM)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CODE, (lines, status)
    assert [(s["epoch"], s["step"], s["reason"]) for s in step_sidecars(directory)] == [(0, 1, "SIGTERM")]
    log = (directory / "ckpt.log").read_text()
    assert re.search(r"SIGTERM came [0-9.]+ s ago, after restart\(\) and before fit began", log), log
    lines, status = server.run("arrays_shuffle", "resume", str(directory), out, f"code={CODE}")
    assert status == 0 and lines[0] == "start 0 1", lines
    assert_identical(full, Path(out))


@pytest.mark.tf_only
def test_a_resume_with_another_batch_size_skips_the_samples_done_and_says_so(server, tmp_path):
    """SIGTERM after step 2 of epoch 2 (4 steps of 16), then the job rerun with batch_size=32, as after running out of
    memory on another node: the resumed epoch skips 1 step of 32, the 32 samples done, and trains its last step (the
    2 steps done, skipped as steps, were the whole epoch: it trained nothing and its logs had no loss). One line says
    so, and that the run is not bit-identical."""
    directory = tmp_path / "job"
    out = str(directory) + ".npz"
    lines, status = server.run("arrays_shuffle", "signal", str(directory), out, "at=2.1", send=signal.SIGTERM)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143, (lines, status)
    assert [(s["epoch"], s["step"]) for s in step_sidecars(directory)] == [(1, 2)]
    lines, status = server.run("arrays_shuffle", "resume", str(directory), out, "batch=32")
    assert status == 0 and lines[0] == "start 1 2", lines
    log = (directory / "ckpt.log").read_text()
    assert (
        "restart: the checkpoint was taken at epoch 2, step 2 of 4 steps of batch size 16, but this fit's epoch has 2 "
        "steps of batch size 32: 1 step skipped, the 32 samples done before. The run is not bit-identical" in log
    ), log
    assert "restart: skipped 1 step of epoch 2 done before the checkpoint" in log, log
    iterations = [v for k, v in np.load(out).items() if k.startswith("opt") and v.dtype.kind == "i" and v.ndim == 0]
    assert [int(v) for v in iterations] == [4 + 2 + 1 + 2 * 3], iterations  # epoch 1, 2 done, 1 left, epochs 3-5
    losses = json.loads(Path(out + ".loss.json").read_text())
    assert sorted(losses) == ["1", "2", "3", "4"] and all(np.isfinite(v) for v in losses.values()), losses


@pytest.fixture(scope="module")
def jax_server(tmp_path_factory):
    stderr = tmp_path_factory.mktemp("preempt-jax") / "server.stderr"
    srv = Server("preempt_job.py", stderr, env={"KERAS_BACKEND": "jax"})
    yield srv
    srv.close()


@pytest.mark.tf_only
@pytest.mark.parametrize(
    ("backend", "setup"),
    [
        ("tensorflow", "validation"),
        ("tensorflow", "validation_reduce_lr"),
        pytest.param("jax", "validation_reduce_lr", marks=pytest.mark.needs_package("jax")),
    ],
)
def test_a_signal_during_validation_saves_the_step_before_the_last_at_once_and_the_rerun_is_bit_identical(
    request, tmp_path, backend, setup
):
    """SIGTERM at batch 3 of 8 of epoch 1's validation (0.3 s a batch: a slow one): the state held before the epoch's
    last step is committed at that batch as the step checkpoint of step 3 of 4, and the job exits, running none of
    the validation's other batches. Before, the request waited for the validation's end and the epoch's checkpoint:
    a validation longer than the scheduler's grace lost the epoch. The rerun trains step 4 again, validates, and
    ends bit-identical, with every epoch's loss and val_loss as uninterrupted (``validation_reduce_lr``: a
    ReduceLROnPlateau on val_loss, after ours, lowers the rate at every epoch end, once). On JAX too, whose fit keeps
    the state outside the variables until the epoch's end. (A run's first epoch always holds the copy; later ones
    when the window before was long: the test with return below.)"""
    server = request.getfixturevalue("server" if backend == "tensorflow" else "jax_server")
    full = tmp_path / "full"
    lines, status = server.run(setup, "full", str(full), f"{full}.npz")
    assert status == 0 and lines[-1].startswith("done 0"), lines
    full = Path(f"{full}.npz")
    directory = tmp_path / "job"
    out = str(directory) + ".npz"
    lines, status = server.run(setup, "signal", str(directory), out, "val=1.2", "valsleep=0.3", f"code={CODE}",
                               send=signal.SIGTERM)  # fmt: skip
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CODE, (lines, status)
    assert [line.split()[1] for line in lines if line.startswith("val ")] == ["1.0", "1.1", "1.2"], lines
    assert [(s["epoch"], s["step"], s["reason"]) for s in step_sidecars(directory)] == [(0, 3, "SIGTERM")]
    assert not (directory / "ckpts" / "epochs").exists() or not any((directory / "ckpts" / "epochs").iterdir())
    log = (directory / "ckpt.log").read_text()
    assert "SIGTERM came during fit's validation of epoch 1: saving the state held before its last step" in log, log
    seconds = commit_time(directory)
    lines, status = server.run(setup, "resume", str(directory), out, f"code={CODE}")
    assert status == 0 and lines[0] == "start 0 3", lines
    assert_identical(full, Path(out))
    for kind in ("loss", "val"):
        whole = json.loads(Path(f"{full}.{kind}.json").read_text())
        resumed = json.loads(Path(f"{out}.{kind}.json").read_text())
        assert sorted(resumed) == ["0", "1", "2", "3", "4"] and resumed == whole, kind
    figure(f"{backend}-{setup}-SIGTERM-during-validation", {"signal_to_commit_s": seconds, **resume_times(directory)})


@pytest.mark.tf_only
def test_a_signal_during_validation_with_return_ends_the_validation_and_fit_returns(server, tmp_path):
    """With ckpt_preempt_exit_code=return, a SIGTERM during epoch 2's validation (0.7 s a batch: epoch 1's took 5.6 s,
    over the 5 s from which the copy is held in the epochs after a run's first) commits the held step checkpoint, the
    validation ends at that batch (stop_evaluating) and fit returns after the epoch: no epoch checkpoint is made of
    an epoch whose checkpoint is the step before its last."""
    directory = tmp_path / "job"
    lines, status = server.run("validation", "signal", str(directory), str(directory) + ".npz", "val=2.2",
                               "valsleep=0.7", "code=return", send=signal.SIGTERM)  # fmt: skip
    assert status == 0, lines
    assert [line.split()[1] for line in lines if line.startswith("val ")][-1] == "2.2", lines
    assert lines[-1].startswith("done 0 2 {") and "'step': 3" in lines[-1], lines
    assert sorted(p.name for p in (directory / "ckpts" / "epochs").iterdir()) == ["001"]
    assert [(s["epoch"], s["step"]) for s in step_sidecars(directory)] == [(1, 3)]


@pytest.mark.tf_only
def test_signal_at_the_last_step_saves_the_epoch(server, tmp_path):
    """A signal after the epoch's last step is answered by that epoch's checkpoint (no step checkpoint)."""
    directory = tmp_path / "job"
    lines, status = server.run("arrays_shuffle", "signal", str(directory), str(directory) + ".npz", "at=2.3",
                               f"code={CODE}", send=signal.SIGTERM)  # fmt: skip
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CODE, (lines, status)
    assert sorted(p.name for p in (directory / "ckpts" / "epochs").iterdir()) == ["001", "002"]
    assert step_sidecars(directory) == []
    assert "committed" in (directory / "ckpt.log").read_text().split("SIGTERM:")[-1]


@pytest.mark.slow
@pytest.mark.tf_only
def test_sigkill_between_step_checkpoints_resumes_from_the_newest(server, tmp_path, tmp_path_factory):
    """ckpt_save_steps=2: SIGKILL after step 3 of epoch 3 resumes from the step-2 checkpoint, exactly."""
    full = full_run(server, "arrays_shuffle", tmp_path_factory)
    directory = tmp_path / "job"
    out = str(directory) + ".npz"
    lines, status = server.run("arrays_shuffle", "kill", str(directory), out, "at=3.2", "steps=2")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (lines, status)
    assert [(s["epoch"], s["step"], s["reason"]) for s in step_sidecars(directory)] == [(2, 2, "steps")]
    lines, status = server.run("arrays_shuffle", "resume", str(directory), out, "steps=2")
    assert status == 0 and lines[0] == "start 2 2", lines
    assert_identical(full, Path(out))


@pytest.mark.tf_only
def test_deadline_saves_and_exits_in_time(server, tmp_path):
    """ckpt_deadline=+4 with a 1 s margin: the job, far from done, commits a step checkpoint and exits with
    ckpt_preempt_exit_code before the deadline passes."""
    directory = tmp_path / "job"
    lines, status = server.run("arrays_shuffle", "deadline", str(directory), str(directory) + ".npz",
                               "deadline=+4", "margin=1", "sleep=0.1", f"code={CODE}")  # fmt: skip
    ended = time.time()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CODE, (lines, status)
    deadline = float(next(ln for ln in lines if ln.startswith("deadline ")).split()[1])
    sides = step_sidecars(directory)
    epochs = list((directory / "ckpts" / "epochs").iterdir())
    assert sides or epochs, "nothing was saved"
    assert not sides or sides[0]["reason"] == "deadline"
    assert ended <= deadline, f"the job ended {ended - deadline:.2f} s after its deadline"
    figure("deadline", {"ended_before_deadline_s": round(deadline - ended, 3)})


@pytest.mark.tf_only
def test_a_job_that_hangs_fails_alone_and_the_next_job_gets_its_own_reply(server, tmp_path):
    """A job that never ends (it waits at its batch for a signal that never comes) is killed after its silence
    and fails; the next job on the same server gets its own lines and status, nothing of the killed one's."""
    hung = tmp_path / "hung"
    with pytest.raises(pytest.fail.Exception, match="said nothing for"):
        server.run("arrays_shuffle", "signal", str(hung), str(hung) + ".npz", "at=1.1", silence_s=wait_s(3))
    (tmp_path / "hung.go").touch()  # too late: the job was killed, and any line it left is dropped
    directory = tmp_path / "job"
    lines, status = server.run("arrays_shuffle", "signal", str(directory), str(directory) + ".npz", "at=1.1",
                               "code=return", send=signal.SIGUSR1)  # fmt: skip
    assert status == 0, lines
    assert lines[0] == "start 0 None" and lines[-1].startswith("done 0 1 {"), lines
