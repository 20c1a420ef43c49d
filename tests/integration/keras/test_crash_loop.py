"""Crash loops stop: restart() refuses the same checkpoint resumed K times in a row with no commit after it.

Every job is a real process (``jobs/loop_job.py``: restart(), then fit with the callback), started again at
once after each end, the way a requeueing scheduler does; the history is the job's own ``restarts.jsonl``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from doclines import assert_log_example
from locations import JOBS, REPO
from pace import wait_s

from candle_ckpt.core.history import CRASH_LOOP_EXIT, read_local

JOB = JOBS / "loop_job.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
REFUSED = "restart: refused: epochs/002 has been resumed 3 times in a row"


def start(directory: Path, *args: str) -> subprocess.CompletedProcess:
    """One start of the job, to its end."""
    command = [sys.executable, str(JOB), str(directory), *args]
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=wait_s(60))


def events(history: Path) -> list[tuple[str, str | None]]:
    """``(event, resumed)`` of every record of a history file, in order."""
    return [(r["event"], r.get("resumed")) for r in read_local(str(history))]


def test_a_job_crashing_at_a_fixed_batch_is_refused_on_its_fourth_start(tmp_path: Path) -> None:
    """A job that raises at the same batch after every restore: three starts fail (exit 1), the fourth is refused
    with one line naming the checkpoint, the count and the last failure, exit status 65; ckpt.log and
    restarts.jsonl say so; each start's breakdown is recorded, its parts non-negative."""
    d = tmp_path / "job"
    codes = [start(d, "4", "--crash", "2:1") for _ in range(4)]
    assert [c.returncode for c in codes] == [1, 1, 1, CRASH_LOOP_EXIT], [c.stderr[-1500:] for c in codes]
    assert "RuntimeError: bad batch 2:1" in codes[2].stderr
    refused = [line for line in codes[3].stderr.splitlines() if "restart: refused" in line]
    assert len(refused) == 1 and REFUSED in refused[0], codes[3].stderr[-2000:]
    assert "last failure: RuntimeError: bad batch 2:1" in refused[0] and "exit status 65" in refused[0]
    log = (d / "ckpt.log").read_text()
    assert REFUSED in log and log.count("restart: refused") == 1
    (line,) = [line for line in log.splitlines() if REFUSED in line]
    assert_log_example("preemption.rst", line, "ERROR restart: refused:")
    history = d / "ckpts" / "restarts.jsonl"
    assert events(history) == [
        ("restart", None), ("failure", None),
        ("restart", "epochs/002"), ("failure", None),
        ("restart", "epochs/002"), ("failure", None),
        ("refused", "epochs/002"),
    ]  # fmt: skip
    records = read_local(str(history))
    assert records[-1]["count"] == 3 and records[-1]["last_failure"] == "RuntimeError: bad batch 2:1"
    resumes = [r for r in records if r["event"] == "restart" and r["resumed"]]
    assert [(r["epoch"], r["step"], r["source"]) for r in resumes] == [(2, None, "fast")] * 2
    for r in resumes:
        parts = r["start"]
        assert set(parts) >= {"import_s", "choose_s", "verify_s", "read_s", "restore_s", "first_step_s"}, parts
        assert all(parts[k] >= 0 for k in parts), parts
        assert parts["choose_s"] + parts["verify_s"] + parts["read_s"] <= parts["restore_s"] + 0.01, parts
        assert 0 < parts["import_s"] < wait_s(60), parts
    assert [f["restart"] for f in records if f["event"] == "failure"] == [
        r["id"] for r in records if r["event"] == "restart"
    ]


def test_a_refused_loop_starts_counting_again(tmp_path: Path) -> None:
    """K=0 never refuses; and after a refusal the next start resumes again (the refusal ends the count)."""
    d = tmp_path / "job"
    codes = [start(d, "4", "--crash", "2:1", "--k", "0").returncode for _ in range(4)]
    assert codes == [1, 1, 1, 1]
    assert "restart: refused" not in (d / "ckpt.log").read_text()
    codes = [start(d, "4", "--crash", "2:1", "--k", "2").returncode for _ in range(3)]
    assert codes == [CRASH_LOOP_EXIT, 1, CRASH_LOOP_EXIT]
    assert [e for e, _ in events(d / "ckpts" / "restarts.jsonl")].count("refused") == 2


