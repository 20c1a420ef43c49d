"""Smoke test of benchmarks/bench_scale.py: a tiny run prints the table and writes every figure of the full one.

No timing is asserted (a shared machine): only that each N's row, the counts that grow with N and both
restores are measured, and that the targets are computed from them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import REPO

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

pytestmark = [pytest.mark.slow, pytest.mark.scale]  # two small multi-process jobs (their own JAX processes: any pass)

SCRIPT = REPO / "benchmarks" / "bench_scale.py"


def test_tiny_scale_benchmark_writes_every_row_and_target(tmp_path: Path) -> None:
    """At N = 1 and 2, 20 steps: a row per N with step medians, keys, files, parts, commit and both restores."""
    cmd = [sys.executable, str(SCRIPT), "--n", "1", "2", "--steps", "20", "--base-steps", "10", "--epoch-steps", "10"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([*cmd, "--no-stall", "--out-dir", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step w/o ms" in proc.stdout and "targets at N=2: ratio " in proc.stdout, proc.stdout
    (path,) = tmp_path.glob("scale-*.json")
    report = json.loads(path.read_text())
    assert [r["processes"] for r in report["rows"]] == [1, 2] and report["stall"] is None
    for row in report["rows"]:
        assert all(row["median_step_s"][k] > 0 for k in ("without", "with", "orbax")), row
        assert row["steps_with_callback"] == 20 and row["saves"] == 2, row
        assert row["restart_s"] > 0 and row["orbax_restore_s"] > 0 and row["commit_s"] > 0, row
        assert len(row["part_bytes"]) == row["processes"] and row["largest_writer_bytes"] == max(row["part_bytes"])
    one, two = report["rows"]
    assert one["keys_left"] == 0 and isinstance(two["keys_left"], int)
    assert two["files_per_checkpoint"] == 10  # 4 shared + a part, its index and a loop state per process
