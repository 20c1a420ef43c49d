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
    "candle_ckpt.engine.writer.SaveFailure": "the engine's wrapper of a commit's error on the writer's thread, never "
    "raised to the user (the engine reports the error it carries, by ckpt_on_error)",
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
    "candle_ckpt.keras.fit_internals",  # the running Keras 3 fit (frames, epoch iterator): its fit port
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


# Every way to reach a frame object (issue 46). Reading a stack to find an object (a CallbackList, fit's locals, the
# fit's own frame) is the framework gateways' job, each behind its port (engine/fit_port.py). A report of the stack
# that hands out no frame is not frame walking and stays allowed: faulthandler.dump_traceback in engine/watchdog.py
# (every thread's stack in a hang report) and traceback.extract_stack in storage/store.py (the lock's releaser, named
# in a log line) read no frame in Python.
FRAME_WALKERS = ("candle_ckpt.keras.fit_internals", "candle_ckpt.tf_keras.internals")
FRAME_ATTRIBUTES = ("_getframe", "_current_frames", "f_back", "f_locals", "tb_frame", "walk_stack", "walk_tb")
FRAME_FUNCTIONS = {"inspect": ("currentframe", "stack", "trace", "getouterframes", "getinnerframes")}


def _frame_walks(tree: ast.Module) -> list[str]:
    """Where a module reaches a frame: ``sys._getframe``, ``sys._current_frames``, ``f_back``, ``f_locals``,
    ``inspect.currentframe``/``stack``/``trace``/``getouterframes``, ``traceback.walk_stack``, a traceback's
    ``tb_frame``, as attributes, imported names or names given to ``getattr``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if node.attr in FRAME_ATTRIBUTES or node.attr in FRAME_FUNCTIONS.get(owner, ()):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            banned = FRAME_ATTRIBUTES + FRAME_FUNCTIONS.get(node.module, ())
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in banned]
        elif isinstance(node, ast.Constant) and node.value in FRAME_ATTRIBUTES:
            found.append(repr(node.value))
    return found


def test_only_the_fit_gateways_walk_frames() -> None:
    """No module but keras/fit_internals.py and tf_keras/internals.py reaches a frame (engine/fit_port.py's fit
    guard asks the port's probe); both do (a gateway moved otherwise)."""
    wrong = [
        f"{name}: {what}" for name, _, tree in _modules() if name not in FRAME_WALKERS for what in _frame_walks(tree)
    ]
    assert not wrong, wrong
    walkers = {name for name, _, tree in _modules() if _frame_walks(tree)}
    assert walkers == set(FRAME_WALKERS), walkers
    assert set(FRAME_WALKERS) <= GATEWAYS


def test_the_frame_walk_check_finds_each_spelling() -> None:
    """The check flags each way to reach a frame (the three issue 46 found: ``_getframe``, ``f_back``,
    ``f_locals``; and ``inspect``'s, ``sys._current_frames``, ``traceback.walk_stack``, ``tb_frame``) and lets a
    stack report through (it can fail)."""
    source = (
        "import sys, inspect, traceback, faulthandler\n"
        "from inspect import currentframe\n"
        "from sys import _getframe\n"
        "a = sys._getframe(1)\n"
        "b = a.f_back.f_locals.get('self')\n"
        "c = inspect.currentframe()\n"
        "d = inspect.stack()\n"
        "e = sys._current_frames()\n"
        "f = [x for x, _ in traceback.walk_stack(None)]\n"
        "g = err.__traceback__.tb_frame\n"
        "h = getattr(a, 'f_back')\n"
        "i = inspect.getouterframes(a)\n"
        "faulthandler.dump_traceback(out, all_threads=True)\n"
        "j = traceback.extract_stack()\n"
        "k = self.stack\n"
    )
    assert sorted(_frame_walks(ast.parse(source))) == sorted(
        [
            "inspect.currentframe",
            "sys._getframe",
            "sys._getframe",
            "a.f_back.f_locals",
            "inspect.currentframe",
            "inspect.stack",
            "sys._current_frames",
            "traceback.walk_stack",
            "err.__traceback__.tb_frame",
            "'f_back'",
            "inspect.getouterframes",
            "a.f_back",
        ]
    )


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


# Rank 0 is the primary, and core/group.py alone says so (``is_primary(group)``, ``is_primary_rank(rank)``): a flat
# ``rank == 0`` elsewhere is a role decided beside the Group (issue 46: tf.distribute's engine chose its save mode
# from ``is_chief``; the drain and the pull compared the rank a sidecar names with 0).
RANK_HOME = "candle_ckpt/core/group.py"
# A module that may still compare a rank with 0 while a change moves it, and why (a path that no longer exists is
# skipped). Empty since issue 46's merge.
FLAT_RANK_PENDING: dict[str, str] = {}  # path -> why it may still compare (empty: none may)
_RANKED = re.compile(r"(?:\brank|_rank|task_id|process_id|process_index\(\))$")


def _flat_rank_compares(tree: ast.Module) -> list[str]:
    """Each comparison of a rank with 0 (``rank == 0``, ``self.rank != 0``, ``jax.process_index() == 0``,
    ``task_id == 0``), as source text."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            continue
        sides = [node.left, *node.comparators]
        zero = any(isinstance(s, ast.Constant) and s.value == 0 and not isinstance(s.value, bool) for s in sides)
        if zero and any(_RANKED.search(ast.unparse(s)) for s in sides if not isinstance(s, ast.Constant)):
            found.append(ast.unparse(node))
    return found


def _package_files() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent).as_posix(), ast.parse(path.read_text(), str(path))


def test_no_flat_rank_compare_outside_the_group() -> None:
    """No module but core/group.py compares a rank with 0: the others ask ``is_primary`` / ``is_primary_rank``, or
    the engine's topology (``engine/topology.py``) who commits."""
    wrong = [
        f"{rel}: {what}"
        for rel, tree in _package_files()
        if rel != RANK_HOME and rel not in FLAT_RANK_PENDING
        for what in _flat_rank_compares(tree)
    ]
    assert not wrong, wrong
    assert _flat_rank_compares(ast.parse((PACKAGE.parent / RANK_HOME).read_text())), "the rank rule moved"


def test_flat_rank_pending_entries_still_compare() -> None:
    """Each pending entry that still exists still compares a rank with 0: one fixed in place must leave the list."""
    stale = [rel for rel, tree in _package_files() if rel in FLAT_RANK_PENDING and not _flat_rank_compares(tree)]
    assert not stale, f"no flat rank compare left: remove from FLAT_RANK_PENDING: {stale}"


def test_the_flat_rank_check_finds_each_spelling() -> None:
    """The check flags the compares issue 46 found and their kin, and lets other zeros through (it can fail)."""
    source = (
        "if rank == 0: pass\n"
        "if self.group.rank != 0: pass\n"
        "ok = jax.process_index() == 0\n"
        "chief = task_type == 'worker' and task_id == 0\n"
        "if 0 == node_rank: pass\n"
        "if size == 0 or ranks == 0 or step == 0 or rank > 0: pass\n"
        "if is_primary_rank(rank): pass\n"
    )
    assert sorted(_flat_rank_compares(ast.parse(source))) == sorted(
        ["rank == 0", "self.group.rank != 0", "jax.process_index() == 0", "task_id == 0", "0 == node_rank"]
    )


# The one owner of signal handlers (issue 46 item 3). The candle-ckpt command is a program of its own: its Ctrl-C
# handlers are to the library what a user's script's are (left alone by the owner, never replaced).
SIGNAL_OWNER = "candle_ckpt.engine.signals"
OWN_SIGNAL_HANDLERS = {
    "candle_ckpt.__main__": "the candle-ckpt command's Ctrl-C while its modules load, and ignored once it answered",
    "candle_ckpt.cli.console": "the candle-ckpt command's Ctrl-C answer (one line, status 130)",
    "candle_ckpt.cli.demo": "the demo program's Ctrl-C ignored during TensorFlow's teardown, once it answered",
}


def _handler_installs(tree: ast.Module) -> list[int]:
    """The lines that call ``signal.signal`` (under any name the module gave it) in ``tree``."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "signal"}
        elif isinstance(node, ast.ImportFrom) and node.module == "signal" and node.level == 0:
            functions |= {a.asname or a.name for a in node.names if a.name == "signal"}
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "signal"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in modules
            )
            or (isinstance(node.func, ast.Name) and node.func.id in functions)
        )
    ]


def test_only_the_signal_owner_installs_a_signal_handler() -> None:
    """``signal.signal(`` is called in engine/signals.py only (``SignalOwner``: held, watched, one teardown), and in
    the command-line program's own modules listed with their reason."""
    wrong = [
        f"{name}:{line}"
        for name, _, tree in _modules()
        if name != SIGNAL_OWNER and name not in OWN_SIGNAL_HANDLERS
        for line in _handler_installs(tree)
    ]
    assert not wrong, wrong
    installs = {name: _handler_installs(tree) for name, _, tree in _modules()}
    assert installs[SIGNAL_OWNER], "the signal owner moved"
    assert all(installs.get(name) for name in OWN_SIGNAL_HANDLERS), "an exempt module no longer installs one"


def test_the_signal_handler_check_finds_a_stray_call() -> None:
    """The check flags ``signal.signal`` under its own name, a module alias and a function import (it can fail),
    and lets ``signal.getsignal`` and another object's ``.signal(...)`` through."""
    source = (
        "import signal\nimport signal as _signal\nfrom signal import signal as put\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        "_signal.signal(_signal.SIGINT, handler)\n"
        "put(10, handler)\n"
        "signal.getsignal(signal.SIGTERM)\n"
        "event.signal(3)\n"
    )
    assert _handler_installs(ast.parse(source)) == [4, 5, 6]
