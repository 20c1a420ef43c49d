"""JAX's persistent compilation cache in the fast tier (``ckpt_compile_cache``): a restart reads its compiles back.

Real jobs in fresh processes on the JAX backend (``jobs/compile_cache_job.py``). What is asserted is what JAX
itself reports (its cache directory setting, its "cache hit" log lines and events) and the files on disk; never
a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import REPO, job_script
from pace import wait_s

pytest.importorskip("jax")

JOB = str(job_script("compile_cache_job.py"))


def run_job(directory: Path, epochs: int, *args: str) -> dict:
    """Run the job to ``epochs`` in ``directory`` on JAX; return its RESULT document."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, JOB, str(directory), str(epochs), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=wait_s(60),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    """``python -m candle_ckpt ARGS``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-m", "candle_ckpt", *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )


def entries(directory: Path) -> list[str]:
    """The compiled executables in a JAX cache directory (JAX names each ``<module>-<key>-cache``)."""
    return sorted(p.name for p in directory.glob("*-cache")) if directory.is_dir() else []


def test_a_restart_reads_fits_compiles_from_the_cache_beside_the_checkpoints(tmp_path: Path) -> None:
    """At the defaults on JAX, the first run fills <ckpts>/compile-cache (every compile, JAX's 1 s threshold set
    to 0) and the restarted run finds its train and test steps there; the checkpoints' commands and the drain to
    the persistent tier ignore the directory."""
    job, persistent = tmp_path / "job", tmp_path / "persistent"
    cache = job / "ckpts" / "compile-cache"
    first = run_job(job, 1, f"ckpt_persistent_url={persistent}")
    assert first["cache_dir"] == str(cache) and first["min_compile_secs"] == 0.0
    assert first["hits"] == [] and first["hit_events"] == 0
    written = entries(cache)
    assert any(name.startswith("jit_train_step-") for name in written), written

    second = run_job(job, 2, f"ckpt_persistent_url={persistent}")
    assert {"jit_train_step", "jit_test_step"} <= set(second["hits"]), second["hits"]
    assert second["hit_events"] == len(second["hits"])

    listed = json.loads(cli("list", job, "--json").stdout)
    assert [c["epoch"] for c in listed["checkpoints"]] == [1, 2]
    assert cli("verify", job).returncode == 0
    pruned = cli("prune", job, "--keep-limit", "1")
    assert pruned.returncode == 0, pruned.stderr
    assert "compile-cache" not in pruned.stdout
    assert set(written) <= set(entries(cache))
    assert list(persistent.rglob("ckpt-info.json")), "the drain copied no checkpoint"
    assert not [p for p in persistent.rglob("*") if "compile-cache" in p.name or p.name.endswith("-cache")]


def test_a_cache_directory_the_job_set_is_kept(tmp_path: Path) -> None:
    """A job that gave JAX its own cache directory keeps it (and JAX's threshold); nothing goes beside the
    checkpoints."""
    own = tmp_path / "own-cache"
    result = run_job(tmp_path / "job", 1, "--own-cache", str(own))
    assert result["cache_dir"] == str(own) and result["min_compile_secs"] == 1.0
    assert not (tmp_path / "job" / "ckpts" / "compile-cache").exists()


@pytest.mark.parametrize("setting", ["off", "DIR"])
def test_off_leaves_jax_alone_and_a_directory_is_used(setting: str, tmp_path: Path) -> None:
    """ckpt_compile_cache=off sets no cache directory; a directory given there is the one JAX fills."""
    chosen = tmp_path / "chosen"
    value = str(chosen) if setting == "DIR" else setting
    result = run_job(tmp_path / "job", 1, f"ckpt_compile_cache={value}")
    assert not (tmp_path / "job" / "ckpts" / "compile-cache").exists()
    if setting == "off":
        assert result["cache_dir"] is None and not chosen.exists()
    else:
        assert result["cache_dir"] == str(chosen)
        assert any(name.startswith("jit_train_step-") for name in entries(chosen))
