"""docs/ builds as a Sphinx site with warnings as errors (as .ci/run builds it), API reference included.

The site is docs/*.rst as they are, docs/index.rst (four captioned tables of contents in reading order:
a page none of them lists fails here) and docs/reference.rst (autodoc of every public name, and the
parameters table that docs/_ext/candle_docs.py generates from candle_ckpt/config/schema.py).
docs/getting-started.rst holds the README's set-up and Quickstart word for word (checked here).
tests/integration/e2e/test_docs_browser.py opens the built site in headless Chromium.
"""

from __future__ import annotations

import configparser
import html
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import docutils.nodes
import pytest
from doclines import blocks, doctree, pages, unlinked_page_mentions
from locations import REPO

import candle_ckpt
from candle_ckpt.config.schema import SPECS

DOCS = REPO / "docs"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "3"}
PUBLIC = tuple(candle_ckpt.__all__)  # every public name has an entry in the API reference
# The tables of contents of docs/index.rst, in order: (caption, its pages in reading order).
CONTENTS = (
    ("Getting started", ["getting-started"]),
    ("User guides", ["exactness", "preemption", "async", "campaigns", "remote", "multi-worker", "jobrunner", "api",
                     "backends", "migrating", "cli"]),
    ("Reference", ["parameters", "reference", "format"]),
    ("Internals", ["architecture", "guarantees", "performance", "benchmarks"]),
)  # fmt: skip


def build(source: Path, out: Path) -> subprocess.CompletedProcess:
    """The build command of .ci/run (and README), on ``source``."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(source), str(out)]
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)


def text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/ built once (as .ci/run builds it) for the tests of the built pages."""
    out = tmp_path_factory.mktemp("site")
    done = build(DOCS, out)
    assert done.returncode == 0, done.stderr[-5000:]
    return out


def test_docs_build_with_warnings_as_errors_and_hold_the_api_reference(site: Path) -> None:
    """`sphinx-build -W` of docs/ succeeds; every docs/*.rst is a page of it; the reference documents each
    public name of ``candle_ckpt.__all__`` (its signature, from the code) and every schema key with its accepted
    values; the pages' links to each other's .rst files lead to the built pages."""
    tmp_path = site
    built = {p.stem for p in tmp_path.glob("*.html")}
    assert {p.stem for p in DOCS.glob("*.rst")} <= built, sorted(built)
    raw = (tmp_path / "reference.html").read_text()
    assert all(f'id="candle_ckpt.{name}"' in raw for name in PUBLIC), [
        n for n in PUBLIC if f'"candle_ckpt.{n}"' not in raw
    ]
    for member in ("train", "step_end", "capture", "restore", "reads", "stats"):  # listed, so rendered
        assert f'id="candle_ckpt.JobRunner.{member}"' in raw, member
    reference = text(tmp_path / "reference.html")
    assert "candle_ckpt.restart(gParameters" in reference  # the signature, read from the code
    for spec in SPECS:
        assert spec.key in reference and spec.allowed in reference, spec.key
    index = (tmp_path / "index.html").read_text()
    assert all(f'href="{p.stem}.html"' in index for p in DOCS.glob("*.rst") if p.stem != "index"), index
    assert 'href="multi-worker.html"' in (tmp_path / "jobrunner.html").read_text()  # was `multi-worker.rst`
    assert not re.search(r'href="(?!_sources/)[^"#]*\.rst[#"]', "".join(p.read_text() for p in tmp_path.glob("*.html")))


def test_a_link_to_a_missing_page_or_a_stale_api_name_fails_the_build(tmp_path: Path) -> None:
    """The extension makes a link to a .rst file that is no page a build error under -W, and a name autodoc
    cannot import is one too (a renamed function), each naming what is wrong; a member an autoclass lists that
    autodoc does not render (private, undocumented or gone) stops the build even without -W, naming each."""
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
    (source / "page.rst").write_text("Page\n====\n\n.. autoclass:: candle_ckpt.JobRunner\n   :members: train, _gone, "
                                     "rewind\n")  # fmt: skip
    members = build(source, tmp_path / "out1")
    assert members.returncode != 0
    assert (
        "page.rst lists members that autodoc did not render (no docstring, or no such member): "
        "candle_ckpt.JobRunner._gone, candle_ckpt.JobRunner.rewind" in members.stderr
    ), members.stderr
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
        assert "sphinx-book-theme" in cfg["options.extras_require"][extra], extra  # docs/conf.py's html_theme