def test_a_job_killed_while_making_progress_is_never_refused(tmp_path: Path) -> None:
    """SIGKILLed as soon as each new epoch checkpoint is committed, the job resumes a newer one every time
    and is never refused; its last start finishes and reports its start's breakdown through stats()."""
    d, epochs = tmp_path / "job", 5
    for attempt in range(epochs - 1):
        proc = subprocess.Popen(
            [sys.executable, str(JOB), str(d), str(epochs), "--sleep", "0.05", "--k", "2"],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        target = d / "ckpts" / "epochs" / f"{attempt + 1:03d}"
        deadline = time.monotonic() + wait_s(60)
        while not target.is_dir() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert target.is_dir(), proc.communicate(timeout=wait_s(30))[1][-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=wait_s(30))
    last = start(d, str(epochs), "--k", "2")
    assert last.returncode == 0 and "done" in last.stdout, last.stderr[-2000:]
    assert "restart: refused" not in (d / "ckpt.log").read_text()
    breakdown = json.loads(last.stdout.split("start=", 1)[1].splitlines()[0])
    assert breakdown["first_step_s"] >= 0 and breakdown["restore_s"] >= breakdown["read_s"] >= 0, breakdown
    lines = [line for line in (d / "ckpt.log").read_text().splitlines() if " start: " in line]
    assert len(lines) >= 2 and "from process start to restart(); restore" in lines[-1], lines
    assert_log_example("preemption.rst", lines[-1], "INFO start:")


def test_a_moved_run_still_counts_its_loop(tmp_path: Path) -> None:
    """Each start on a new, empty fast tier, the checkpoints and the history on the persistent tier: the loop
    is counted across the moves and refused on the fourth start."""
    persistent = tmp_path / "persistent"
    codes = [
        start(tmp_path / "job", "4", "--crash", "2:1", "--fast", str(tmp_path / f"node{i}"),
              "--persistent", str(persistent))
        for i in range(4)
    ]  # fmt: skip
    assert [c.returncode for c in codes] == [1, 1, 1, CRASH_LOOP_EXIT], [c.stderr[-1500:] for c in codes]
    assert REFUSED in codes[3].stderr
    assert [e for e, _ in events(persistent / "restarts.jsonl")][-1] == "refused"
    assert (tmp_path / "node2" / "ckpts" / "restarts.jsonl").is_file()  # each node's fast tier has its copy


def test_a_crash_drains_its_last_commit_before_the_process_exits(tmp_path: Path) -> None:
    """A job that fails at the first batch after an epoch commit, its persistent tier slow (each file written 1 s
    late): the failing process waits for the drain before it exits, and says so in ckpt.log, so that its next start,
    on a new node, resumes that epoch from the persistent tier (before, the drain's thread died with the process
    and the next node resumed an older checkpoint: the moved run's loop went uncounted)."""
    persistent = tmp_path / "persistent"
    url = f"slowfile://{persistent}"
    first = start(tmp_path / "job", "4", "--crash", "2:0", "--fast", str(tmp_path / "node0"), "--persistent", url,
                  "--slow-drain", "1")  # fmt: skip
    assert first.returncode == 1 and "RuntimeError: bad batch 2:0" in first.stderr, first.stderr[-2000:]
    log = (tmp_path / "node0" / "ckpt.log").read_text()
    (line,) = [line for line in log.splitlines() if "exit: draining" in line]
    assert "epochs/002 (generation 2, epoch 2) to " + url in line, log[-2000:]
    assert_log_example("campaigns.rst", line, "INFO exit: draining")
    assert "drain: complete: epochs/002" in log, log[-2000:]
    second = start(tmp_path / "job", "4", "--fast", str(tmp_path / "node1"), "--persistent", url,
                   "--slow-drain", "0")  # fmt: skip
    assert second.returncode == 0 and "done" in second.stdout, second.stderr[-2000:]
    resumes = [r for r in read_local(str(persistent / "restarts.jsonl")) if r["event"] == "restart" and r["resumed"]]
    assert [(r["resumed"], r["source"]) for r in resumes] == [("epochs/002", "persistent")], resumes


def test_the_readme_sbatch_script_does_not_requeue_a_refused_crash_loop(tmp_path: Path) -> None:
    """The README's sbatch script, srun stubbed to end as a refused restart() does (status 65): no requeue, one
    line saying why, and the job ends with 65."""
    from doclines import blocks

    (script,) = [b.astext() for b in blocks(REPO / "README.rst", "bash")]
    (tmp_path / "job.sh").write_text(script)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("srun", f"exit {CRASH_LOOP_EXIT}"), ("scontrol", f'echo "$@" >> {tmp_path / "called.txt"}')):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {**ENV, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"}
    done = subprocess.run(["bash", "job.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == CRASH_LOOP_EXIT, done.stderr
    assert "crash loop (status 65): not requeueing job 7" in done.stdout
    assert not (tmp_path / "called.txt").exists()
