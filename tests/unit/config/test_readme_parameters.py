"""The README's parameter table names every parameter of the schema, with its choices."""

from __future__ import annotations

import re

from locations import REPO

from candle_ckpt.config.schema import SPECS

README = REPO / "README.rst"


def _table_rows() -> dict[str, str]:
    text = README.read_text()
    table = text[re.search(r"^key +values", text, re.M).start() :]  # the key column is as wide as the longest key
    table = table[: table.index("\n\n")]
    rows = {}
    for line in table.splitlines():
        found = re.match(r"^``(\w+)``\s+(.*?)\s{2,}", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


def test_every_parameter_is_in_the_readme_table() -> None:
    """Each ckpt_* key of the schema (and epochs) has a row in README.rst's parameter table."""
    rows = _table_rows()
    missing = [spec.key for spec in SPECS if spec.key not in rows]
    assert not missing, f"README.rst's parameter table lacks {missing}"


def test_the_readme_lists_every_choice() -> None:
    """For a parameter with fixed choices, the README's values column names each one."""
    rows = _table_rows()
    wrong = {
        spec.key: (spec.choices, rows[spec.key])
        for spec in SPECS
        if spec.choices and spec.key in rows and not all(choice in rows[spec.key] for choice in spec.choices)
    }
    assert not wrong, wrong
