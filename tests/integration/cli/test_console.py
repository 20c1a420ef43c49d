"""What a user sees on the console: log lines on their own, no TF start-up noise,
one line for Ctrl-C, one line for a missing optional dependency, readable sizes.

Each check runs the real program in a subprocess (stdout and stderr into one pipe,
as a terminal shows them) with this tree on PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from locations import REPO
from pace import slowdown as pace_factor
from pace import wait_s
from pipe_lines import PipeLines

ROOT = REPO
ENV = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
ENV.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user runs it: the demo and the CLI must quiet TF themselves
RUN_S = wait_s(60)  # a short job's bound, scaled to the machine (pace)
SHORT_S = wait_s(40)  # --help, or until a job reaches a point
TF_NOISE = re.compile(r"oneDNN|cuInit|cuda_|absl::InitializeLog|cpu_feature_guard|^[IWE]0000 ", re.M)

FIT = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import keras, numpy as np
    import candle_ckpt as candle
    x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32"); y = x[:, :1]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    params = {"ckpt_directory": sys.argv[1], "epochs": 3, "ckpt_save_best_metric": "loss",
              "ckpt_async": sys.argv[2] == "async"}
    cb = candle.CandleCheckpointCallback(params)
    model.fit(x, y, epochs=3, batch_size=8, verbose=1, callbacks=[cb])
    cb.report_final()
    """
)


