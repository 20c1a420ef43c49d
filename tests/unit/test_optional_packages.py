"""Every test that needs an optional package (jax, torch, orbax, grain: the ``test`` extra installs none of them) says
so, so that the README's test command, in a venv made from the README alone, skips it with a reason instead of failing.

Read as text (nothing is imported): a test file that imports one of them, or starts a job under
``KERAS_BACKEND=jax``/``torch``, and a test file that runs a job script which imports one, must skip without it:
``pytest.importorskip("jax")`` at the top, or the ``needs_package("jax")`` marker (tests/conftest.py). .ci/run runs
the marked tests once in such a venv (``-m needs_package``).
"""

from __future__ import annotations

import re

from locations import JOBS, TESTS

OPTIONAL = ("jax", "torch", "orbax", "grain")
USES = {
    name: re.compile(
        rf"^\s*(?:import|from) {name}\b"  # an import, at any depth
        rf"|KERAS_BACKEND\W{{1,6}}{name}\b"  # KERAS_BACKEND="jax", {"KERAS_BACKEND": "jax"}, in a shell
        rf"|pytest\.param\(\"{name}\"|parametrize\(\"backend\", \[[^]]*\"{name}\"",  # a backend parameter
        re.MULTILINE,
    )
    for name in OPTIONAL
}
# Files that name a package without needing it, and why.
EXEMPT = {
    "cli/test_console.py": "checks that the demo's error names KERAS_BACKEND=jax where TensorFlow is blocked",
    "keras/test_backend_rng.py": "its jax case asks keras/pipeline_state's RNG part, which imports nothing for jax",
    "keras/test_keras_format.py": "its JAX test skips unless KERAS_BACKEND=jax, set by .ci/run's JAX pass",
    "unit/test_ci_passes.py": "reads test files and .ci/run as text for the KERAS_BACKEND=jax skip; imports no jax",
}


def declares(text: str, name: str) -> bool:
    """Whether a test file skips without ``name``: importorskip of it, or the needs_package marker naming it."""
    return (
        f'importorskip("{name}' in text
        or re.search(rf"needs_package\([^)]*\"{name}\"", text) is not None
        or (
            "on(" in text and "needs_package(*optional)" in text  # test_backends.py's helper marks each backend
        )
    )


def test_every_test_needing_an_optional_package_skips_without_it() -> None:
    """Each test file using jax, torch or orbax (itself, or through a job script it runs) declares it, so that it
    skips, naming the package, where the package is missing."""
    jobs = {p.name: {n for n in OPTIONAL if USES[n].search(p.read_text())} for p in JOBS.glob("*.py")}
    undeclared = []
    for path in sorted((TESTS / "integration").rglob("test_*.py")) + sorted((TESTS / "unit").rglob("test_*.py")):
        rel = path.relative_to(path.parents[1]).as_posix()
        if path.name == "test_optional_packages.py" or rel in EXEMPT:
            continue
        text = path.read_text()
        needed = {n for n in OPTIONAL if USES[n].search(text)}
        needed |= {n for job, names in jobs.items() if job in text for n in names}
        undeclared += [f"{rel}: {n}" for n in sorted(needed) if not declares(text, n)]
    assert undeclared == [], "add pytest.importorskip or @pytest.mark.needs_package for: " + ", ".join(undeclared)
