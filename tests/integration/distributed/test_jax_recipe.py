"""docs/multi-worker.rst's JAX recipe runs as pasted: its ``train.py``, its two commands, the output it shows.

The ``train.py`` block and the console block's commands are taken from the page (docutils, as every doc
test reads them) and run for real: two processes on localhost, then the same two commands again (both
resume after the last epoch). The one change made to the script is the coordinator's port
(``localhost:12345`` becomes a free port: a test must not depend on a fixed port being free). The lines the
page shows must be what the two processes print, in shape (times, sizes and durations are numbers) and as
a set (the two processes' lines interleave in any order). Under a real one-node Slurm (where one can be
started: .ci/run installs it), ``srun`` runs the same ``train.py`` with the page's ``srun`` line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import free_ports
from doclines import DOCS, blocks, console_examples, shape
from locations import REPO
from slurm_cluster import missing, start_cluster

pytest.importorskip("jax")

pytestmark = [
    pytest.mark.slow,  # two real 2-process jobs
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

PAGE = DOCS / "multi-worker.rst"
TIMEOUT_S = 600  # two processes of a 5-epoch, 8-step job: well under a minute on a quiet 2-core machine
SHOWN = re.compile(r"^process \d+: |candle_ckpt INFO: ")  # the page leaves TensorFlow's and Gloo's lines out


def recipe() -> tuple[str, list[str], list[str]]:
    """The page's ``train.py``, its console commands (in order) and the output lines it shows under them."""
    (script,) = [b.astext() for b in blocks(PAGE, "python") if b.astext().startswith("# train.py")]
    examples = [(c, out) for c, out in console_examples(PAGE) if "train.py" in c]
    return script, [c for c, _ in examples], [line for _, out in examples for line in out]


def run_commands(folder: Path, commands: list[str]) -> str:
    """The page's commands, as one shell runs them (``&``: in the background), then ``wait``; their output."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # this python3
    shell = "\n".join(commands + ["wait"])
    proc = subprocess.Popen(["bash", "-c", shell], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the shell and both processes
        out, _ = proc.communicate()
        pytest.fail(f"the recipe did not end within {TIMEOUT_S} s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    return out


def test_install_line_names_jax_for_cpus_and_the_checkout() -> None:
    """The recipe's install line installs this checkout and ``jax[cpu]``."""
    lines = [b.astext() for b in blocks(PAGE, "bash") if "jax[cpu]" in b.astext()]
    assert lines == ['python3 -m pip install -e . "jax[cpu]"']


def test_recipe_runs_as_pasted_on_one_machine_then_resumes(tmp_path: Path) -> None:
    """The two commands train 5 epochs on 2 processes, printing the lines the page shows; run again, both
    processes resume after epoch 5."""
    script, commands, shown = recipe()
    want = [["python3", "train.py", "0", "2", "&"], ["python3", "train.py", "1", "2"]]
    assert [shlex.split(c) for c in commands] == want
    (port,) = free_ports(1)
    assert script.count("localhost:12345") == 1
    (tmp_path / "train.py").write_text(script.replace("localhost:12345", f"localhost:{port}"))
    out = run_commands(tmp_path, commands)
    # The page ran it from /home/you: the one line that names a path (restart's, of run1) names that folder
    got = [line.replace(str(tmp_path), "/home/you") for line in out.splitlines() if SHOWN.search(line)]
    assert sorted(map(shape, got)) == sorted(map(shape, shown)), "\n".join(["--- real:", *got, "--- page:", *shown])
    assert os.readlink(tmp_path / "run1" / "ckpts" / "last") == "epochs/005"
    again = run_commands(tmp_path, commands)
    for rank in (0, 1):
        assert f"process {rank}: resuming after epoch 5" in again and f"process {rank}: done, 0 epochs" in again


def test_recipe_runs_under_srun_unchanged(tmp_path: Path) -> None:
    """Under a real one-node Slurm, the page's ``srun`` line runs the same ``train.py`` (no arguments: JAX reads
    Slurm's environment) on 2 tasks, which train all 5 epochs into one checkpoint directory."""
    why = missing()
    if why:
        pytest.skip(f"no Slurm here: {why}")
    script, _, _ = recipe()
    (srun,) = [b.astext() for b in blocks(PAGE, "bash") if b.astext().startswith("srun ")]
    assert shlex.split(srun) == ["srun", "--ntasks=2", "python3", "train.py"]
    cluster = start_cluster(tmp_path / "state")
    try:
        folder = tmp_path / "job"
        folder.mkdir()
        (folder / "train.py").write_text(script)
        (folder / "job.sh").write_text(f"#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --output=job.log\n{srun}\n")
        env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        env.update(cluster.env, PYTHONUNBUFFERED="1")
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        proc = subprocess.run(["sbatch", "--parsable", "job.sh"], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip().split(";")[0]
        end, info = time.monotonic() + TIMEOUT_S, {}
        while time.monotonic() < end:
            info = cluster.job(job)
            if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                break
            time.sleep(1.0)
        else:
            cluster.cmd("scancel", job, check=False)
        log = (folder / "job.log").read_text(errors="replace") if (folder / "job.log").exists() else ""
        assert info.get("JobState") == "COMPLETED", f"{info}\n{log[-4000:]}\n{cluster.logs()}"
        for rank in (0, 1):
            assert f"process {rank}: done, 5 epochs trained" in log, log[-4000:]
        assert os.readlink(folder / "run1" / "ckpts" / "last") == "epochs/005"
    finally:
        cluster.stop()
        shutil.rmtree(tmp_path / "state", ignore_errors=True)