def run_fit(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    """:data:`FIT` into ``tmp_path/save`` (``sync`` or ``async``), stdout and stderr in one pipe; it must succeed."""
    proc = subprocess.run(
        [sys.executable, "-c", FIT, str(tmp_path / "save"), mode],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_no_line_mixes_the_progress_bar_with_a_log_record(tmp_path: Path, mode: str) -> None:
    """A short fit with verbose=1: every log record starts a line; no line holds progress text and a record."""
    proc = run_fit(tmp_path, mode)
    lines = proc.stdout.splitlines()
    records = [line for line in lines if "candle_ckpt INFO" in line]
    assert len([r for r in records if ": saved " in r]) == 3, proc.stdout[-3000:]
    assert any("━" in line for line in lines)  # the progress bar was drawn
    for line in records:
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ candle_ckpt INFO: ", line), line
        assert "━" not in line and "step" not in line.split("candle_ckpt INFO")[0], line


def test_sizes_are_printed_in_readable_units_and_the_preemption_line_only_in_ckpt_log(tmp_path: Path) -> None:
    """A tiny model's save is reported in kB, never as '0.0 MB'; 'preemption: SIGTERM save a checkpoint ...',
    said at every fit, is in ckpt.log and not on the console (issue 27)."""
    proc = run_fit(tmp_path, "sync")
    assert re.search(r"saved 001 \(best\) \d+\.\d kB in", proc.stdout), proc.stdout[-2000:]
    assert "0.0 MB" not in proc.stdout
    assert "preemption" not in proc.stdout, proc.stdout[-3000:]
    log = (tmp_path / "save" / "ckpt.log").read_text()
    assert "INFO preemption: on SIGTERM, a checkpoint is saved at the next step and training stops" in log


def test_demo_prints_no_tensorflow_startup_lines_and_names_its_directory(tmp_path: Path) -> None:
    """`candle-ckpt demo` (TF_CPP_MIN_LOG_LEVEL unset) shows no oneDNN/CUDA lines and says where it saves."""
    proc = subprocess.run(
        [sys.executable, "-m", "candle_ckpt", "demo", "--epochs", "1", "--sleep", "0", "--samples", "256"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not TF_NOISE.search(proc.stdout), proc.stdout[:3000]
    assert f"checkpoints in {tmp_path / 'candle_ckpt_demo'}" in proc.stdout


def test_demo_help_names_the_command_it_was_run_as() -> None:
    """`candle-ckpt demo --help` says `usage: candle-ckpt demo`, and the module says its own name."""
    via_cli = subprocess.run(
        [sys.executable, "-m", "candle_ckpt", "demo", "--help"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=SHORT_S,
    )
    assert via_cli.returncode == 0 and via_cli.stdout.startswith("usage: candle-ckpt demo "), via_cli.stdout[:200]
    direct = subprocess.run(
        [sys.executable, "-m", "candle_ckpt.cli.demo", "--help"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=SHORT_S,
    )
    assert direct.returncode == 0 and direct.stdout.startswith("usage: python3 -m candle_ckpt.cli.demo ")
    assert "./candle_ckpt_demo" in via_cli.stdout


def test_the_demo_pauses_long_enough_for_ctrl_c_on_a_terminal_and_the_readme_says_how() -> None:
    """Issue 40 item 2: an epoch of the demo takes ~0.3 s, so 'Ctrl-C after a few epochs' was a race. On a
    terminal the demo's --sleep defaults to 1 s (0.2 s piped, as the tests run it), and the README's demo line
    and docs/cli.rst name --sleep."""
    import pty

    code = "from candle_ckpt.cli.demo import build_parser; print(build_parser().parse_args([]).sleep)"
    piped = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=SHORT_S)
    assert piped.stdout.strip() == "0.2", piped.stderr[-2000:]
    main, terminal = pty.openpty()
    try:
        subprocess.run([sys.executable, "-c", code], env=ENV, stdout=terminal, timeout=SHORT_S, check=True)
        assert os.read(main, 100).decode().strip() == "1.0"
    finally:
        os.close(main)
        os.close(terminal)
    readme = (ROOT / "README.rst").read_text()
    assert re.search(r"\$ candle-ckpt demo .*--sleep \d", readme), "README's demo line does not show --sleep"
    assert "1 s by default when its output is a terminal" in " ".join((ROOT / "docs" / "cli.rst").read_text().split())


# SIGINT ignored, as a non-interactive shell's ``&`` leaves it: set by a shell that then execs the demo (not by a
# preexec_fn, which would fork this process with TensorFlow's and JAX's threads running: tests/conftest.py).
IGNORING_SIGINT = ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh"]


@pytest.mark.parametrize(
    ("moment", "background"),
    [("importing", False), ("fit-starts", False), ("after-a-save", False), ("after-a-save", True)],
)
def test_ctrl_c_ends_the_demo_with_one_line_saying_what_was_saved(tmp_path: Path, moment: str, background: bool):
    """SIGINT at several moments of the demo (while Keras loads, as fit starts, after a checkpoint; and once with
    SIGINT inherited ignored, as a background shell starts it): exit 130, no traceback, one line saying what was
    saved and how to resume."""
    demo = [sys.executable, "-m", "candle_ckpt.cli.demo", "--epochs", "50", "--sleep", "0.5", "--samples", "256"]
    proc = subprocess.Popen(
        IGNORING_SIGINT + demo if background else demo,
        cwd=tmp_path,
        env=dict(ENV, PYTHONFAULTHANDLER="1"),  # a native crash (seen once: -11 as fit began) leaves its stack
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    last = tmp_path / "candle_ckpt_demo" / "ckpts" / "last"
    deadline = time.monotonic() + SHORT_S
    if moment == "importing":  # TensorFlow's library is mapped: main() is importing Keras
        maps = Path(f"/proc/{proc.pid}/maps")
        while proc.poll() is None and time.monotonic() < deadline and "tensorflow" not in maps.read_text():
            time.sleep(0.05)
    elif moment == "fit-starts":
        line = PipeLines(proc.stdout).next(SHORT_S)  # the demo's first line: once Keras is loaded, before fit
        assert line.startswith("demo: starting from scratch"), line
    else:
        while not os.path.lexists(last) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert os.path.lexists(last), "the demo saved nothing"
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=SHORT_S)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out[-2000:], err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and "candle_ckpt INFO" not in line]
    assert len(lines) == 1, err
    where = tmp_path / "candle_ckpt_demo"
    if os.path.lexists(last):
        saved = int(os.readlink(last).split("/")[-1])
        assert f"interrupted; the last checkpoint is epoch {saved} in {where}" in lines[0]
    else:
        assert f"interrupted; no checkpoint was saved yet in {where}" in lines[0]
    assert "run the same command again to resume" in lines[0]


# Delivery times of the start-up sweep on a quiet machine (scaled by pace): every 10 ms through the interpreter's
# start and the CLI's imports (each phase lasts longer), then sparser while Keras loads. Each delivery costs a
# process start, about 4 s: at every 5 ms the sweep took 3 of the main pass's minutes.
SWEEP_S = [i * 0.01 for i in range(20)] + [0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0]


def _interpreter_start(proc: subprocess.Popen, out: str, err: str, where: Path) -> bool:
    """Whether a SIGINT met the process before the entry module's first statement: Python was still starting
    (killed by the signal before Python's handler; Python's KeyboardInterrupt in site or runpy, in the body of the
    package's ``__init__.py``, which every entry point imports first and which only defines names, or at line 0 of
    the entry module), or the import system dropped it ("Exception ignored" in a module lock's weakref callback,
    printed by Python's own hook, which the entry module replaces first thing). Nothing of the program shows in the
    output and nothing was written; or, once the signal was dropped, the demo ran on as if none had come."""
    package = f'File "{ROOT / "candle_ckpt"}'
    ours = [line for line in err.splitlines() if line.startswith(f"  {package}")]
    early = all(line.startswith(f'  {package}/__init__.py"') or line.endswith("line 0, in <module>") for line in ours)
    quiet = "demo" not in out + err and not where.exists()
    # Dropped before candle_ckpt's first statement: the demo then runs as if no signal came, until the test kills it.
    dropped = "Exception ignored in: <function _get_module_lock" in err and proc.returncode == -signal.SIGKILL
    return early and (dropped or (quiet and proc.returncode in (-signal.SIGINT, 1)))


def test_ctrl_c_from_the_very_start_of_candle_ckpt_demo_is_one_line(tmp_path: Path) -> None:
    """`candle-ckpt demo` gets SIGINT at 0, 5, 10, ... ms after it starts (issue 27: the first ~0.3 s printed a
    traceback): once a statement of candle_ckpt has run, every delivery ends with status 130 and one line saying
    what was saved, never a traceback; before, Python itself ends the process (or drops the signal) and no line of
    candle_ckpt has run."""
    answered = 0
    for i, delay in enumerate(s * pace_factor() for s in SWEEP_S):
        cwd = tmp_path / str(i)
        cwd.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "candle_ckpt", "demo", "--epochs", "50", "--sleep", "0.5", "--samples", "256"],
            cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        try:  # a Ctrl-C during Keras's import is answered when it ends: seconds; then the demo is still starting
            out, err = proc.communicate(timeout=wait_s(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        where = cwd / "candle_ckpt_demo"
        if _interpreter_start(proc, out, err, where):
            continue
        lines = [line for line in err.splitlines() if line.strip() and "candle_ckpt INFO" not in line]
        if proc.returncode != 130 or "Traceback" in err:
            pytest.fail(f"SIGINT {delay:.3f} s after start: status {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}")
        said = f"demo: interrupted; no checkpoint was saved yet in {where}"
        assert len(lines) == 1 and said in lines[0], (delay, err)
        answered += 1
    assert answered >= len(SWEEP_S) // 2, f"only {answered} of {len(SWEEP_S)} deliveries reached the program"


DROPPED = """
import signal, sys, weakref
sys.argv = ["candle-ckpt", "demo", "--epochs", "50", "--sleep", "0.5", "--samples", "256"]
import candle_ckpt.__main__ as entry

class Lock:
    pass

lock = Lock()
ref = weakref.ref(lock, lambda _: signal.raise_signal(signal.SIGINT))
del lock  # Ctrl-C inside a weakref callback, as in the import system's module locks: Python drops the exception
sys.exit(entry.run())
"""


def test_a_ctrl_c_the_import_system_drops_still_ends_the_command_with_one_line(tmp_path: Path) -> None:
    """A loaded run's sweep saw it: SIGINT while candle_ckpt's modules load, inside one of the import system's weakref
    callbacks, which report the KeyboardInterrupt as "Exception ignored" and go on; the demo then trained as if no
    signal had come. The entry module writes the signal down before raising: the command answers it."""
    proc = subprocess.run(
        [sys.executable, "-c", DROPPED], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=RUN_S
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "candle_ckpt INFO" not in line]
    assert proc.returncode == 130, proc.stderr
    said = f"demo: interrupted; no checkpoint was saved yet in {tmp_path / 'candle_ckpt_demo'}"
    assert len(lines) == 1 and said in lines[0], lines
    assert "demo: starting" not in proc.stdout


# A stand-in for keras whose import gets a Ctrl-C half-way (as a SIGINT about 2 s into the demo lands inside
# TensorFlow's import of JAX) and then writes a native library's start-up line on file descriptor 2.
FAKE_KERAS = """
import os, signal
os.kill(os.getpid(), signal.SIGINT)
os.write(2, b"I0000 native start-up line\\n")
FINISHED = True
"""
INTERRUPTED_IMPORT = """
import sys
from candle_ckpt.cli import console
try:
    with console.watch_sigint(demo=True):
        console.import_keras_quietly()
        print("went on after the import")
except KeyboardInterrupt:
    print("interrupted after the import:", sys.modules["keras"].FINISHED)
"""


def test_a_ctrl_c_during_the_keras_import_is_answered_after_it(tmp_path: Path) -> None:
    """A KeyboardInterrupt raised inside TensorFlow's import crashed the demo (SIGSEGV or SIGABRT, a sweep of
    delivery times around 2 s) or left a library that later printed its start-up lines beside the one answer line
    (a quiet full run): the demo and the CLI hold SIGINT while Keras imports and answer it once the import is done,
    with its start-up lines still hidden."""
    (tmp_path / "keras.py").write_text(FAKE_KERAS)
    env = {**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_S
    )
    assert proc.stdout == "interrupted after the import: True\n", (proc.stdout, proc.stderr)
    assert proc.stderr == "", proc.stderr


DEFERRED = """
import os, signal
from candle_ckpt.cli import console
with console.watch_sigint(demo=True):
    try:
        with console.sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            print("first remembered:", console.sigint_seen())
            os.kill(os.getpid(), signal.SIGINT)
            print("second went through")
    except KeyboardInterrupt:
        print("second raised")
"""


def test_in_the_demos_fit_a_first_ctrl_c_is_answered_between_batches_and_a_second_at_once(tmp_path: Path) -> None:
    """The demo's fit runs under console.sigint_deferred(): a first SIGINT is only remembered (the demo's callback
    raises it at the batch's end, where an interrupt cannot land inside TensorFlow's work), a second one raises."""
    proc = subprocess.run(
        [sys.executable, "-c", DEFERRED], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=RUN_S
    )
    assert proc.stdout == "first remembered: True\nsecond raised\n", (proc.stdout, proc.stderr)


def test_demo_error_names_the_directory_and_what_to_do(tmp_path: Path) -> None:
    """A demo checkpoint that does not fit the demo's model: one error naming the directory and the ways out."""
    env = dict(ENV)
    subprocess.run(
        [sys.executable, "-m", "candle_ckpt.cli.demo", "--epochs", "1", "--sleep", "0", "--samples", "256"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=RUN_S,
        check=True,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "candle_ckpt.cli.demo", "--epochs", "2", "--ckpt_restart_epoch", "7"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert f"checkpoint directory {tmp_path / 'candle_ckpt_demo'}" in proc.stderr
    assert "--ckpt_directory DIR" in proc.stderr and "--ckpt_restart_mode off" in proc.stderr


HIDE_MATPLOTLIB = textwrap.dedent(
    """
    import sys
    sys.modules["matplotlib"] = None  # import matplotlib now fails, as if it were not installed
    from candle_ckpt.cli.main import main
    sys.exit(main(["plot", sys.argv[1], "-o", sys.argv[2]]))
    """
)


def test_plot_without_matplotlib_is_one_line_naming_the_pip_command(tmp_path: Path) -> None:
    """With matplotlib hidden, `candle-ckpt plot` exits 2 with one line naming the pip command; no traceback."""
    from candle_ckpt.core.sidecar import Sidecar
    from candle_ckpt.storage.store import CheckpointStore, FileSpec

    with CheckpointStore(tmp_path / "job") as store:
        store.open_for_write()
        side = Sidecar(epoch=1, generation=0, model_file="w.bin", files={}, logs={"loss": 1.0})
        store.commit(1, [FileSpec("w.bin", lambda f: f.write(b"x" * 10))], side)
    proc = subprocess.run(
        [sys.executable, "-c", HIDE_MATPLOTLIB, str(tmp_path / "job"), str(tmp_path / "m.png")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=SHORT_S,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "needs matplotlib" in lines[0] and "python3 -m pip install matplotlib" in lines[0]
    assert not (tmp_path / "m.png").exists()


def test_a_finished_demo_suggests_more_epochs_than_were_saved(tmp_path: Path) -> None:
    """The demo trained to epoch 2, rerun with --epochs 1: the hint names --epochs 12 (saved epoch + 10), a
    command that trains."""
    demo = [sys.executable, "-m", "candle_ckpt.cli.demo", "--sleep", "0", "--samples", "128"]
    first = subprocess.run(
        [*demo, "--epochs", "2"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=RUN_S
    )
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run(
        [*demo, "--epochs", "1"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=RUN_S
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "demo: all 1 epochs are done (checkpoint of epoch 2 in" in again.stdout
    assert "pass more epochs (--epochs 12)" in again.stdout


def test_the_demo_without_tensorflow_says_how_to_choose_a_backend(tmp_path: Path) -> None:
    """`candle-ckpt demo` where TensorFlow cannot be imported: one line naming KERAS_BACKEND=jax and the tf
    extra, exit status 2, no 'internal error'."""
    code = (
        "import sys; sys.modules['tensorflow'] = None\nfrom candle_ckpt.cli.main import main\nsys.exit(main(['demo']))"
    )
    env = {k: v for k, v in ENV.items() if k != "KERAS_BACKEND"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=RUN_S)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "internal error" not in lines[0], proc.stderr[-2000:]
    assert "KERAS_BACKEND=jax" in lines[0] and "tf extra" in lines[0]


def test_the_demo_directory_is_ignored_by_git() -> None:
    """./candle_ckpt_demo/, where the README's demo command writes, is in .gitignore."""
    from candle_ckpt.cli.parser import DEMO_DIRECTORY

    assert DEMO_DIRECTORY.removeprefix("./") + "/" in (ROOT / ".gitignore").read_text().splitlines()


def test_help_lists_every_exit_status_including_130() -> None:
    """`candle-ckpt --help` names the exit statuses the commands use: 0, 1, 2 and 130 (Ctrl-C)."""
    proc = subprocess.run([sys.executable, "-m", "candle_ckpt", "--help"], env=ENV, capture_output=True, text=True,
                          timeout=SHORT_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "exit status: 0 ok, 1 corruption found, 2 error" in text and "130 interrupted (Ctrl-C)" in text
