"""Every test that skips outside a JAX pass is run by one: .ci/run names its file.

A test file that skips itself unless ``KERAS_BACKEND=jax`` runs only where .ci/run runs it with that backend; one
it forgot would skip in CI for ever and hide what it checks (test_jax_auto_steps and test_jax_hang were once).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JAX_ONLY = re.compile(r'os\.environ\.get\("KERAS_BACKEND"\) != "jax"')


def jax_only_files() -> list[str]:
    files = sorted(ROOT.glob("tests/**/test_*.py"))
    return [str(f.relative_to(ROOT)) for f in files if JAX_ONLY.search(f.read_text())]


def test_the_jax_only_files_are_found() -> None:
    assert "tests/integration/distributed/test_jax_multiprocess.py" in jax_only_files()


def test_every_jax_only_test_file_runs_in_a_jax_pass_of_ci() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    jax_lines = " ".join(line for line in script.replace("\\\n", " ").splitlines() if "KERAS_BACKEND=jax" in line)
    missing = [name for name in jax_only_files() if name not in jax_lines]
    assert not missing, f"skipped outside a JAX pass, and .ci/run runs none of them in one: {missing}"