def toctrees() -> list[tuple[str, list[str]]]:
    """docs/index.rst's tables of contents: (caption, entries), in order; a ``:glob:`` one fails."""
    found = []
    for block in re.split(r"^\.\. toctree::\n", (DOCS / "index.rst").read_text(), flags=re.MULTILINE)[1:]:
        body = re.match(r"((?:[ \t]+.*\n|\n)*)", block).group(1)
        assert ":glob:" not in body, "a glob lists the pages alphabetically: name them in reading order"
        caption = re.search(r":caption: (.+)", body)
        entries = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith(":")]
        found.append((caption.group(1) if caption else "", entries))
    return found


def test_every_page_is_in_one_captioned_table_of_contents_in_reading_order() -> None:
    """index.rst names every other docs/*.rst exactly once, in four captioned tables of contents: Getting started,
    the user guides in reading order, the reference, the internals (a new page no table names fails here)."""
    assert [(caption, entries) for caption, entries in toctrees()] == [(c, e) for c, e in CONTENTS]
    named = [e for _, entries in toctrees() for e in entries]
    assert sorted(named) == sorted(p.stem for p in DOCS.glob("*.rst") if p.stem != "index"), named


def test_getting_started_holds_the_readmes_setup_and_quickstart_word_for_word() -> None:
    """docs/getting-started.rst's Python block is the README's Quickstart, and its two set-up commands are the
    README's (the README's are run by test_readme.py): the site's first page cannot drift from the README."""
    readme, page = REPO / "README.rst", DOCS / "getting-started.rst"
    assert [b.astext() for b in blocks(page, "python")] == [b.astext() for b in blocks(readme, "python")]
    plain = [b.astext() for b in blocks(page) if not b.get("classes")]
    setup = [b.astext() for b in blocks(readme) if not b.get("classes") and "pip install" in b.astext()]
    assert len(setup) == 2 and plain == setup, (plain, setup)


@pytest.mark.parametrize("path", pages(), ids=[p.name for p in pages()])
def test_a_page_mentions_another_only_as_a_link_and_shows_no_literal_in_bold(path: Path) -> None:
    """Every mention of another page (``docs/format.rst``) outside code is a link, and no bold or italic text holds
    double backticks (reStructuredText does not nest them: they would show as literal backticks, in bold)."""
    assert unlinked_page_mentions(path) == []
    for node in doctree(path).findall(lambda n: isinstance(n, (docutils.nodes.strong, docutils.nodes.emphasis))):
        assert "``" not in node.astext(), f"{path.name}:{node.line}: {node.astext()}"


class _Literals(HTMLParser):
    """The inline literals of a built page, each with whether it sits inside a link."""

    def __init__(self) -> None:
        super().__init__()
        self.links, self.code, self.text, self.found = 0, 0, [], []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "a":
            self.links += 1
        elif tag == "code" and "literal" in (dict(attrs).get("class") or ""):
            self.code, self.text = self.code + 1, []
            self.linked = self.links > 0

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self.links -= 1
        elif tag == "code" and self.code:
            self.code -= 1
            self.found.append(("".join(self.text), self.linked))

    def handle_data(self, data: str) -> None:
        if self.code:
            self.text.append(data)


def test_every_mention_of_a_public_name_links_to_its_api_entry_and_the_chrome_is_right(site: Path) -> None:
    """On every built page an inline literal naming a public name (``restart()``, ``candle.JobRunner``) is a link
    (the extension adds it); the footer names the copyright holder; no page in the sidebar is named after the
    deprecated ``ckpt_upload_url``."""
    unlinked = []
    for page in sorted(site.glob("*.html")):
        parser = _Literals()
        parser.feed(page.read_text())
        for literal, linked in parser.found:
            name = literal.strip().split("(", 1)[0].removeprefix("candle_ckpt.").removeprefix("candle.")
            if name in PUBLIC and not linked:
                unlinked.append(f"{page.name}: {literal}")
    assert unlinked == []
    index = (site / "index.html").read_text()
    assert "Copyright 2026, candle_ckpt contributors" in index and "©. |" not in text(site / "index.html")
    sidebar = re.search(r'<nav class="bd-links bd-docs-nav.*?</nav>', index, re.DOTALL).group(0)
    assert "Getting started" in sidebar and "ckpt_upload_url" not in sidebar
    assert 'href="reference.html#candle_ckpt.restart"' in (site / "getting-started.html").read_text()
