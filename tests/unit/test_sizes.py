"""Size limits: no module of ``candle_ckpt`` over 400 lines (issue 46), no function over 60.

Read with ``ast`` (nothing is imported). A module that is a table is exempt,
and says why in :data:`TABLES`. :data:`PENDING` lists what is still over a
limit while another change owns the file; an entry that is no longer over its
limit fails the test too, so the list shrinks as the work lands.
"""

from __future__ import annotations

import ast
import pathlib

from locations import PACKAGE

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# Modules that are tables, not logic: their length is their number of rows. (The schema's table, once exempt, is two
# tables of one idea each since issue 46: config/checkpoint_keys.py and config/cluster_keys.py, both under the limit.)
TABLES: dict[str, str] = {}

# Over a limit, and left for the change that owns the file (issue 16 is editing these).
# "path" is the module's length; "path::Qualified.name" a function's.
PENDING: set[str] = set()


def _functions(tree: ast.Module) -> list[tuple[str, int]]:
    """``(qualified name, lines from def to its last line)`` of every function, nested ones included."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _oversized() -> dict[str, int]:
    """Every module and function over its limit, keyed as in :data:`PENDING`, with its length."""
    over: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES and rel not in TABLES:
            over[rel] = lines
        for name, length in _functions(ast.parse(source, str(path))):
            if length > MAX_FUNCTION_LINES:
                over[f"{rel}::{name}"] = length
    return over


def test_no_module_or_function_over_its_limit() -> None:
    """Every module is at most 400 lines and every function at most 60, except the tables and PENDING."""
    over = {key: length for key, length in _oversized().items() if key not in PENDING}
    assert not over, f"over the limits ({MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function): {over}"


def test_pending_entries_are_still_over_their_limit() -> None:
    """Each PENDING entry is still over its limit: one that was fixed must leave the list."""
    stale = PENDING - set(_oversized())
    assert not stale, f"no longer over a limit: remove from PENDING in {pathlib.Path(__file__).name}: {sorted(stale)}"


def test_exempt_tables_exist() -> None:
    """Each exempt table is a real module (so the exemption cannot outlive its file)."""
    for rel in TABLES:
        assert (PACKAGE / rel).is_file(), rel
