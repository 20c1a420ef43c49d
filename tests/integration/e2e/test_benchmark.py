"""Smoke test of benchmarks/bench_checkpoint.py: a tiny run produces the table and JSON of the full one.

No timing is asserted: only that every contender, limit, restart figure and
target is measured and computed (PASS/FAIL from numbers, never hand-written).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from locations import REPO

SCRIPT = REPO / "benchmarks" / "bench_checkpoint.py"
CONTENDERS = {
    "ModelCheckpoint (.keras, default)",
    "ModelCheckpoint (.weights.h5)",
    "BackupAndRestore (defaults)",
    "OrbaxCheckpoint (defaults)",
    "candle_ckpt sync (defaults)",
    "candle_ckpt sync, weights only",
    "candle_ckpt async (defaults)",
    "candle_ckpt async, weights only",
}


def test_tiny_benchmark_run_writes_every_row_and_computed_targets(tmp_path: Path) -> None:
    """At 2 MiB and 2 epochs the script prints the table and writes JSON with every contender and 5 targets."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, str(SCRIPT), "--sizes", "2", "--epochs", "2", "--reps", "1", "--no-memory", "--no-plot"]
    proc = subprocess.run(
        [*cmd, "--out", str(out), "--dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "median stall per epoch end (ms)" in proc.stdout and "targets at 2 MiB:" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result) >= {"command", "machine", "sizes", "loadavg_end"}
    (size,) = result["sizes"].values()
    assert set(size["contenders"]) == CONTENDERS
    for name, row in size["contenders"].items():
        if "skipped" in row:  # only Orbax, and only without the bench extra
            assert name == "OrbaxCheckpoint (defaults)" and result["machine"]["orbax_checkpoint"] is None
            continue
        assert len(row["stalls"]) == 2 and row["stall_s"] > 0, name
    assert size["limits"]["snapshot_memcpy_in_fit_s"] > 0 and size["limits"]["raw_h5py_write_fsync_in_fit_s"] > 0
    assert set(size["restart"]) == {"candle_restart_s", "candle_restart_weights_only_s", "keras_load_weights_s"}
    assert len(size["targets"]) == 5
    for t in size["targets"]:
        if t["ratio"] is None:
            assert t["pass"] is None
        else:
            assert t["pass"] == (t["ratio"] <= t["limit"]), t
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]  # the checkpoints were removed


def test_published_tables_are_the_report_of_the_committed_run(monkeypatch) -> None:
    """docs/performance.rst and README tables and plot are --rst-from output and the plot of the JSON named."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import bench_report

    docs = (REPO / "docs" / "performance.rst").read_text()
    (named,) = set(re.findall(r"\(JSON: ``(benchmarks/results/[^`]+\.json)``", docs))
    tables = bench_report.rst(json.loads((REPO / named).read_text()))
    assert tables in docs, f"the tables in docs/performance.rst are not the report of {named}"
    assert named.replace(".json", ".png") in docs and (REPO / named.replace(".json", ".png")).is_file()
    readme = (REPO / "README.rst").read_text()
    stalls, largest = tables.split("\n\n")[0], tables[tables.rindex("Targets at") :].split("\n", 2)[2]
    assert stalls in readme and largest.strip() in readme, "README's tables are not the committed run's"
    assert f".. image:: {named.replace('.json', '.png')}" in readme
