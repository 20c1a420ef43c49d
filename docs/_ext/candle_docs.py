"""Sphinx extension of the candle_ckpt docs: the parameters table from the schema, and .rst links.

* ``.. ckpt-parameters::`` is a table of every ``ckpt_*`` key (key, accepted values, default,
  description), generated from :mod:`candle_ckpt.config.schema`, the single source of them.
* The pages link to each other as files (```cli.rst <cli.rst>`_``), so that they read on the
  repository; on the site such a link goes to the page built from that file. A link to a ``.rst``
  file that is not a page of the site is a warning (an error under ``-W``): a renamed or removed
  page breaks the build, not the reader's click.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _default(spec) -> str:
    if spec.default is None:
        if spec.kind == "bool" and spec.optional:
            return "auto"  # an optional boolean's None is "auto" (ckpt_async: decided by the job's size)
        return "(required)" if spec.key == "epochs" else "None"
    return str(spec.default)


class ParametersTable(Directive):
    """A table of every key of the schema, in its order."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from candle_ckpt.config.schema import SPECS  # noqa: PLC0415 (the schema is the single source)

        header = ("key", "accepted values", "default", "description")
        widths = (22, 22, 10, 46)
        table = nodes.table(classes=["ckpt-parameters"])
        group = nodes.tgroup(cols=len(header))
        table += group
        group.extend(nodes.colspec(colwidth=w) for w in widths)
        rows = [header] + [(s.key, s.allowed, _default(s), s.help) for s in SPECS]
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body
        for i, cells in enumerate(rows):
            row = nodes.row()
            for j, text in enumerate(cells):
                entry = nodes.entry()
                para = nodes.paragraph()
                para += nodes.literal(text=text) if (j == 0 and i) else nodes.Text(text)
                entry += para
                row += entry
            (head if i == 0 else body).append(row)
        return [table]


def _rst_links(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Point each link to a page's .rst file at that page; warn (error under -W) if it is not one."""
    srcdir = Path(app.srcdir)
    for ref in doctree.findall(nodes.reference):
        uri = ref.get("refuri", "")
        path, _, anchor = uri.partition("#")
        if not path.endswith(".rst") or "://" in path:
            continue
        source = Path(ref.source or app.env.doc2path(docname))
        target = (source.parent / path).resolve()
        try:
            name = target.relative_to(srcdir.resolve()).with_suffix("").as_posix()
        except ValueError:
            name = None
        if name not in app.env.found_docs:
            logger.warning("link to %s: no such page in docs/", uri, location=ref)
            continue
        ref["refuri"] = app.builder.get_relative_uri(docname, name) + (f"#{anchor}" if anchor else "")


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("ckpt-parameters", ParametersTable)
    app.connect("doctree-resolved", _rst_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
