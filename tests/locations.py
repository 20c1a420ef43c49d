"""Where things are, for every test and job script, wherever its own file sits.

``tests/conftest.py`` puts this folder and :data:`JOBS` on ``sys.path``, so a
test imports these paths (``from locations import REPO``) and the job scripts'
helpers (``from testkit import build_model``) by name, never by ``parents[N]``.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PACKAGE = REPO / "candle_ckpt"
# The scripts the integration tests run as subprocesses or load by path.
JOBS = TESTS / "integration" / "jobs"
# JSON figures some tests write for the docs (git-ignored).
FIGURES = TESTS / ".figures"


def job_script(name: str) -> Path:
    """Return the path of the job script ``name`` (e.g. ``"crash_job.py"``), which must exist."""
    path = JOBS / name
    if not path.is_file():
        raise FileNotFoundError(f"no job script {name!r} in {JOBS}")
    return path
