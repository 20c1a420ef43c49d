"""README's and docs/'s examples, read as docutils reads them, and compared with what real runs print.

The one mechanism that keeps the pages from drifting (issue 27): tests/integration/e2e/test_readme.py
runs README's blocks, test_doc_consoles.py runs docs/cli.rst's console examples, and a test that
produces a log line a page shows as an example checks it here with :func:`assert_log_example`
(:data:`LOG_EXAMPLES` says which test checks which example; test_doc_consoles checks the table).
A real line has the example's shape when its words and layout are the same: numbers, CRCs, times
and byte units (which change from run to run) only have to be numbers, CRCs, times and units, and
``...`` in an example stands for anything (a path).
"""

from __future__ import annotations

import re
from pathlib import Path

import docutils.core
import docutils.nodes
from locations import REPO

DOCS = REPO / "docs"
# The pages only Sphinx reads: the site's table of contents and the generated API reference (docs/conf.py).
# Every other docs/*.rst is plain reStructuredText, read on the repository, and checked here with docutils alone.
SPHINX_ONLY = ("index.rst", "reference.rst")
DOC_JOB = "/home/me/job"  # the job folder the docs' console examples show (a real run's is put in its place)
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# (page, the example's first words) -> the test that produces the line and calls assert_log_example.
LOG_EXAMPLES = {
    ("exactness.rst", "WARNING the run is finished"): "tests/integration/keras/test_exact_resume.py",
    ("exactness.rst", "WARNING this fit() saves into"): "tests/integration/keras/test_phases.py",
    ("exactness.rst", "WARNING restart() loaded the"): "tests/integration/keras/test_phases.py",
    ("performance.rst", "WARNING epoch 2: training waited"): "tests/integration/engine/test_async.py",
    ("async.rst", "WARNING epoch 1: the host copy"): "tests/integration/engine/test_async.py",
    ("campaigns.rst", "INFO restart: tier: persistent:"): "tests/integration/storage/test_tiers_keras.py",
    ("preemption.rst", "ERROR restart: refused: reading"): "tests/integration/keras/test_hang.py",  # before the next
    ("preemption.rst", "ERROR restart: refused:"): "tests/integration/keras/test_crash_loop.py",
    ("campaigns.rst", "INFO exit: draining"): "tests/integration/keras/test_crash_loop.py",
    ("preemption.rst", "INFO start:"): "tests/integration/keras/test_crash_loop.py",
}


def pages() -> list[Path]:
    """docs/*.rst but :data:`SPHINX_ONLY`, in name order."""
    return sorted(p for p in DOCS.glob("*.rst") if p.name not in SPHINX_ONLY)


def doctree(path: Path) -> docutils.nodes.document:
    """Parse ``path``; any docutils warning or error raises (halt_level 2)."""
    return docutils.core.publish_doctree(
        path.read_text(),
        source_path=str(path),
        settings_overrides={"halt_level": 2, "report_level": 2, "warning_stream": False},
    )


# A mention of a page: ``docs/format.rst`` or ``format.rst`` (a page of docs/ when that file exists).
PAGE_MENTION = re.compile(r"(?<![\w/.-])(?:docs/)?([\w-]+)\.rst\b")


def unlinked_page_mentions(path: Path) -> list[str]:
    """The mentions of another docs/ page in ``path``'s text that are not links (code blocks and comments aside):
    every one should be a link (```format.rst <format.rst>`__``), which the site shows as the page's title."""
    skip = (docutils.nodes.reference, docutils.nodes.literal_block, docutils.nodes.comment,
            docutils.nodes.target, docutils.nodes.system_message)  # fmt: skip
    found = []
    for text in doctree(path).findall(docutils.nodes.Text):
        node, inside = text.parent, False
        while node is not None and not inside:
            inside, node = isinstance(node, skip), node.parent
        if not inside:
            found += [
                m.group(0) for m in PAGE_MENTION.finditer(text.astext()) if (DOCS / f"{m.group(1)}.rst").is_file()
            ]
    return found


def blocks(path: Path, kind: str | None = None) -> list[docutils.nodes.literal_block]:
    """The literal blocks of ``path``; with ``kind``, only the code blocks of that language."""
    found = list(doctree(path).findall(docutils.nodes.literal_block))
    if kind is None:
        return found
    return [b for b in found if kind in b.get("classes", [])]


def console_examples(path: Path) -> list[tuple[str, list[str]]]:
    """``(command line, expected lines)`` of every ``$`` line in the console blocks of ``path``, in page order."""
    found: list[tuple[str, list[str]]] = []
    for block in blocks(path, "console"):
        for line in block.astext().splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            elif found and line.strip():
                found[-1][1].append(line)
    return found


def shape(line: str) -> str:
    """A line with what changes between runs masked: dates, times, lineage ids, CRCs, numbers; runs of blanks as
    one."""
    line = re.sub(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\+\d{4})?", "<time>", line)
    line = re.sub(r"\b[0-9a-f]{16}\b", "<id>", line)  # a lineage id (sidecar's "lineage")
    line = re.sub(r"\b[0-9a-f]{8}\b", "<crc>", line)
    line = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "<n>", line)
    return " ".join(line.split())


def matches(expected: list[str], got: list[str]) -> bool:
    """Whether ``got`` has the shape of ``expected``, where a line ``...`` is any number of lines."""
    if not expected:
        return not got
    if expected[0].strip() == "...":
        return any(matches(expected[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and shape(expected[0]) == shape(got[0]) and matches(expected[1:], got[1:])


def log_examples() -> dict[tuple[str, str], str]:
    """Every log-line example of docs/ (a literal block that starts with a level), wrapped lines joined:
    ``{(page, its first four words): the example}``."""
    found = {}
    for path in pages():
        for block in blocks(path):
            text = " ".join(block.astext().split())
            if text.startswith(LEVELS):
                key = next((k for k in LOG_EXAMPLES if k[0] == path.name and text.startswith(k[1])), None)
                found[key or (path.name, " ".join(text.split()[:4]))] = text
    return found


def _units(line: str) -> str:
    return re.sub(r"<n> [kMG]?B\b", "<n> <bytes>", shape(line))


def assert_log_example(page: str, real: str, starts: str | None = None) -> None:
    """docs/``page``'s log-line example (listed in :data:`LOG_EXAMPLES`; ``starts``: the one of several on that
    page that starts so) has the shape of ``real``, a line a real run wrote into ckpt.log (what comes before its
    level, the time, is dropped)."""
    (key,) = [k for k in LOG_EXAMPLES if k[0] == page and starts in (None, k[1])]
    example = log_examples()[key]
    level = min(real.index(w) for w in LEVELS if w in real)
    pattern = ".*".join(re.escape(part) for part in _units(example).split("..."))
    assert re.fullmatch(pattern, _units(real[level:])), f"docs/{page}:\n{example}\n--- a real run wrote:\n{real}"
