"""``candle_ckpt.core.stderr``: TensorFlow's start-up lines dropped from what a body writes to descriptor 2, the
rest written back, in a child process (the descriptor is the process's own)."""

from __future__ import annotations

import os
import subprocess
import sys

from locations import REPO

from candle_ckpt.core.stderr import without_startup_lines

STARTUP = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795889233.585010   12864 port.cc:153] oneDNN custom operations are on.\n"
    "E0000 00:00:1795889236.515578   12864 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
    "I0000 00:00:1795889233.646014   12864 cpu_feature_guard.cc:227] This TensorFlow binary is optimized.\n"
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate "
    "compiler flags.\n"
)
CHILD = """
import os, sys
from candle_ckpt.core.stderr import tf_startup_lines_dropped
with tf_startup_lines_dropped():
    os.write(2, sys.argv[1].encode())
    print("the job's own line", file=sys.stderr)
    if sys.argv[2] == "raise":
        raise SystemExit(3)
"""


def child(level: str | None, then: str = "end") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | {"PYTHONPATH": str(REPO)}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    return subprocess.run([sys.executable, "-c", CHILD, STARTUP, then], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_start_up_lines_are_dropped_and_the_rest_is_written_back() -> None:
    """With TF_CPP_MIN_LOG_LEVEL unset or 1 (``import jax`` sets 1), the body's start-up lines are gone and its own
    line comes through; with 0 (asked for) everything comes through; a body that raises shows all it wrote."""
    for level in (None, "1", "3"):
        done = child(level)
        assert done.returncode == 0 and done.stderr == "the job's own line\n", (level, done.stderr)
    assert child("0").stderr == STARTUP + "the job's own line\n"
    failed = child(None, "raise")
    assert failed.returncode == 3 and failed.stderr == STARTUP + "the job's own line\n", failed.stderr


def test_only_the_lines_written_before_logging_starts_match() -> None:
    """A line of TensorFlow's logging once it runs (a real date), a Python warning and a log line of ours stay."""
    kept = (
        "I1128 18:07:17.534000   12864 some_op.cc:10] a real log line\n"
        "UserWarning: something\n"
        "2026-11-28 18:07:17,534 candle_ckpt INFO: epoch 1: saved 001 (best)\n"
    )
    assert without_startup_lines(STARTUP + kept) == kept
