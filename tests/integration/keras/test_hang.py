"""Hangs become requeues: a run that makes no progress exits 124 with every stack in ckpt.log, and the rerun is exact.

Real processes (``jobs/hang_job.py``, Keras 3 on JAX): an input pipeline that blocks for good, a save whose
file system stops answering (``LocalFS.hook``), a restore or an opening of the directory on a mount that stopped
answering whole (patched, and a real FUSE mount), and a restore whose checkpoint files never open (then refused).
Each blocked run must exit with ``HANG_EXIT`` within its ``ckpt_hang_timeout`` plus the watchdog's wake-up and a
margin scaled to this machine's speed, name the phase, leave the committed checkpoints as they were, and the
rerun must end bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
from doclines import assert_log_example  # noqa: E402
from locations import REPO  # noqa: E402
from pace import wait_s  # noqa: E402
from pipe_lines import PipeLines  # noqa: E402

from candle_ckpt.engine.watchdog import HANG_EXIT, REPORT_S  # noqa: E402

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parents[1] / "jobs" / "hang_job.py"
FS = JOB.with_name("hang_fs.py")


def _env() -> dict[str, str]:
    # The checkout's candle_ckpt, installed or not (as every job of the suite).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}


def _run(directory: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(JOB), str(directory), str(out), *extra],
        env=_env(), capture_output=True, text=True, timeout=wait_s(120),
    )  # fmt: skip


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, np.ndarray]:
    """The uninterrupted run's final weights and optimizer variables."""
    folder = tmp_path_factory.mktemp("reference")
    done = _run(folder / "ck", folder / "out.npz")
    assert done.returncode == 0, done.stderr[-3000:]
    return _arrays(folder / "out.npz")


def _snapshot(ckpts: Path) -> dict[str, bytes]:
    """Every committed checkpoint's files, by path (the history and the log excluded)."""
    root = ckpts / "ckpts" / "epochs"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _hang(
    tmp_path: Path, block: str, timeout: float | str, directory: Path | None = None, *extra: str
) -> tuple[Path, str, float, str]:
    """Run the job with ``--block block`` (and ``extra``) in ``directory`` (default ``tmp_path/ck``); return that
    directory, its ckpt.log, seconds from 'blocking' to exit and its stderr."""
    directory = directory if directory is not None else tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(directory), str(tmp_path / "x.npz"), "--block", block, "--at", "3",
         "--timeout", str(timeout), *extra],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        blocked = None
        for line in PipeLines(proc.stdout).each(wait_s(180)):  # a job that hangs before blocking fails, bounded
            if line.strip() == "blocking":
                blocked = time.monotonic()
                break
        assert blocked is not None, proc.stderr.read()[-3000:]
        code = proc.wait(timeout=(120.0 if timeout == "auto" else float(timeout)) + wait_s(30))
        took = time.monotonic() - blocked
    finally:
        proc.kill()
        proc.wait()
    err = proc.stderr.read()
    assert code == HANG_EXIT, err[-3000:]
    log = directory / "ckpt.log"
    return directory, log.read_text() if log.exists() else "", took, err


def _timeout() -> float:
    """A short ckpt_hang_timeout that the first step's compile on this machine stays well under."""
    return wait_s(6.0)


def _rerun_is_exact(directory: Path, tmp_path: Path, reference, *extra: str) -> None:
    """A rerun with nothing blocked resumes epoch 2 and ends bit-identical to the uninterrupted run."""
    rerun = _run(directory, tmp_path / "out.npz", *extra)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "start 2" in rerun.stdout
    got = _arrays(tmp_path / "out.npz")
    assert got.keys() == reference.keys()
    for key, value in reference.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def _check(tmp_path: Path, reference, block: str, phase: str) -> None:
    timeout = _timeout()
    directory, log, took, _ = _hang(tmp_path, block, timeout)
    assert took < timeout + min(5.0, timeout / 10) + wait_s(10), (took, timeout)
    assert took >= timeout * 0.9, (took, timeout)
    assert f"in phase {phase}" in log and "exiting with status 124" in log, log[-3000:]
    assert "Thread 0x" in log and "most recent call first" in log, log[-3000:]  # every thread's stack
    records = [json.loads(line) for line in (directory / "ckpts" / "restarts.jsonl").read_text().splitlines()]
    assert any(r["event"] == "failure" and r["error"] == "hang" and r["phase"] == phase for r in records), records
    before = _snapshot(directory)
    assert sorted({name.split(os.sep)[0] for name in before}) == ["001", "002"]  # epoch 3 never committed
    _rerun_is_exact(directory, tmp_path, reference)
    after = _snapshot(directory)
    assert {k: v for k, v in after.items() if k in before} == before  # the committed checkpoints were left alone


