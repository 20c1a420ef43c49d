"""The package's shape: layers as subpackages, imports pointing one way, no cycles.

These tests read the source with ``ast``; they import nothing, so they run in
milliseconds and catch a wrong-way import before it becomes a habit.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys
from collections.abc import Iterator

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "candle_ckpt"

# Which layers each layer may import (besides itself). The arrows of docs/architecture.rst.
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "core": {"config"},
    "testing": {"core", "config"},
    "storage": {"core", "config"},
    "engine": {"core", "config", "storage"},
    "distributed": {"core", "config", "storage", "engine"},
    "tf_keras": {"core", "config", "storage", "engine", "distributed"},
    # A Keras 3 model's share on each of several JAX processes: public Keras only, below both of its callers.
    "multihost": {"core", "config", "storage", "engine", "distributed"},
    "keras": {"core", "config", "storage", "engine", "distributed", "multihost"},
    "runner": {"core", "config", "storage", "engine", "distributed", "multihost", "keras"},
    "compat": {"core", "config", "storage", "engine", "distributed", "keras"},
    "adapters": {"distributed", "keras", "tf_keras"},
    "cli": {"core", "config", "storage", "engine", "__init__"},
}
FRAMEWORK_FREE = ("core", "config", "storage", "engine", "testing")
FRAMEWORKS = ("keras", "tensorflow", "tf_keras", "h5py", "jax", "torch")


def _modules() -> Iterator[tuple[str, str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        layer = rel.parts[1]
        yield name, layer, ast.parse(path.read_text(), str(path))


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return []


def _candle_targets(names: list[str], known: set[str]) -> set[str]:
    return {n for n in names if n in known}


def test_every_module_lives_in_a_layer_subpackage() -> None:
    """Besides the package's entry points, every module sits in a layer subpackage that has rules."""
    flat = {path.name for path in PACKAGE.glob("*.py")}
    assert flat <= {"__init__.py", "__main__.py", "adapters.py"}, flat
    layers = {layer for _, layer, _ in _modules()} - {"__init__", "__main__"}
    assert layers == set(ALLOWED), layers ^ set(ALLOWED)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_one_way(layer: str) -> None:
    """A layer imports (at module level or lazily) only the layers below it."""
    wrong = []
    for name, own, tree in _modules():
        if own != layer:
            continue
        for node in ast.walk(tree):
            for target in _imported(node):
                parts = target.split(".")
                if parts[0] != "candle_ckpt" or len(parts) < 2:
                    continue
                other = parts[1] if parts[1] in ALLOWED else "__init__"
                if other != layer and other not in ALLOWED[layer]:
                    wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_the_allowed_directions_have_no_loop() -> None:
    """No two layers may import each other, even through others (adapters.py sits above keras/, never beside it)."""
    order: list[str] = []
    while len(order) < len(ALLOWED):
        ready = sorted(layer for layer in ALLOWED if layer not in order and ALLOWED[layer] <= {*order, "__init__"})
        assert ready, f"a loop among {sorted(set(ALLOWED) - set(order))}"
        order += ready


@pytest.mark.parametrize("layer", FRAMEWORK_FREE)
def test_lower_layers_import_no_framework(layer: str) -> None:
    """core, config, storage, engine and testing import no ML framework, not even lazily."""
    wrong = [
        f"{name} imports {target}"
        for name, own, tree in _modules()
        if own == layer
        for node in ast.walk(tree)
        for target in _imported(node)
        if target.split(".")[0] in FRAMEWORKS
    ]
    assert not wrong, wrong


def test_config_imports_only_the_standard_library() -> None:
    """config/ loads in milliseconds anywhere: it imports the standard library and itself, nothing else."""
    wrong = [
        f"{name} imports {target}"
        for name, own, tree in _modules()
        if own == "config"
        for node in ast.walk(tree)
        for target in _imported(node)
        if target.split(".")[0] not in sys.stdlib_module_names
        and not target.startswith("candle_ckpt.config")
        and target != "__future__"
    ]
    assert not wrong, wrong


def _private_imports(tree: ast.Module) -> list[str]:
    """The ``_private`` names a module imports from another candle_ckpt module (at any depth)."""
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("candle_ckpt")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_module_imports_another_modules_private_name() -> None:
    """A name one module shares with another is public (config's schema table is ``SPECS``, not ``_SPECS``)."""
    wrong = [f"{name} imports {what}" for name, _, tree in _modules() for what in _private_imports(tree)]
    assert not wrong, wrong
    source = "from candle_ckpt.config.schema import SPECS, _Spec\ndef f():\n    from candle_ckpt.core.x import _y\n"
    assert _private_imports(ast.parse(source)) == ["candle_ckpt.config.schema._Spec", "candle_ckpt.core.x._y"]


