"""Sphinx configuration of the candle_ckpt documentation site.

Build (warnings are errors, as .ci/run builds it)::

    python3 -m sphinx -W --keep-going -b html docs docs/_build/html

The pages are docs/*.rst as they are read on the repository (plain reStructuredText that docutils
alone also reads; tests/integration/e2e/test_readme.py checks that); index.rst (the table of contents)
and reference.rst (the API reference, from the public docstrings and the parameter schema) are the
only pages that need Sphinx. A new page in docs/ joins the site by itself (index.rst's glob).
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
release = version = candle_ckpt.__version__
root_doc = "index"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "candle_docs"]
exclude_patterns = ["_build", "_ext"]
html_theme = "alabaster"
html_title = f"candle_ckpt {release}"
# Google-style docstrings (DESIGN.md); the signatures carry the types.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Only what docs/reference.rst names is documented; a name it cannot import is an error (-W).
nitpicky = False
