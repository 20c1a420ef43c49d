"""docs/cli.rst's ``list``, ``verify``, ``info``, ``rollback``, ``prune`` and ``plot`` examples are what the
commands print (issue 27, item 5).

The README's Quickstart runs with ``--epochs 6`` into ``./save``, as the examples'
job did; every ``$ candle-ckpt list|verify|info|rollback|prune|plot ./save`` line of
docs/cli.rst's console blocks then runs there (a rollback, a real prune or a plot on a
copy of the folder, so that later examples see the page's ``./save``), in the order of
the page (a ``# ... flipped`` or
``# ... damaged`` comment flips one byte of epoch 4's ``model.keras`` first, once;
``# ckpt-info.json edited by hand`` changes a value of its sidecar),
and its output must match the lines under it: the same words and layout, where
numbers, CRCs and times (which change from run to run) only have to be numbers,
CRCs and times. A line ``...`` stands for any lines; ``$ echo $?`` checks the status.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doclines import DOC_JOB, LOG_EXAMPLES, blocks, console_examples, log_examples, matches
from test_readme import README, run

CLI_RST = README.parent / "docs" / "cli.rst"
CHECKED = ("list", "verify", "info", "rollback", "prune", "plot")
# The commands whose examples another test runs (or that show no output), and which: every candle-ckpt
# command in docs/cli.rst's console blocks is in CHECKED or here (test_every_cli_rst_command_is_checked).
ELSEWHERE = {
    "consolidate": "tests/integration/cli/test_sharded_cli.py::test_cli_rst_consolidate_example_is_real_output",
    "demo": "shows no output (its run: tests/integration/e2e/test_readme.py)",
    "campaign": "tests/integration/cli/test_campaign_cli.py::test_cli_rst_campaign_example_is_real_output",
}
CHANGES = ("rollback", "prune", "plot")  # run on a copy of the job: the page's later examples see its ./save


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """The Quickstart trained to epoch 6 in a fresh folder (the folder the examples' ``./save`` is in)."""
    folder = tmp_path_factory.mktemp("job")
    (code,) = [b.astext() for b in blocks(README, "python")]
    (folder / "quickstart.py").write_text(code)
    proc = run([sys.executable, "quickstart.py", "--epochs", "6"], folder, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def test_cli_rst_examples_are_real_output(job: Path, tmp_path: Path) -> None:
    """Each list/verify/info/rollback/prune/plot example of docs/cli.rst, run on the Quickstart's checkpoints (a
    rollback, a prune or a plot on a copy of them), prints lines of the shape shown (paths, words, columns, rows),
    and exits with the status shown."""
    status, damaged, checked = None, False, 0
    for command, expected in console_examples(CLI_RST):
        words = command.split("#")[0].split()
        if words == ["echo", "$?"]:
            if status is not None:
                assert expected == [str(status)], (command, status)
            continue
        status = None
        if words[:1] != ["candle-ckpt"] or words[1] not in CHECKED or words[2:3] != ["./save"]:
            continue
        if not damaged and re.search(r"#.*(flipped|damaged)", command):
            target = job / "save" / "ckpts" / "epochs" / "004" / "model.keras"
            data = bytearray(target.read_bytes())
            data[len(data) // 2] ^= 1
            target.write_bytes(bytes(data))
            damaged = True
        if re.search(r"#.*ckpt-info.json edited by hand", command):
            sidecar = job / "save" / "ckpts" / "epochs" / "004" / "ckpt-info.json"
            doc = json.loads(sidecar.read_text())
            doc["time_elapsed"] += 1.0  # its sidecar_crc32 left as it was
            sidecar.write_text(json.dumps(doc))
        where = job
        if words[1] in CHANGES and "--dry-run" not in words:
            where = tmp_path / f"copy{checked}" / "job"
            shutil.copytree(job, where, symlinks=True)
        proc = run([sys.executable, "-m", "candle_ckpt", *words[1:]], where)
        got = (proc.stdout + proc.stderr).replace(str(where), DOC_JOB).splitlines()
        assert matches(expected, got), (
            f"$ {command}\n--- docs/cli.rst:\n" + "\n".join(expected) + ("\n--- real output:\n" + "\n".join(got))
        )
        status, checked = proc.returncode, checked + 1
    assert checked >= 11 and damaged


ONEDNN_LINE = "oneDNN custom operations are on"


def test_cli_rst_tensorflow_startup_examples_are_real_output(tmp_path: Path) -> None:
    """Issue 40 item 1: docs/cli.rst's runs of the README's Quickstart, with no TF_* variable and with the ones the
    page names, print TensorFlow's start-up lines as shown, line by line (the README used to say that
    TF_CPP_MIN_LOG_LEVEL=3 quiets them): what each variable removes, and that the absl and CUDA lines stay; the
    page's (and the README's) stderr filter, run by bash, drops those and keeps the job's own log lines."""
    import os

    import tensorflow as tf

    if not tf.__version__.startswith("2.21."):
        pytest.skip(f"the page shows TensorFlow 2.21's start-up lines; this is {tf.__version__}")
    if shutil.which("nvidia-smi"):
        pytest.skip("the page shows a machine without CUDA drivers; this one has them")
    (code,) = [b.astext() for b in blocks(README, "python")]
    (tmp_path / "quickstart.py").write_text(code)
    examples = [(c, e) for c, e in console_examples(CLI_RST) if "quickstart.py" in c]
    assert len(examples) == 3, examples
    base = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    base.update(PYTHONPATH=str(README.parent), CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    # Whether TensorFlow turns oneDNN on here by default (the page: only on CPUs with AVX-512 VNNI or BF16, AVX-VNNI
    # or AMX), asked of TensorFlow itself: where it is off, the page says that the oneDNN lines are absent.
    probe = "from tensorflow.python.util import _pywrap_util_port as p; print(p.IsMklEnabled())"
    asked = subprocess.run([sys.executable, "-c", probe], env={**base, "TF_CPP_MIN_LOG_LEVEL": "3"},
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert asked.returncode == 0 and asked.stdout.split()[-1:] in (["True"], ["False"]), asked.stderr[-2000:]
    onednn_default = asked.stdout.split()[-1] == "True"
    for command, expected in examples:
        if " 2> >(grep " in command:  # the stderr filter, run by bash as shown, with this Python first on PATH
            assert command.split(" --epochs 1 ")[1] in README.read_text().replace("\n", " ")  # the README's, too
            shutil.rmtree(tmp_path / "save", ignore_errors=True)
            env = {**base, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{base['PATH']}"}
            proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=600)  # fmt: skip
            got = proc.stdout.splitlines()
            assert proc.returncode == 0 and matches(expected, got), f"$ {command}\n" + "\n".join(got[:20])
            assert not [line for line in got if "0000 00:00:" in line or "absl::InitializeLog" in line], got[:20]
            assert any("candle_ckpt INFO: epoch 1: saved 001" in line for line in got), got  # the job's stderr stays
            continue
        words = command.split("#")[0].split()
        settings = dict(w.split("=", 1) for w in words if "=" in w)
        args = [w for w in words if "=" not in w]
        assert args[:2] == ["python3", "quickstart.py"], command
        shutil.rmtree(tmp_path / "save", ignore_errors=True)
        proc = subprocess.run(
            [sys.executable, *args[1:]], cwd=tmp_path, env={**base, **settings},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:]
        got = proc.stdout.splitlines()
        onednn = settings.get("TF_ENABLE_ONEDNN_OPTS", "1" if onednn_default else "0") != "0"
        assert any(ONEDNN_LINE in line for line in got) == onednn, got[:20]
        if not onednn:
            expected = [line for line in expected if ONEDNN_LINE not in line]
        assert matches(expected, got), (
            f"$ {command}\n--- docs/cli.rst:\n" + "\n".join(expected) + ("\n--- real output:\n" + "\n".join(got[:20]))
        )


def test_every_cli_rst_command_is_checked() -> None:
    """Each candle-ckpt command in docs/cli.rst's console blocks is run by this file or by the test ELSEWHERE names
    (which exists), so that no example of a new command goes unchecked."""
    shown = {c.split()[1] for c, _ in console_examples(CLI_RST) if c.split()[:1] == ["candle-ckpt"]}
    assert shown <= set(CHECKED) | set(ELSEWHERE), shown - set(CHECKED) - set(ELSEWHERE)
    for where in ELSEWHERE.values():
        if "::" in where:
            path, name = where.split("::")
            assert f"def {name}(" in (README.parent / path).read_text(), where


def test_api_rst_names_every_stats_key_and_every_preempt_key(tmp_path: Path) -> None:
    """docs/api.rst's stats() dict has exactly the keys stats() returns, and its preempt record the keys a
    preemption save records."""
    import signal

    from candle_ckpt.config.params import CkptConfig
    from candle_ckpt.core.log import OpsLog
    from candle_ckpt.engine.capture import Capture
    from candle_ckpt.engine.engine import CheckpointEngine
    from candle_ckpt.engine.run import TrainingRun
    from candle_ckpt.storage.store import FileSpec

    text = " ".join((README.parent / "docs" / "api.rst").read_text().split())
    stats_doc, preempt_doc = re.findall(r'``(\{"saves".*?\}|\{"reason".*?\})``', text)
    cfg = CkptConfig.from_params({"ckpt_directory": str(tmp_path), "ckpt_preempt_exit_code": "return"})
    engine = CheckpointEngine(cfg, OpsLog(None))
    assert set(re.findall(r'"(\w+)":', stats_doc)) == set(engine.stats())
    run = TrainingRun(cfg, engine, OpsLog(None))
    run.begin()
    run.controller.watcher.trigger("SIGTERM", signal.SIGTERM)
    capture = lambda: Capture(files=[FileSpec("m.bin", lambda f: f.write(b"w"))], model_file="m.bin", nbytes=1)  # noqa: E731
    assert run.step_end(0, 1, {}, capture)
    run.end()
    assert set(re.findall(r'"(\w+)":', preempt_doc)) == set(engine.stats()["preempt"])


def test_every_log_line_example_in_docs_is_checked_by_the_test_that_writes_it() -> None:
    """Each log-line example of docs/ (a literal block starting with a level) is in doclines.LOG_EXAMPLES, and the
    test named there compares it with the line its real run wrote (assert_log_example for that page)."""
    found = log_examples()
    assert found and set(found) <= set(LOG_EXAMPLES), sorted(set(found) - set(LOG_EXAMPLES))
    for (page, _), test in LOG_EXAMPLES.items():
        assert f'assert_log_example("{page}", ' in (README.parent / test).read_text(), (page, test)
