"""The README and docs/ cannot drift from the code: every code block is run or checked.

* Python blocks of README.rst (and the blocks of docs/*.rst marked ``:class: runnable``)
  run as pasted, in a subprocess, in a fresh directory, with this tree on PYTHONPATH.
  The Quickstart runs twice (train, then resume) and a third time with more epochs.
* ``$ candle-ckpt ...`` lines of the README's console block run against the
  Quickstart's ``./save``; console lines in docs/ name commands that exist.
* The README's two set-up commands: the demo part runs as written (twice: train,
  then resume); the pip parts name extras that setup.cfg defines; the test command is
  the one ``.ci/run`` runs. pip itself is never run here.
* README.rst and every docs/*.rst pass docutils with warnings as errors, and every
  relative ``.rst`` link points to a file that exists.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import docutils.core
import docutils.nodes
import pytest
from doclines import blocks, doctree, pages
from locations import REPO

ROOT = REPO
README = ROOT / "README.rst"
DOCS = pages()  # docs/*.rst but the two Sphinx-only pages (the site's build: test_docs_site.py)
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def run(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def console_commands(path: Path) -> list[str]:
    """Every ``$ command`` line of the console blocks of ``path``, comments dropped."""
    lines = []
    for block in blocks(path, "console"):
        for line in block.astext().splitlines():
            if line.startswith("$ "):
                lines.append(line[2:].split("  #")[0].strip())
    return lines


def setup_commands() -> tuple[str, str]:
    """The README's two set-up commands: (install + demo, install + tests)."""
    plain = [b.astext() for b in blocks(README) if not b.get("classes")]
    demo = [c for c in plain if "candle_ckpt.cli.demo" in c]
    tests = [c for c in plain if "pytest" in c]
    assert len(demo) == 1 and len(tests) == 1, plain
    return demo[0], tests[0]


def extras() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return set(cfg["options.extras_require"])


def test_readme_and_every_doc_pass_docutils_with_warnings_as_errors() -> None:
    """README.rst and each docs/*.rst parse without a docutils warning or error."""
    assert len(DOCS) >= 8, DOCS
    for path in [README, *DOCS]:
        doctree(path)


def test_relative_rst_links_point_to_files_that_exist() -> None:
    """Every link to another .rst file (README -> docs/, docs -> docs) names an existing file."""
    for path in [README, *DOCS]:
        for ref in doctree(path).findall(docutils.nodes.reference):
            uri = ref.get("refuri", "")
            if uri.endswith(".rst") and "://" not in uri:
                assert (path.parent / uri).is_file(), f"{path.name}: link to missing {uri}"


def test_readme_is_a_front_page_with_a_table_of_contents() -> None:
    """README.rst stays a front page: at most 350 lines, a contents directive, links to docs/."""
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    assert ".. contents::" in text
    titles = [n.astext() for n in doctree(README).findall(docutils.nodes.title)]
    assert len(titles) == len(set(titles)), f"duplicate section titles: {titles}"
    for doc in ("guarantees", "benchmarks", "multi-worker", "remote", "jobrunner", "format", "migrating"):
        assert f"docs/{doc}.rst" in text


