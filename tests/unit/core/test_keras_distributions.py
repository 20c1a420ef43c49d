"""keras and keras-nightly installed over each other are named, once, in one line (issue 40, item 9).

Each case runs a fresh Python with a folder of fake distributions (``*.dist-info/METADATA``) first on
``sys.path``: both in one folder is what ``pip install`` of a package requiring ``keras`` does beside
keras-nightly; the nightly alone in a folder of its own (shadowing the system's keras) is CI's nightly
virtual environment, which is fine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doclines import DOCS, blocks, shape
from locations import REPO

# Two public names, as a script takes them: the line must come once, not once per name.
USE = "import sys; sys.path.insert(0, sys.argv[1]); import candle_ckpt; candle_ckpt.ckpt_parser; candle_ckpt.param"


def fake(folder: Path, name: str, version: str) -> None:
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def stderr_lines(folder: Path) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", USE, str(folder)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_keras_and_keras_nightly_in_one_folder_are_named_once_in_one_line(tmp_path: Path) -> None:
    """Both distributions in one folder: one console line, the candle_ckpt WARNING prefix, both versions, and the
    way out (uninstall both, keep one, install with --no-deps), of the shape docs/api.rst shows."""
    fake(tmp_path, "keras", "3.15.1")
    fake(tmp_path, "keras-nightly", "3.16.0.dev0")
    lines = [line for line in stderr_lines(tmp_path) if "installed over each other" in line]
    assert len(lines) == 1, lines
    (line,) = lines
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,?\d* candle_ckpt WARNING: keras 3\.15\.1 and keras-nightly "
                    r"3\.16\.0\.dev0 are installed over each other", line), line  # fmt: skip
    assert "pip uninstall -y keras keras-nightly" in line and "pip install --no-deps" in line
    (example,) = [b.astext() for b in blocks(DOCS / "api.rst") if "installed over each other" in b.astext()]
    assert shape(line).startswith(shape(example.split("...")[0])), (example, line)


@pytest.mark.parametrize("names", [("keras-nightly",), ()], ids=["nightly-in-a-folder-of-its-own", "nothing-added"])
def test_a_keras_in_another_folder_is_no_mix_and_nothing_is_said(tmp_path: Path, names: tuple[str, ...]) -> None:
    """keras-nightly in a folder of its own before the installed keras (CI's nightly venv), or no fake at all:
    nothing is said."""
    for name in names:
        fake(tmp_path, name, "3.16.0.dev0")
    assert not [line for line in stderr_lines(tmp_path) if "installed over each other" in line]
