"""Sphinx extension of the candle_ckpt docs: the parameters table, .rst links, API-name links, a members check.

* ``.. ckpt-parameters::`` is a table of every ``ckpt_*`` key (key, accepted values, default,
  description), generated from :mod:`candle_ckpt.config.schema`, the single source of them.
* The pages link to each other as files (```cli.rst <cli.rst>`__``), so that they read on the
  repository; on the site such a link goes to the page built from that file, and a link whose text
  is just the file's name reads as that page's title. A link to a ``.rst`` file that is not a page of
  the site is a warning (an error under ``-W``): a renamed or removed page breaks the build, not the
  reader's click.
* An inline literal that names a public name (````restart()````, ````JobRunner.train()````,
  ````candle_ckpt.load_weights````) links to its entry in the API reference: the pages stay plain
  reStructuredText on the repository, and on the site every such mention is a link.
* Every member an ``autoclass`` directive lists under ``:members:`` must have been rendered (autodoc
  silently leaves out one without a docstring, or one that does not exist): one that was not stops
  the build, with or without ``-W``.
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

PACKAGE = "candle_ckpt"
# How a page may spell a public name before it: ``candle.restart`` (a CANDLE script), ``candle_ckpt.restart``.
PREFIXES = ("candle_ckpt.", "candle.")
AUTOCLASS = re.compile(r"^\.\. autoclass:: (\S+)\n((?:[ \t]+:[\w-]+:.*\n)*)", re.MULTILINE)


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
        if ref.astext() in (path, f"docs/{path}") and not anchor and name in app.env.titles:
            ref.children = [nodes.Text(app.env.titles[name].astext())]  # "format.rst" reads "On-disk format"


def api_name(text: str, objects: dict) -> str | None:
    """The full name of the public object an inline literal names (``restart()``, ``candle.JobRunner.train``), or
    None: the text without a call's arguments and a package prefix must be a documented ``candle_ckpt`` name."""
    name = text.strip().split("(", 1)[0]
    for prefix in PREFIXES:
        name = name.removeprefix(prefix)
    full = f"{PACKAGE}.{name}"
    return full if name and full in objects else None


def _api_links(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Wrap each inline literal that names a documented public object (outside a link) in a link to its entry."""
    objects = app.env.get_domain("py").objects
    for literal in list(doctree.findall(nodes.literal)):
        parent = literal.parent
        if isinstance(parent, (nodes.reference, addnodes.desc_signature)) or "xref" in literal.get("classes", []):
            continue
        full = api_name(literal.astext(), objects)
        if full is None:
            continue
        entry = objects[full]
        uri = app.builder.get_relative_uri(docname, entry.docname) + "#" + entry.node_id
        link = nodes.reference("", "", internal=True, refuri=uri, reftitle=full, classes=["api-name"])
        parent.replace(literal, link)
        link += literal


def _missing_reference(app: Sphinx, env, node: nodes.Element, contnode: nodes.Element) -> nodes.Node | None:
    """Resolve a docstring's cross-reference that Sphinx could not (``:class:`JobRunner``` in another module's
    docstring, or an internal module's class that the package exports, ``candle_ckpt.distributed.worker_state.
    WorkerTrainingState``) to the public name's entry, as :func:`_api_links` does for plain literals."""
    if node.get("refdomain") != "py":
        return None
    objects = env.get_domain("py").objects
    target = node.get("reftarget", "")
    full = api_name(target, objects)
    if full is None and target.startswith(f"{PACKAGE}."):
        full = api_name(target.rsplit(".", 1)[-1], objects)
    if full is None:
        return None
    entry = objects[full]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, full)


def _check_members(app: Sphinx, doctree: nodes.document) -> None:
    """Stop the build when a member an ``autoclass`` lists under ``:members:`` has no entry on the page."""
    docname = app.env.docname
    text = Path(app.env.doc2path(docname)).read_text()
    module = re.search(r"^\.\. (?:py:)?(?:current)?module:: (\S+)", text, re.MULTILINE)
    objects = app.env.get_domain("py").objects
    missing = []
    for match in AUTOCLASS.finditer(text):
        listed = re.search(r":members:(.*)", match.group(2))
        if not listed or not listed.group(1).strip():
            continue  # all members (autodoc's own choice), nothing named to check
        cls = match.group(1) if "." in match.group(1) or not module else f"{module.group(1)}.{match.group(1)}"
        names = [m.strip() for m in listed.group(1).split(",") if m.strip()]
        missing += [f"{cls}.{m}" for m in names if f"{cls}.{m}" not in objects]
    if missing:
        raise ExtensionError(
            f"{docname}.rst lists members that autodoc did not render (no docstring, or no such member): "
            + ", ".join(missing)
        )


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("ckpt-parameters", ParametersTable)
    app.connect("doctree-read", _check_members)
    app.connect("doctree-resolved", _rst_links)
    app.connect("doctree-resolved", _api_links)
    app.connect("missing-reference", _missing_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
