"""The built site, opened in a real headless Chromium: the pages a new user reads first render with their headings,
and none of their local links is broken.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it with apt-get; where it cannot, this test skips
and says so). The DOM is Chromium's after the theme's scripts ran (``--dump-dom``), not the HTML file as written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from test_docs_site import DOCS, build

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (Debian: apt-get install chromium, as .ci/run does)"
)
# Each page a new user opens first: its title (h1) and the section headings (h2) it must show.
PAGES = {
    "index.html": ("candle_ckpt", ["Getting started", "User guides", "Reference", "Internals"]),
    "getting-started.html": ("Getting started", ["Install and run the demo", "Quickstart", "Where to go next"]),
    "reference.html": ("API reference", ["Training with checkpoints", "CANDLE compatibility", "Parameters", "Errors"]),
}


class _Page(HTMLParser):
    """Headings (tag, text), the ids, and the hrefs of a page's DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self._heading: tuple[str, list[str]] | None = None
        self._caption: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])
        if tag in ("h1", "h2"):
            self._heading = (tag, [])
        if tag == "p" and "caption" in (attrs.get("class") or "").split():  # a toctree's caption
            self._caption = []

    def handle_endtag(self, tag: str) -> None:
        if self._heading and tag == self._heading[0]:
            self.headings.append((tag, "".join(self._heading[1]).strip().rstrip("#").strip()))
            self._heading = None
        if tag == "p" and self._caption is not None:
            self.headings.append(("caption", "".join(self._caption).strip()))
            self._caption = None

    def handle_data(self, data: str) -> None:
        if self._heading:
            self._heading[1].append(data)
        if self._caption is not None:
            self._caption.append(data)


def dump_dom(page: Path, profile: Path) -> str:
    """The page's DOM as headless Chromium renders it (scripts run), from its file:// URL."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
               "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-3000:]
    return done.stdout


def parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def test_first_pages_render_in_chromium_with_their_headings_and_no_broken_local_link(tmp_path: Path) -> None:
    """Home, Getting started and the API reference, rendered by Chromium, show their title and sections (the home
    page its four tables of contents), and every local link on them leads to a file that exists and, with an
    anchor, to an element of that id there."""
    site = tmp_path / "html"
    done = build(DOCS, site)
    assert done.returncode == 0, done.stderr[-5000:]
    broken, checked = [], 0
    for name, (title, sections) in PAGES.items():
        dom = parse(dump_dom(site / name, tmp_path / "profile"))
        assert ("h1", title) in dom.headings, dom.headings
        shown = [text for tag, text in dom.headings if tag in ("h2", "caption")]
        assert all(s in shown for s in sections), (name, shown)
        for href in dom.hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("javascript:", "mailto:")):
                continue
            target = (site / name).parent / unquote(parts.path) if parts.path else site / name
            checked += 1
            if not target.is_file():
                broken.append(f"{name}: {href} (no file)")
            elif parts.fragment and target.suffix == ".html":
                ids = dom.ids if target == site / name else parse(target.read_text()).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{name}: {href} (no id {parts.fragment})")
    assert broken == [] and checked > 100, (broken, checked)  # the sidebar alone links 20 pages from each
