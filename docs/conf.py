"""Sphinx configuration of the candle_ckpt documentation site.

Build (warnings are errors, as .ci/run builds it)::

    python3 -m sphinx -W --keep-going -b html docs docs/_build/html

The pages are docs/*.rst as they are read on the repository (plain reStructuredText that docutils
alone also reads; tests/integration/e2e/test_readme.py checks that); index.rst (the tables of contents)
and reference.rst (the API reference, from the public docstrings and the parameter schema) are the
only pages that need Sphinx. index.rst lists the pages in reading order, in four tables of contents
(getting started, user guides, reference, internals); a page in docs/ that none lists fails
tests/integration/e2e/test_docs_site.py.

The theme is sphinx-book-theme: the sites of JAX, Flax and Orbax (the anchors this library's users
read, DESIGN.md) use it, so its layout (the pages on the left, the page's sections on the right, a
search box) is the one they know; it is maintained (pydata-sphinx-theme underneath) and builds
warning-free. docs/_static/candle.css wraps long code lines and wide tables instead of scrolling them
sideways in its narrow column.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]  # this checkout's candle_ckpt, and our extension
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # autodoc imports Keras (and so TensorFlow)
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import candle_ckpt  # noqa: E402

project = "candle_ckpt"
author = "candle_ckpt contributors"
copyright = f"2026, {author}"  # noqa: A001 (Sphinx's name); the footer read "(c). |" without it
release = version = candle_ckpt.__version__
root_doc = "index"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "candle_docs"]
exclude_patterns = ["_build", "_ext"]
html_theme = "sphinx_book_theme"
html_title = f"candle_ckpt {release}"
html_static_path = ["_static"]
html_css_files = ["candle.css"]
html_theme_options = {
    "show_toc_level": 2,  # the page's sections and their subsections, on the right
    "home_page_in_toc": True,
}
# Google-style docstrings (DESIGN.md); the signatures carry the types.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Only what docs/reference.rst names is documented; a name it cannot import is an error (-W).
nitpicky = False