def _mount_hang(tmp_path: Path, block: str, phase: str, frame: str, *extra: str) -> str:
    """Run the job with ``--block block`` (a mount that stopped answering, ckpt.log and the history on it): it must
    exit 124 within the limit plus the report's bound (its writes there are given up after REPORT_S), report
    ``phase`` on stderr with ``frame`` in the stack after it; returns that stack."""
    timeout = _timeout()
    _, _, took, err = _hang(tmp_path, block, timeout, None, *extra)
    assert timeout * 0.9 <= took < timeout + REPORT_S + min(5.0, timeout / 10) + wait_s(10), (took, timeout)
    assert f"in phase {phase}" in err, err[-3000:]
    stack = err[err.rindex(f"in phase {phase}") :]
    assert frame in stack, err[-3000:]
    return stack


def test_an_input_pipeline_that_blocks_is_ended_and_the_rerun_is_exact(tmp_path, reference):
    """The PyDataset's batch 3 of epoch 3 never comes: exit 124 within the bound, phase input with every stack in
    ckpt.log, a hang failure in the restart history, epochs 1-2 untouched; the rerun ends bit-identical."""
    _check(tmp_path, reference, "input", "input")


def test_a_save_whose_file_system_stops_answering_is_ended_and_the_rerun_is_exact(tmp_path, reference):
    """The file system stops answering in epoch 3's save: exit 124 within the bound, phase save, nothing of epoch 3
    committed; the rerun (file system answering) ends bit-identical."""
    _check(tmp_path, reference, "save", "save")


def test_a_restore_whose_reads_never_return_is_ended_then_refused_and_the_rerun_is_exact(tmp_path, reference):
    """restart() over epochs 1-2 on a mount that stopped answering whole: exit 124 within the bound plus the
    report's, phase restore on stderr (the restart history's read), nothing recorded; the same mount stopping
    after restart(), before fit: phase open (the writer lock). Then over checkpoint files that no longer open:
    exit 124 within the bound, phase restore with every stack in ckpt.log, a restart record of epochs/002 with its
    hang in the history; a second start the same; the third (ckpt_max_no_progress_restarts=3) is refused at once
    with exit 65 and one line naming epochs/002, before reading anything. The checkpoints are left alone, and the
    rerun (file system back) resumes epoch 2 and ends bit-identical."""
    directory, _, _, _ = _hang(tmp_path, "input", _timeout())  # epochs 1-2 committed, then a hang in epoch 3
    before = _snapshot(directory)
    history = (directory / "ckpts" / "restarts.jsonl").read_bytes()
    timeout = _timeout()
    # First the whole mount hangs: its first read (the restart history's) never returns, and ckpt.log and the
    # history cannot be written: the block reaches stderr only, and nothing is recorded, so it is not counted.
    _mount_hang(tmp_path, "mount", "restore (restart() choosing, verifying or reading", "in read_local")
    assert (directory / "ckpts" / "restarts.jsonl").read_bytes() == history
    # Then restart() reads, but the mount stops answering before fit: fit's opening of the directory (its writer
    # lock) is the watchdog's phase open.
    _mount_hang(tmp_path, "fit-mount", "open (opening the checkpoint directory", "in open_for_write")
    for _ in range(2):
        _, log, took, _ = _hang(tmp_path, "restore", timeout)
        assert timeout * 0.9 <= took < timeout + min(5.0, timeout / 10) + wait_s(10), (took, timeout)
        assert "in phase restore (restart() choosing, verifying or reading" in log, log[-3000:]
        assert "Thread 0x" in log[log.rindex("in phase restore") :], log[-3000:]
    records = [json.loads(line) for line in (directory / "ckpts" / "restarts.jsonl").read_text().splitlines()]
    starts = {r["id"]: r for r in records if r["event"] == "restart"}
    hangs = [r for r in records if r["event"] == "failure" and r["phase"] == "restore"]
    assert len(hangs) == 2 and all(starts[h["restart"]]["resumed"] == "epochs/002" for h in hangs), records
    refused = subprocess.run(
        [sys.executable, str(JOB), str(directory), str(tmp_path / "x.npz"), "--block", "restore",
         "--timeout", str(timeout)],
        env=_env(), capture_output=True, text=True, timeout=wait_s(120),
    )  # fmt: skip
    assert refused.returncode == 65, refused.stderr[-3000:]
    assert "blocking" not in refused.stdout  # refused before anything was read
    line = "restart: refused: reading epochs/002 hung in the last 2 starts in a row"
    (logged,) = [x for x in (directory / "ckpt.log").read_text().splitlines() if line in x]
    assert line in refused.stderr, refused.stderr[-3000:]
    assert_log_example("preemption.rst", logged, "ERROR restart: refused: reading")
    assert _snapshot(directory) == before
    _rerun_is_exact(directory, tmp_path, reference)


def test_uno_s_order_on_a_mount_that_stopped_answering_is_ended_and_the_rerun_is_exact(tmp_path, reference):
    """candle_lib's order, as Uno's (CandleCkptKeras made first, set_model, ckpt.restart(params)): the callback's
    opening of the directory is the job's first access to it; on a mount that stopped answering it ends with 124
    within the bound plus the report's, phase open on stderr; the rerun resumes epoch 2, bit-identical."""
    lib = "--candle-lib"
    directory, _, _, _ = _hang(tmp_path, "input", _timeout(), None, lib)  # epochs 1-2 committed, then a hang
    stack = _mount_hang(tmp_path, "mount", "open (opening the checkpoint directory", "in open_for_write", lib)
    assert "candle_api.py" in stack, stack  # made by CandleCkptKeras
    _rerun_is_exact(directory, tmp_path, reference, lib)


