"""Typos and bad flags are caught the way a user meets them (issue 27, item 2)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import ENV, README, blocks, run

import candle_ckpt as candle
from candle_ckpt.config import params as params_module


def test_a_typo_in_a_ckpt_key_gets_one_warning_naming_the_closest_key(tmp_path: Path, caplog) -> None:
    """The dict of the report (ckpt_save_intervall, ckpt_keep_limt) through restart(), the callback and fit:
    one warning per unknown key, each naming the key meant; the known keys work as before."""
    import keras
    import numpy as np

    params_module._warn_unknown.cache_clear()
    params_module.take_unreported()  # what an earlier test's dicts left queued in this process is not this test's
    g = {"epochs": 2, "ckpt_directory": str(tmp_path), "ckpt_save_best_metric": "loss"}
    g.update(ckpt_save_intervall=2, ckpt_keep_limt=1)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with caplog.at_level(logging.WARNING, logger="candle_ckpt"):
        candle.restart(g, model, verbose=False)
        ckpt = candle.CandleCheckpointCallback(g, verbose=False)
        model.fit(np.zeros((8, 2)), np.zeros((8, 1)), epochs=2, verbose=0, callbacks=[ckpt])
    unknown = [r.getMessage() for r in caplog.records if "unknown parameter" in r.getMessage()]
    assert unknown == [
        "unknown parameter ckpt_save_intervall is ignored; did you mean ckpt_save_interval?",
        "unknown parameter ckpt_keep_limt is ignored; did you mean ckpt_keep_limit?",
    ]
    assert sorted(p.name for p in (tmp_path / "ckpts" / "epochs").iterdir()) == ["001", "002"]


def test_the_unknown_key_warning_is_a_timestamped_line_on_the_console_and_in_ckpt_log(tmp_path: Path) -> None:
    """Issue 40 item 5: the Quickstart with a misspelled key in its dict prints the warning once, with the timestamp
    and 'candle_ckpt WARNING' of every other line (it was printed bare), and ckpt.log holds it once."""
    (code,) = [b.astext() for b in blocks(README, "python")]
    line = "gParameters = vars(parser.parse_args())\n"
    assert line in code
    code = code.replace(line, line + 'gParameters["ckpt_save_intervall"] = 2\n')
    (tmp_path / "quickstart.py").write_text(code)
    proc = run(["python3", "quickstart.py", "--epochs", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = "unknown parameter ckpt_save_intervall is ignored; did you mean ckpt_save_interval?"
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    console = [s for s in proc.stderr.splitlines() if "unknown parameter" in s]
    assert len(console) == 1 and re.fullmatch(rf"{stamp},\d{{3}} candle_ckpt WARNING: {re.escape(text)}", console[0])
    log = [s for s in (tmp_path / "save" / "ckpt.log").read_text().splitlines() if "unknown parameter" in s]
    assert len(log) == 1 and re.fullmatch(rf"{stamp} WARNING {re.escape(text)}", log[0]), log


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--ckpt_keep_limit", "0"], "argument --ckpt_keep_limit: ckpt_keep_limit must be an integer > 0; got 0"),
        (
            ["--ckpt_preempt_signals", "SIGFOO"],
            "argument --ckpt_preempt_signals: ckpt_preempt_signals: 'SIGFOO' is not a signal name on this platform",
        ),
    ],
)
def test_an_out_of_range_flag_is_a_one_line_argparse_error_with_status_2(tmp_path: Path, flags, error) -> None:
    """The README's Quickstart with a bad --ckpt_* flag: exit status 2 and argparse's one error line naming the
    flag and what is allowed, no traceback, nothing trained."""
    (code,) = [b.astext() for b in blocks(README, "python")]
    (tmp_path / "quickstart.py").write_text(code)
    proc = run(["python3", "quickstart.py", *flags], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith(f"quickstart.py: error: {error}"), proc.stderr[-2000:]
    assert not (tmp_path / "save").exists()


def _as_a_user(command: list[str]) -> list[str]:
    """``command`` run so that file modes apply: as root, with the capabilities that override them dropped."""
    if os.geteuid() != 0:
        return command
    capsh = shutil.which("capsh")
    if capsh is None:
        pytest.skip("as root, mode bits are ignored unless capsh (libcap2-bin) drops cap_dac_override; none here")
    return [capsh, "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", " ".join(map(repr, command))]


@pytest.mark.parametrize("case", ["read-only directory", "a file"])
def test_a_ckpt_directory_it_cannot_use_is_named_with_its_cause_first_and_alone(tmp_path: Path, case: str) -> None:
    """Issue 40 item 3: the Quickstart pointed at an existing directory it cannot write (mode 555; as root, with the
    capabilities that bypass modes dropped) or at a file stops with the cause ('is not writable by this process';
    'is a file, not a directory'; it said 'cannot be created: Permission denied'), and no 'cannot append to
    .../ckpt.log' warning comes before it."""
    (code,) = [b.astext() for b in blocks(README, "python")]
    (tmp_path / "quickstart.py").write_text(code)
    target = tmp_path / "save"
    if case == "a file":
        target.write_text("not a directory")
        cause = f"FileExistsError: [Errno 17] ckpt_directory '{target}' cannot be created: '{target}' is a file, "
        cause += "not a directory"
    else:
        target.mkdir()
        target.chmod(0o555)
        cause = (
            f"PermissionError: [Errno 13] ckpt_directory '{target}' is not writable by this process (Permission denied)"
        )
    command = _as_a_user([sys.executable, "quickstart.py", "--epochs", "1"])
    proc = subprocess.run(command, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    target.chmod(0o755)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == cause, proc.stderr[-3000:]
    assert "cannot append" not in proc.stderr and "candle_ckpt WARNING" not in proc.stderr, proc.stderr[-3000:]


def test_ctrl_c_in_the_quickstart_keeps_the_traceback_and_says_once_what_is_committed(tmp_path: Path) -> None:
    """Issue 40 item 8: the Quickstart (a real subprocess) sent a real SIGINT during fit ends as Python ends it
    (its KeyboardInterrupt traceback, status -SIGINT), and then one line, on the console and in ckpt.log, names
    the last committed checkpoint (the one `last` points to), as a SIGTERM's line does."""
    import time

    (code,) = [b.astext() for b in blocks(README, "python")]
    (tmp_path / "quickstart.py").write_text(code)
    proc = subprocess.Popen(
        [sys.executable, "quickstart.py", "--epochs", "100000"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300  # Keras's import and two epochs, on a loaded machine
        while not (tmp_path / "save" / "ckpts" / "epochs" / "002").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"the SIGINT did not end the Quickstart in 300 s; its stderr:\n{proc.communicate()[1][-3000:]}")
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT, err[-3000:]
    lines = err.splitlines()
    assert "Traceback (most recent call last):" in lines and "KeyboardInterrupt" in lines, err[-3000:]
    last = tmp_path / "save" / "ckpts" / "last"
    epoch = int(os.readlink(last).split("/")[-1])
    said = f"interrupted (Ctrl-C): the last committed checkpoint is epoch {epoch} ({tmp_path / 'save'}/ckpts/epochs/"
    said += f"{epoch:03d})"
    console = [s for s in lines if "interrupted (Ctrl-C)" in s]
    assert len(console) == 1 and console[0].endswith(f"candle_ckpt WARNING: {said}"), err[-3000:]
    assert lines.index(console[0]) > lines.index("KeyboardInterrupt")  # after Python's traceback, which is kept
    log = (tmp_path / "save" / "ckpt.log").read_text().splitlines()
    assert [s for s in log if "interrupted (Ctrl-C)" in s] == [log[-1]] and log[-1].endswith(f"WARNING {said}"), log[
        -5:
    ]


DROPPER = """
class Dropper(keras.callbacks.Callback):  # a Ctrl-C that lands in a finalizer at epoch 3's end
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 2:
            import signal, weakref

            class Finalized:
                pass

            obj = Finalized()
            self.ref = weakref.ref(obj, lambda _: signal.raise_signal(signal.SIGINT))
            del obj  # its callback runs now: Python drops the KeyboardInterrupt raised in it


"""


def test_a_ctrl_c_python_drops_in_a_finalizer_still_ends_the_fit_at_the_next_step(tmp_path: Path) -> None:
    """Seen once in CI: the Quickstart sent SIGINT as epoch 2 committed trained on for five minutes. Python drops a
    KeyboardInterrupt raised inside a weakref callback or ``__del__`` ("Exception ignored in"), as it does in the
    finalizers that TensorFlow runs at an epoch's end. Here a real SIGINT lands in one at epoch 3's end, before its
    checkpoint (the callback saves after the other callbacks): the fit ends there as a Ctrl-C ends it (traceback,
    -SIGINT, the one line naming epoch 2), instead of training all 5 epochs (before: status 0, "Exception
    ignored" on stderr)."""
    (code,) = [b.astext() for b in blocks(README, "python")]
    code = code.replace("ckpt = candle.CandleCheckpointCallback", DROPPER + "ckpt = candle.CandleCheckpointCallback")
    code = code.replace("callbacks=[ckpt],", "callbacks=[ckpt, Dropper()],")
    assert "Dropper()" in code and "class Dropper" in code
    (tmp_path / "quickstart.py").write_text(code)
    proc = run([sys.executable, "quickstart.py"], tmp_path, timeout=300)  # 5 epochs at most, on a loaded machine
    assert proc.returncode == -signal.SIGINT, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert "KeyboardInterrupt" in lines and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert "Epoch 4/5" not in proc.stdout and os.readlink(tmp_path / "save" / "ckpts" / "last") == "epochs/002"
    said = f"interrupted (Ctrl-C): the last committed checkpoint is epoch 2 ({tmp_path / 'save'}/ckpts/epochs/002)"
    assert [s for s in lines if "interrupted (Ctrl-C)" in s][0].endswith(said), proc.stderr[-3000:]
    log = (tmp_path / "save" / "ckpt.log").read_text()
    dropped = "Ctrl-C: Python dropped the KeyboardInterrupt in a finalizer; raised at this step instead"
    assert dropped in log and log.rstrip().endswith(said), log[-2000:]