def _runtime_imports(tree: ast.Module) -> Iterator[ast.AST]:
    """Every import a module runs, at module level or inside a function; not those under ``if TYPE_CHECKING:``
    (annotations only: they never run)."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skipped)


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (``{module: modules it imports}``) as the modules along it, or ``[]``."""
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, stack: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend(stack[stack.index(nxt) :] + [node, nxt] if nxt in stack else [node, nxt])
                return True
            if nxt not in state and visit(nxt, stack + [node]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if start not in state and visit(start, []):
            break
    return cycle


def test_no_import_cycle_between_modules() -> None:
    """The import graph of candle_ckpt has no cycle, counting the imports inside functions too (a lazy import
    hides a cycle until the day both modules are loaded in the other order)."""
    trees = {name: tree for name, _, tree in _modules()}
    known = set(trees)
    graph = {
        name: {t for node in _runtime_imports(tree) for t in _candle_targets(_imported(node), known) if t != name}
        for name, tree in trees.items()
    }
    # A package's __init__ may re-export its own modules; that edge runs downward, not round.
    cycle = _cycle(graph)
    assert not cycle, " -> ".join(cycle)


# Layers whose modules form no circle even counting the imports made for annotations only (``if TYPE_CHECKING:``):
# such a circle is a dependency in both directions that the types merely hide (issue 46: storage/commit.py called
# three methods of multipart's shared save; commit.py now owns the small Protocol it calls).
NO_TYPE_ONLY_CIRCLE = ("storage",)


def _every_import_graph(layer: str) -> dict[str, set[str]]:
    """``layer``'s modules and the modules of ``layer`` each imports in any way (type-only and lazy included)."""
    trees = {name: tree for name, own, tree in _modules() if own == layer}
    known = set(trees)
    return {
        name: {t for node in ast.walk(tree) for t in _candle_targets(_imported(node), known) if t != name}
        for name, tree in trees.items()
    }


@pytest.mark.parametrize("layer", NO_TYPE_ONLY_CIRCLE)
def test_no_import_circle_among_a_layers_modules_even_type_only(layer: str) -> None:
    """The modules of storage/ import each other one way only, counting ``if TYPE_CHECKING:`` imports too."""
    cycle = _cycle(_every_import_graph(layer))
    assert not cycle, " -> ".join(cycle)


def test_the_type_only_circle_check_finds_a_type_only_circle(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check fails on storage modules that meet only through an annotation import (the old
    commit -> multipart -> commit circle), which the runtime cycle check lets through (both can fail)."""
    pkg = tmp_path / "candle_ckpt" / "storage"
    pkg.mkdir(parents=True)
    (tmp_path / "candle_ckpt" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "commit.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from candle_ckpt.storage.multipart import Shared\n"
    )
    (pkg / "multipart.py").write_text("from candle_ckpt.storage.commit import FileSpec\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "candle_ckpt")
    test_no_import_cycle_between_modules()  # type-only: no runtime cycle
    with pytest.raises(AssertionError, match="candle_ckpt.storage.commit -> candle_ckpt.storage.multipart"):
        test_no_import_circle_among_a_layers_modules_even_type_only("storage")


def test_the_cycle_check_finds_a_cycle(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cycle check fails on a package whose two modules import each other (the check can fail)."""
    pkg = tmp_path / "candle_ckpt" / "core"
    pkg.mkdir(parents=True)
    (tmp_path / "candle_ckpt" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from candle_ckpt.core.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from candle_ckpt.core.a import y\n")  # lazy: still a cycle
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "candle_ckpt")
    with pytest.raises(AssertionError, match="candle_ckpt.core.a"):
        test_no_import_cycle_between_modules()


def test_every_module_has_its_line_in_the_architecture_page() -> None:
    """docs/architecture.rst says what each module owns: a module added or moved without its line there fails."""
    page = (PACKAGE.parent / "docs" / "architecture.rst").read_text()
    listed = set(re.findall(r"^``([\w/.]+)``\s", page, re.M))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name in ("__init__.py", "__main__.py"):
            continue
        if not {rel.stem, f"{rel.parts[0]}/{rel.stem}", rel.name} & listed:
            missing.append(str(rel))
    assert not missing, missing


# A room's size, in lines of all its modules: keras/ is the one-process Keras 3 adapter (issue 46). The multi-process
# share is multihost/; a room that grows past its bound is holding a second idea (docs/architecture.rst says why).
ROOM_LINES = {"keras": 3000}


def _room_lines(layer: str) -> int:
    return sum(len(path.read_text().splitlines()) for path in (PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(ROOM_LINES))
def test_a_room_stays_within_its_lines(layer: str) -> None:
    """keras/ holds at most 3,000 lines: the one-process adapter, not the multi-process share beside it."""
    lines = _room_lines(layer)
    assert lines <= ROOM_LINES[layer], f"{layer}/ has {lines} lines, over its {ROOM_LINES[layer]}"


# Exceptions that are not checkpoint errors, each with its reason.
OWN_EXCEPTIONS = {
    "candle_ckpt.cli.common.CliError": "a usage error of the command line, turned into exit status 2",
    "candle_ckpt.testing.crashsim.OutsideRoot": "an AssertionError of the crash simulator",
}


OUR_ERRORS = {"CorruptCheckpoint", "NoValidCheckpoint", "DirectoryLocked", "MissingDependency"}


def test_exceptions_have_one_home() -> None:
    """Every public exception class is defined in core/errors.py (or is listed with its reason)."""
    elsewhere = []
    for name, _, tree in _modules():
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
            if any(b.endswith(("Error", "Exception")) or b in OUR_ERRORS for b in bases):
                qual = f"{name}.{node.name}"
                if name != "candle_ckpt.core.errors" and qual not in OWN_EXCEPTIONS:
                    elsewhere.append(qual)
    assert not elsewhere, elsewhere


# The only modules that reach framework internals (docs/api.rst lists what each relies on).
# The framework gateways, and TensorFlow's pieces outside them (as jax_group.coordination_client is JAX's:
# distributed/ may import neither keras/ nor tf_keras/, and its group needs TensorFlow's coordination service).
GATEWAYS = {
    "candle_ckpt.keras.internals",
    "candle_ckpt.tf_keras.internals",
    # TensorFlow's pieces both Keras adapters read (its global generator), and tf.distribute's coordination
    # service and worker numbering (distributed/tf_group.py): every other tensorflow.python import is refused.
    "candle_ckpt.distributed.tf_internals",
}
PRIVATE_PREFIXES = ("keras.src", "tensorflow.python", "tf_keras.src")
PRIVATE_CALLS = ("_getframe",)


def _private_reaches(tree: ast.Module) -> list[str]:
    """What a module reaches of the frameworks' private parts: imports, module names in strings, frames."""
    found = []
    for node in ast.walk(tree):
        names = _imported(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value:
            names = [node.value]  # e.g. sys.modules.get("tensorflow.python.framework.errors_impl")
        found += [n for n in names if n.startswith(PRIVATE_PREFIXES)]
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_CALLS:
            found.append(ast.unparse(node))
    return found


def test_only_the_gateways_reach_framework_internals() -> None:
    """No module but keras/internals.py, tf_keras/internals.py and distributed/tf_internals.py reaches keras.src,
    tensorflow.python, tf_keras.src or sys._getframe."""
    wrong = [
        f"{name}: {what}" for name, _, tree in _modules() if name not in GATEWAYS for what in _private_reaches(tree)
    ]
    assert not wrong, wrong
    assert all(_private_reaches(tree) for name, _, tree in _modules() if name in GATEWAYS), "a gateway moved"


def test_the_gateway_check_finds_a_private_import() -> None:
    """The check flags each kind of private reach (it can fail)."""
    source = (
        "from keras.src.saving import saving_lib\nimport tf_keras.src.callbacks\nimport sys\n"
        "f = sys._getframe(1)\nm = sys.modules.get('tensorflow.python.eager.context')\n"
    )
    assert _private_reaches(ast.parse(source)) == [
        "keras.src.saving",
        "keras.src.saving.saving_lib",
        "tf_keras.src.callbacks",
        "sys._getframe",
        "tensorflow.python.eager.context",
    ]


def _private_attributes_by_name(tree: ast.Module) -> list[str]:
    """Private attributes read or set by name (``getattr(obj, "_x")``): another object's internals. Our own marks on
    a foreign object are named ``_candle...``."""
    return [
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and node.args[1].value.startswith("_")
        and not node.args[1].value.startswith(("__", "_candle"))
    ]


def test_only_the_gateways_read_private_attributes_by_name() -> None:
    """A framework object's private attribute (``getattr(model, "_distribute_strategy")``) is read in a gateway,
    where its accessor names a tripwire; the check flags a sample (it can fail)."""
    wrong = [
        f"{name}: {attr}"
        for name, _, tree in _modules()
        if name not in GATEWAYS
        for attr in _private_attributes_by_name(tree)
    ]
    assert not wrong, wrong
    sample = "getattr(h, '_adapter', None)\nhasattr(m, '_candle_mark')\nsetattr(m, '__x', 1)\ngetattr(m, name)\n"
    assert _private_attributes_by_name(ast.parse(sample)) == ["_adapter"]


def _tripwires(doc: str) -> list[str]:
    """The tests named after "tripwire" in an accessor's docstring: ``file.py`` or ``file.py::test_name``."""
    text = " ".join(doc.split())
    return (
        re.findall(r"``((?:[\w/]+/)?test_\w+\.py(?:::\w+)?)``", text.split("tripwire", 1)[1])
        if "tripwire" in text
        else []
    )


@pytest.mark.parametrize("gateway", sorted(GATEWAYS))
def test_every_gateway_accessor_names_what_it_relies_on_and_a_tripwire_that_exists(gateway: str) -> None:
    """Each public function of a gateway says "Relies on:" and names a tripwire test that exists."""
    tests = PACKAGE.parent / "tests"
    (tree,) = [tree for name, _, tree in _modules() if name == gateway]
    wrong = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node) or ""
        wires = _tripwires(doc)
        if "Relies on:" not in doc or not wires:
            wrong.append(f"{node.name}: no 'Relies on:' line with a tripwire")
        for wire in wires:
            file, _, test = wire.partition("::")
            found = [p for p in tests.rglob(pathlib.Path(file).name) if p.as_posix().endswith(file)]
            if not found or (test and not any(f"def {test}(" in p.read_text() for p in found)):
                wrong.append(f"{node.name}: tripwire {wire} does not exist")
    assert not wrong, wrong


# The names of the checkpoint folders (epochs/NNN, steps/GGG) are spelled once, in core/layout.py (issue 46).
LAYOUT_MODULE = "candle_ckpt.core.layout"
_FOLDERS = r"(?:epochs|steps)"
_PATH_PIECE = re.compile(rf"(?:^|[/{{}}]){_FOLDERS}/|/{_FOLDERS}$|\}}s/")


def _docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _template(node: ast.AST) -> str | None:
    """A string literal's text, an f-string's with ``{}`` for each value; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _folder_names(tree: ast.Module) -> list[str]:
    """Where a module spells a checkpoint folder's name as a path piece, not in prose (text with spaces):
    ``"epochs/..."``, ``f"{kind}s/{n:03d}"``, ``".../steps"``; or the bare word ``"epochs"``/``"steps"`` assigned to
    a name, compared with, or joined into a path (``os.path.join(root, "epochs")``). A params key
    (``params["epochs"]``, ``.get("epochs")``) or a keyword value is not a path."""
    docs, found = _docstrings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inner = {id(v) for v in node.values}
            docs |= inner
        text = _template(node)
        if text is not None and id(node) not in docs and not re.search(r"\s", text) and _PATH_PIECE.search(text):
            found.append(text)
        values: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            values = list(node.value.elts) if isinstance(node.value, ast.Tuple) else [node.value]
        elif isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("join", "remote_path", "Path"):
            values = list(node.args)
        found += [v.value for v in values if isinstance(v, ast.Constant) and v.value in ("epochs", "steps")]
    return found


def test_only_the_layout_names_the_checkpoint_folders() -> None:
    """No module but core/layout.py spells ``epochs/`` or ``steps/`` as a path piece (``L.link_target``,
    ``L.step_name``, ``L.checkpoint_name``, ``L.EPOCHS``/``L.STEPS``, ``Layout.epochs``/``steps`` name them)."""
    wrong = [
        f"{name}: {what!r}" for name, _, tree in _modules() if name != LAYOUT_MODULE for what in _folder_names(tree)
    ]
    assert not wrong, wrong
    assert _folder_names(next(t for n, _, t in _modules() if n == LAYOUT_MODULE)), "the layout moved"


def test_the_folder_name_check_finds_each_spelling() -> None:
    """The check flags what issue 46 found (``f"{kind}s/{number:03d}"``, ``EPOCHS, STEPS = "epochs", "steps"``) and
    each other spelling of a folder as a path, and lets params keys, keyword values and prose through (it can fail)."""
    source = (
        '"""Docstring: epochs/NNN and steps/GGG."""\n'
        "def f(kind, number, root, params, d):\n"
        '    """A docstring naming ckpts/epochs/NNN."""\n'
        '    a = f"{kind}s/{number:03d}"\n'
        '    b = "epochs/001"\n'
        '    c = f"{root}/steps/{number}"\n'
        '    d = os.path.join(root, "epochs")\n'
        '    e = os.path.basename(d) != "steps"\n'
        '    g = params["epochs"] + params.get("steps") + h(key="epochs")\n'
        '    raise ValueError(f"{root} is not <ckpt_directory>/ckpts/epochs/NNN")\n'
        'EPOCHS, STEPS = "epochs", "steps"\n'
    )
    assert sorted(_folder_names(ast.parse(source))) == sorted(
        ["{}s/{}", "epochs/001", "{}/steps/{}", "epochs", "steps", "epochs", "steps"]
    )