def test_auto_ends_a_hang_at_the_defaults_within_two_minutes(tmp_path):
    """ckpt_hang_timeout=auto (the default) with 6 short steps per epoch: the blocked input pipeline of epoch 3 is
    ended with 124 within 2 minutes (the 60 s floor plus the watchdog's wake-up), not before the floor."""
    directory, log, took, _ = _hang(tmp_path, "input", "auto")
    assert 60.0 <= took < 120.0, took
    assert "in phase input" in log and " s, auto)" in log, log[-3000:]


def _fuse_missing() -> str | None:
    """Why a FUSE file system cannot be mounted here, or None."""
    if not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (a Linux kernel with FUSE)"
    if shutil.which("fusermount") is None and shutil.which("fusermount3") is None:
        return "no fusermount (apt-get install fuse)"
    if ctypes.util.find_library("fuse") is None and ctypes.util.find_library("fuse3") is None:
        return "no libfuse (apt-get install fuse)"
    if importlib.util.find_spec("mfusepy") is None:
        return "no mfusepy (the test extra installs it)"
    return None


@contextlib.contextmanager
def _held_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A real FUSE mount (``jobs/hang_fs.py``) of ``tmp_path/back`` at ``tmp_path/mnt``, whose every request is held
    while the yielded gate file exists; unmounted after. Skips, saying why, where FUSE cannot mount."""
    missing = _fuse_missing()
    if missing is not None:
        pytest.skip(f"a real FUSE mount is needed: {missing}")
    back, mount, gate = tmp_path / "back", tmp_path / "mnt", tmp_path / "gate"
    back.mkdir()
    mount.mkdir()
    with open(tmp_path / "fs.log", "w") as log:
        server = subprocess.Popen([sys.executable, str(FS), str(back), str(mount), str(gate)], stdout=log, stderr=log)
    try:
        until = time.monotonic() + wait_s(30)
        while not os.path.ismount(mount):
            if server.poll() is not None or time.monotonic() > until:
                said = (tmp_path / "fs.log").read_text()[-500:]
                pytest.skip(f"a real FUSE mount is needed: it did not mount: {said}")
            time.sleep(0.1)
        yield mount, gate
    finally:
        gate.unlink(missing_ok=True)  # held requests go through, so that every process can end
        tool = shutil.which("fusermount") or shutil.which("fusermount3") or "fusermount"
        with contextlib.suppress(subprocess.TimeoutExpired):
            if subprocess.run([tool, "-u", str(mount)], capture_output=True, timeout=wait_s(30)).returncode:
                subprocess.run([tool, "-u", "-z", str(mount)], capture_output=True, timeout=wait_s(30))
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=wait_s(30))
        server.kill()
        server.wait()


def test_a_restore_on_a_real_mount_that_stops_answering_ends_with_124_and_the_rerun_is_exact(tmp_path, reference):
    """A real FUSE mount holds epochs 1-2, then stops answering: restart()'s first read waits in the kernel. The
    watchdog reports phase restore on stderr within the limit (after 'restarting', plus its wake-up and a margin);
    the process ends with 124 as soon as the kernel lets it (for FUSE, once the mount answers again: not even
    SIGKILL ends a process whose request is unanswered), and the rerun resumes epoch 2, bit-identical."""
    with _held_mount(tmp_path) as (mount, gate):
        directory, _, _, _ = _hang(tmp_path, "input", _timeout(), directory=mount / "ck")  # epochs 1-2, then 124
        timeout = _timeout()
        gate.touch()  # the server stops answering
        proc = subprocess.Popen(
            [sys.executable, str(JOB), str(directory), str(tmp_path / "x.npz"), "--timeout", str(timeout)],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = PipeLines(proc.stdout), PipeLines(proc.stderr)
            assert out.next(wait_s(120)) == "restarting"
            restarting = time.monotonic()
            until, report = restarting + timeout + min(5.0, timeout / 10) + wait_s(15), None
            while report is None and time.monotonic() < until:
                line = err.next(max(0.0, until - time.monotonic()))
                report = line if line is not None and "ERROR hang:" in line else None
            took = time.monotonic() - restarting
            assert report is not None, f"no hang reported within {until - restarting:.0f} s of restart()"
            assert timeout * 0.9 <= took, (took, timeout)
            assert "in phase restore (restart() choosing, verifying or reading" in report, report
            gate.unlink()  # the mount answers again: the process, exiting since the report, can end now
            code = proc.wait(timeout=wait_s(30))
        finally:
            gate.unlink(missing_ok=True)
            proc.kill()
            proc.wait()
        assert code == HANG_EXIT
        _rerun_is_exact(directory, tmp_path, reference)
