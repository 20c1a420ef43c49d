"""docs/ builds as a Sphinx site with warnings as errors (as .ci/run builds it), API reference included.

The site is docs/*.rst as they are, docs/index.rst (a glob table of contents: a new page joins by
itself) and docs/reference.rst (autodoc of the public names, and the parameters table that
docs/_ext/candle_docs.py generates from candle_ckpt/config/schema.py).
"""

from __future__ import annotations

import configparser
import html
import os
import re
import subprocess
import sys
from pathlib import Path

from locations import REPO

from candle_ckpt.config.schema import SPECS

DOCS = REPO / "docs"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "3"}
PUBLIC = ("CandleCheckpointCallback", "restart", "load_weights", "JobRunner", "WorkerTrainingState",
          "ckpt_parser", "ckpt_defs", "CheckpointError", "CorruptCheckpoint", "NoValidCheckpoint",
          "ModelMismatch", "LayoutMismatch", "DirectoryLocked", "CheckpointSaveError",
          "CheckpointUploadError", "GroupTimeout")  # fmt: skip


def build(source: Path, out: Path) -> subprocess.CompletedProcess:
    """The build command of .ci/run (and README), on ``source``."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(source), str(out)]
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)


def text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_docs_build_with_warnings_as_errors_and_hold_the_api_reference(tmp_path: Path) -> None:
    """`sphinx-build -W` of docs/ succeeds; every docs/*.rst is a page of it; the reference documents each
    public name (its signature, from the code) and every schema key with its accepted values; the pages'
    links to each other's .rst files lead to the built pages."""
    done = build(DOCS, tmp_path)
    assert done.returncode == 0, done.stderr[-5000:]
    built = {p.stem for p in tmp_path.glob("*.html")}
    assert {p.stem for p in DOCS.glob("*.rst")} <= built, sorted(built)
    raw = (tmp_path / "reference.html").read_text()
    assert all(f'id="candle_ckpt.{name}"' in raw for name in PUBLIC), [n for n in PUBLIC if n not in raw]
    reference = text(tmp_path / "reference.html")
    assert "candle_ckpt.restart(gParameters" in reference  # the signature, read from the code
    for spec in SPECS:
        assert spec.key in reference and spec.allowed in reference, spec.key
    index = (tmp_path / "index.html").read_text()
    assert all(f'href="{p.stem}.html"' in index for p in DOCS.glob("*.rst") if p.stem != "index"), index
    assert 'href="multi-worker.html"' in (tmp_path / "jobrunner.html").read_text()  # was `multi-worker.rst`
    assert not re.search(r'href="[^"#]*\.rst[#"]', "".join(p.read_text() for p in tmp_path.glob("*.html")))


def test_a_link_to_a_missing_page_or_a_stale_api_name_fails_the_build(tmp_path: Path) -> None:
    """The extension makes a link to a .rst file that is no page a build error under -W, and a name autodoc
    cannot import is one too (a renamed function), each naming what is wrong."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text(
        f"import sys\nsys.path[:0] = [{str(REPO)!r}, {str(DOCS / '_ext')!r}]\n"
        'extensions = ["sphinx.ext.autodoc", "candle_docs"]\n'
    )
    (source / "index.rst").write_text("Index\n=====\n\n.. toctree::\n   :glob:\n\n   *\n")
    (source / "page.rst").write_text("Page\n====\n\nSee `the index <index.rst>`_ and `gone <gone.rst#x>`_.\n\n"
                                     ".. autofunction:: candle_ckpt.restart_everything\n")  # fmt: skip
    done = build(source, tmp_path / "out")
    assert done.returncode != 0
    assert "link to gone.rst#x: no such page in docs/" in done.stderr, done.stderr
    assert "restart_everything" in done.stderr, done.stderr
    (source / "page.rst").write_text("Page\n====\n\nSee `the index <index.rst>`_.\n")
    again = build(source, tmp_path / "out2")
    assert again.returncode == 0, again.stderr
    assert 'href="index.html"' in (tmp_path / "out2" / "page.html").read_text()


def test_the_readme_and_ci_build_this_site() -> None:
    """README's one line builds docs/ into docs/_build/html (with the docs extra, which brings Sphinx) and opens
    its index.html; .ci/run builds it with warnings as errors (the command of :func:`build`)."""
    readme = (REPO / "README.rst").read_text()
    assert "``python3 -m sphinx -b html docs docs/_build/html``, open ``docs/_build/html/index.html``" in readme
    assert "python3 -m sphinx -W --keep-going -q -b html docs " in (REPO / ".ci" / "run").read_text()
    assert "docs/_build/" in (REPO / ".gitignore").read_text().splitlines()
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    for extra in ("docs", "test"):  # the README's test command builds the site too (the test above)
        assert "sphinx" in cfg["options.extras_require"][extra], extra