def test_quickstart_runs_as_pasted_then_resumes_and_the_cli_block_works_on_its_output(tmp_path: Path) -> None:
    """The README's Python block trains, a second run resumes after the last epoch, a third trains on;
    then every `$ candle-ckpt` line of the README runs with exit status 0 in the same directory."""
    (code,) = [b.astext() for b in blocks(README, "python")]
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    first = run([sys.executable, str(script)], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "starting from scratch" in first.stdout
    assert os.readlink(tmp_path / "save" / "ckpts" / "last") == "epochs/005"
    second = run([sys.executable, str(script)], tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming after epoch 5" in second.stdout
    third = run([sys.executable, str(script), "--epochs", "7"], tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "resuming after epoch 5" in third.stdout
    assert os.readlink(tmp_path / "save" / "ckpts" / "last") == "epochs/007"
    commands = console_commands(README)
    assert any(c.startswith("candle-ckpt rollback") for c in commands) and len(commands) >= 5
    for command in commands:
        words = shlex.split(command)
        assert words[0] == "candle-ckpt", command
        if words[1] == "demo":
            continue  # the demo runs in test_setup_demo_command_runs_as_written
        proc = run([sys.executable, "-m", "candle_ckpt", *words[1:]], tmp_path)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert (tmp_path / "metrics.png").stat().st_size > 1000


def test_setup_demo_command_runs_as_written_and_resumes(tmp_path: Path) -> None:
    """The set-up line's demo command (pip part skipped) trains into ./candle_ckpt_demo, and resumes when rerun."""
    demo, _ = setup_commands()
    pip, command = (part.strip() for part in demo.split("&&"))
    assert re.fullmatch(r'python3 -m pip install -e "\.\[([\w,]+)\]"', pip), pip
    assert set(re.search(r"\[([\w,]+)\]", pip).group(1).split(",")) <= extras()
    assert "plot" in pip  # every documented command works after this install: plot needs matplotlib
    words = shlex.split(command)
    assert words[:3] == ["python3", "-m", "candle_ckpt.cli.demo"], words
    first = run([sys.executable, *words[1:], "--sleep", "0"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "starting from scratch" in first.stdout and str(tmp_path / "candle_ckpt_demo") in first.stdout
    epochs = words[words.index("--epochs") + 1]
    assert os.readlink(tmp_path / "candle_ckpt_demo" / "ckpts" / "last") == f"epochs/{int(epochs):03d}"
    assert not (tmp_path / "save").exists()  # never the Quickstart's directory
    again = run([sys.executable, *words[1:]], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"all {epochs} epochs are done" in again.stdout


def test_setup_test_command_is_what_ci_runs() -> None:
    """The README's test command installs the 'test' extra and runs the pytest command that .ci/run runs, which
    prints each skip's reason (-rfEs: a missing torch, Slurm, second Keras or package index is named) and still
    lists the failures and errors at the end (a bare -rs would replace pytest's default -rfE)."""
    _, command = setup_commands()
    pip, pytest_cmd = (part.strip() for part in command.split("&&"))
    assert "-rfEs" in shlex.split(pytest_cmd), pytest_cmd
    assert pip == 'python3 -m pip install -e ".[test]"'
    assert "test" in extras()
    ci = (ROOT / ".ci" / "run").read_text()
    assert pytest_cmd in ci
    assert '-e ".[test]"' in ci


CONSOLE_DOCS = [p for p in DOCS if console_commands(p)]


def test_the_docs_have_console_lines_for_the_command_check() -> None:
    """The check below is not empty: some docs/ page has a console block with `$` lines (docs/cli.rst has many)."""
    assert CONSOLE_DOCS, "no docs/*.rst has a console block with `$ ` lines: the command check would check nothing"


@pytest.mark.parametrize("path", CONSOLE_DOCS, ids=[p.name for p in CONSOLE_DOCS])
def test_console_lines_in_docs_name_commands_that_exist(path: Path) -> None:
    """Each `$ candle-ckpt X` in docs/ names a real subcommand; each `python path.py` a real file (run only for
    the pages that have a console block)."""
    from candle_ckpt.cli.parser import COMMANDS

    names = {c.name for c in COMMANDS}
    for command in console_commands(path):
        words = shlex.split(command)
        if words[0] == "candle-ckpt":
            assert words[1] in names or words[1].startswith("-"), command
        elif words[0] in ("python", "python3") and words[1].endswith(".py"):
            # A script the docs give and the reader saves (the README's quickstart.py, multi-worker.rst's
            # train.py: "Save this as ``train.py``") need not be in the repository; any other must be.
            saved = words[1] == "quickstart.py" or f"Save this as ``{words[1]}``" in path.read_text()
            assert saved or (ROOT / words[1]).is_file(), command


RUNNABLE = [(p, i) for p in DOCS for i, _ in enumerate(blocks(p, "runnable"))]


@pytest.mark.parametrize("path,index", RUNNABLE, ids=[f"{p.name}-{i}" for p, i in RUNNABLE])
def test_runnable_doc_blocks_run_as_pasted_twice(tmp_path: Path, path: Path, index: int) -> None:
    """A docs/ Python block marked runnable runs as pasted, and runs again (a resume) in the same directory."""
    code = blocks(path, "runnable")[index].astext()
    script = tmp_path / "example.py"
    script.write_text(code)
    for _ in range(2):
        proc = run([sys.executable, str(script)], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_sbatch_script_requeues_on_the_preemption_exit_code_and_the_rerun_finishes(tmp_path: Path) -> None:
    """The README's sbatch script with srun and scontrol stubbed: with the wall time ending (SLURM_JOB_END_TIME)
    the Quickstart saves a step checkpoint at once and exits 99, so the script requeues; the requeued run
    resumes that epoch and finishes without a requeue."""
    (script,) = [b.astext() for b in blocks(README, "bash")]
    assert "#SBATCH --signal=USR1@120" in script and "scontrol requeue" in script
    (code,) = [b.astext() for b in blocks(README, "python")]
    (tmp_path / "quickstart.py").write_text(code)
    (tmp_path / "job.sh").write_text(script)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (
        ("srun", 'exec "$@"'),
        ("scontrol", f'[ "$1" = requeue ] && echo "$@" >> {tmp_path / "requeued.txt"}; exit 0'),
        ("python3", f'exec {sys.executable} "$@"'),
    ):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {k: v for k, v in ENV.items() if k != "SLURM_JOB_END_TIME"}
    env.update(PATH=f"{stubs}:{os.environ['PATH']}", SLURM_JOB_ID="7")
    ending = {**env, "SLURM_JOB_END_TIME": str(int(time.time()) + 30)}
    first = subprocess.run(["bash", "job.sh"], cwd=tmp_path, env=ending, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "requeueing job 7" in first.stdout
    assert (tmp_path / "requeued.txt").read_text() == "requeue 7\n"
    assert len(list((tmp_path / "save" / "ckpts" / "steps").iterdir())) == 1
    again = subprocess.run(["bash", "job.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming after epoch 0" in again.stdout
    assert (tmp_path / "requeued.txt").read_text() == "requeue 7\n"
    assert os.readlink(tmp_path / "save" / "ckpts" / "last") == "epochs/020"
