"""docs/architecture.rst's walks, measured: how many modules of the package an epoch-end save, ``restart()`` and a
SIGTERM to one of two JAX processes enter (:mod:`module_walk`, a profile hook in real processes).

The page's table says the count for each; a walk that enters more modules than the page says fails here (a new
layer of indirection has to be argued on the page first), and so does a page that claims fewer than measured.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from locations import REPO, job_script
from module_walk import read
from pace import wait_s

PAGE = REPO / "docs" / "architecture.rst"


def documented(walk: str) -> int:
    """The count the page's table gives ``walk`` (its row: ``walk  <before>  <now>``)."""
    rows = re.findall(rf"^\s*{re.escape(walk)}\s+(\d+)\s+(\d+)\s*$", PAGE.read_text(), re.M)
    assert len(rows) == 1, f"docs/architecture.rst has no single row for the walk {walk!r}"
    return int(rows[0][1])


def run_walk(directory: Path, flow: str, out: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, str(job_script("walk_job.py")), str(directory), flow, str(out)],
        capture_output=True, text=True, env=env, timeout=wait_s(240),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return read(str(out))


def check(walk: str, modules: list[str]) -> None:
    print(f"{walk}: {len(modules)} modules: {', '.join(m.removeprefix('candle_ckpt.') for m in modules)}")
    assert modules, f"{walk}: no module recorded (the profile hook saw nothing)"
    assert len(modules) <= documented(walk), (walk, modules)


def test_an_epoch_end_save_and_a_restart_enter_no_more_modules_than_the_page_says(tmp_path) -> None:
    save = run_walk(tmp_path / "ck", "save", tmp_path / "save.txt")
    assert "candle_ckpt.storage.store" in save or any(m.startswith("candle_ckpt.storage.") for m in save), save
    check("epoch-end save", save)
    restart = run_walk(tmp_path / "ck", "restart", tmp_path / "restart.txt")
    assert any(m.startswith("candle_ckpt.engine.restore") for m in restart), restart
    check("restart()", restart)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)")
def test_a_sigterm_to_one_of_two_jax_processes_enters_no_more_modules_than_the_page_says(tmp_path) -> None:
    pytest.importorskip("jax")
    from jax_cluster import JaxJob

    out = tmp_path / "walk"
    # Both open their window after batch 1 of epoch 2 (process 0 without sleeping: it waits in the next step's
    # collective); process 1 sleeps there and is asked to stop.
    extra = {0: ["--pause-at=1:1:0"], 1: ["--pause-at=1:1:3"]}
    job = JaxJob(tmp_path, "t", "dp", tmp_path / "ck", 3, extra=extra, timeout_s=wait_s(240),
                 env={"CANDLE_WALK_OUT": str(out)})  # fmt: skip
    job.wait_for(1, "PAUSED")
    job.signal(1, signal.SIGTERM)
    assert job.exit_codes() == [143, 143], [job.output(i)[-3000:] for i in (0, 1)]
    walks = [read(f"{out}.p{i}") for i in (0, 1)]
    check("SIGTERM, the process asked", walks[1])
    check("SIGTERM, the other process", walks[0])
