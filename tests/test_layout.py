"""The import graph of tuner/, read from the source with ``ast`` (nothing is imported): no cycle,
and the layout's rule, visible in the tree:

- ``tuner/driver/``: the launch's own process. It never imports TensorFlow, not even inside a
  function; of the worker package it names only ``tuner.worker.actor`` (the Ray actor class, which
  imports TensorFlow inside its methods).
- ``tuner/worker/``: the processes that train. Only its modules, a model's ``build``
  (``tuner/models/``) and the graph hooks (``tuner.hooks``, called only in a worker) import TensorFlow.
- ``tuner/*.py``: what both sides share (records, config, spaces, errors, ...). It imports neither
  side; only the command line (``tuner.cli``) dispatches to both, inside its functions.

And every bet on another library's internals is in one package, ``tuner/hooks/``: no other module
touches a ``_``-prefixed attribute or module of Optuna, optuna-dashboard, MLflow, Ray, Keras or
TensorFlow, nor writes ``sys.modules`` (:func:`private_uses`).

Every environment variable tuner reads or sets goes through ``tuner/environ.py``: no other module
touches ``os.environ`` or ``os.getenv`` (:func:`environment_uses`).

``bench/driver_footprint.py`` checks the same at run time (``tensorflow`` not in the driver's
``sys.modules`` after a launch).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tuner"
TF = "tensorflow"
# the modules that import TensorFlow at module level: the worker's graph building, loop and forensics
TF_MODULES = {"tuner.worker.graph", "tuner.worker.train", "tuner.worker.forensics"}
# outside tuner/worker/, the modules that may import TensorFlow inside a function called only in a
# process that trains: the graph hooks and a model's build
TF_IN_FUNCTIONS = {"tuner.hooks.graph"}
DRIVER, WORKER, MODELS = "tuner.driver", "tuner.worker", "tuner.models"
ACTOR = "tuner.worker.actor"  # the one worker module the driver names


@dataclass(frozen=True)
class Import:
    target: str  # a tuner module, or the top-level name of another package (tensorflow, ray, ...)
    top: bool  # at module level (run when the module is imported), not inside a function
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Module name -> its file, for every module of tuner/."""
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str, path: Path, known: Iterable[str]) -> list[Import]:
    """Every import statement of a module, resolved to a tuner module or a top-level package name."""
    known = set(known)
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = set(map(id, _module_level(tree.body)))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            assert isinstance(node, ast.Import | ast.ImportFrom)
            if not target.startswith("tuner"):
                target = target.partition(".")[0]
            else:
                while target not in known and "." in target:  # tuner.records.RunSpec -> tuner.records
                    target = target.rpartition(".")[0]
            found.append(Import(target, id(node) in top_level, node.lineno))
    return found


def _module_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements run when a module is imported: its body, and what is under its top-level
    ``if``/``try``/``with`` (``if TYPE_CHECKING:``, ``try: import ...``) and class bodies; not function bodies."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With | ast.ClassDef):
            for field in ("body", "orelse", "finalbody"):
                yield from _module_level(getattr(stmt, field, []))
            for handler in getattr(stmt, "handlers", []):
                yield from _module_level(handler.body)


def import_graph() -> dict[str, list[Import]]:
    """Module -> its imports (module level and inside functions)."""
    mods = modules()
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle of the graph as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # node -> 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def chain_to(start: str, goal: str, edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """The import chain ``[start, ..., goal]`` along ``edges``, or None."""
    seen, todo = {start}, [[start]]
    while todo:
        path = todo.pop(0)
        for nxt in edges.get(path[-1], ()):
            if nxt == goal:
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                todo.append([*path, nxt])
    return None


def test_layout_import_graph_of_tuner_has_no_cycle() -> None:
    graph = import_graph()
    edges = {m: sorted({i.target for i in imps if i.target in graph and i.target != m}) for m, imps in graph.items()}
    cycle = find_cycle(edges)
    assert cycle is None, f"tuner/ has an import cycle: {' -> '.join(cycle)}"


def test_layout_only_the_worker_training_modules_import_tensorflow_at_module_level() -> None:
    graph = import_graph()
    edges = {m: sorted({i.target for i in imps if i.top}) for m, imps in graph.items()}
    wrong = {m: chain for m in graph if m not in TF_MODULES and (chain := chain_to(m, TF, edges))}
    assert not wrong, "modules outside the worker's training modules import TensorFlow at module level: " + "; ".join(
        " -> ".join(chain) for chain in wrong.values())
    assert all(chain_to(m, TF, edges) for m in TF_MODULES), "a listed TensorFlow module no longer imports it"


def test_layout_driver_modules_never_import_tensorflow_even_inside_a_function() -> None:
    graph = import_graph()
    may = TF_MODULES | TF_IN_FUNCTIONS | {m for m in graph if _under(m, WORKER) or _under(m, MODELS)}
    wrong = [f"{m}:{i.line} imports {i.target}" for m, imps in graph.items() if m not in may
             for i in imps if i.target == TF or i.target in TF_MODULES]
    assert not wrong, f"driver-side modules import TensorFlow or the training modules: {wrong}"


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_layout_the_driver_package_names_only_the_worker_actor_of_the_worker_package() -> None:
    graph = import_graph()
    assert any(_under(m, DRIVER) for m in graph) and ACTOR in graph
    wrong = [f"{m}:{i.line} imports {i.target}" for m, imps in graph.items() if _under(m, DRIVER)
             for i in imps if _under(i.target, WORKER) and i.target not in (WORKER, ACTOR)]
    assert not wrong, f"tuner/driver/ imports worker modules other than {ACTOR}: {wrong}"


def test_layout_shared_modules_import_neither_the_driver_nor_the_worker_package() -> None:
    graph = import_graph()
    shared = [m for m in graph if not any(_under(m, p) for p in (DRIVER, WORKER, MODELS))
              and m not in ("tuner.cli", "tuner.__main__", "tuner.api", "tuner")]  # the front doors
    assert "tuner.records" in shared and "tuner.spaces" in shared
    wrong = [f"{m}:{i.line} imports {i.target}" for m in shared for i in graph[m]
             if _under(i.target, DRIVER) or _under(i.target, WORKER)]
    assert not wrong, f"shared modules of tuner/ import the driver or worker package: {wrong}"


def test_layout_find_cycle_names_the_cycle_and_chain_to_the_import_path() -> None:
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert chain_to("a", "d", edges) == ["a", "b", "c", "d"]
    assert chain_to("d", "a", edges) is None


def test_layout_reads_relative_package_and_function_level_imports(tmp_path: Path) -> None:
    source = "from . import records\nfrom tuner.models import base\n\ndef f():\n    import tensorflow as tf\n"
    path = tmp_path / "x.py"
    path.write_text(source)
    known = {"tuner.x", "tuner.records", "tuner.models", "tuner.models.base"}
    found = {(i.target, i.top) for i in imports_of("tuner.x", path, known)}
    assert found == {("tuner.records", True), ("tuner.models.base", True), (TF, False)}


HOOKS = "tuner.hooks"  # the one package that may use other libraries' private API (its docstring lists each use)
# the libraries whose private API only tuner.hooks may touch
LIBRARIES = {"optuna", "optuna_dashboard", "optuna_integration", "mlflow", "ray", "keras", "tf_keras", "tensorflow"}
# private attributes of those libraries' objects (a study, a trial, a storage, a graph, Ray's node) that tuner
# reaches for or once did; flagged on any object but the module's own ``self``/``cls``
PRIVATE_NAMES = {
    "_storage", "_study_id", "_trial_id", "_cached_frozen_trial", "_backend", "_rdb", "_get_trial", "_set_trial",
    "_lock", "_create_scoped_session", "_get_stale_trial_ids", "_thread_local", "_filter_study", "_note",
    "_private", "_global_node", "_create_op_internal", "_set_attr",
}
# modules that may write sys.modules other than tuner.hooks, and why
SYS_MODULES_WRITERS = {
    "tuner.models": "importlib's own recipe for importing a user's model file under tuner's own module name",
}
ATTR_CALLS = ("getattr", "hasattr", "setattr", "delattr")
MODULES_WRITES = ("pop", "setdefault", "update", "clear", "__setitem__", "__delitem__", "popitem")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _is_sys_modules(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def private_uses(path: Path) -> list[str]:
    """Where a module uses another library's private API: ``line: what``.

    Flags an import of a ``_``-prefixed module or name of :data:`LIBRARIES`; a ``_``-prefixed attribute
    reached from a name bound to one of their modules (``ray._private``, ``tf.Graph._create_op_internal``);
    an attribute of :data:`PRIVATE_NAMES` on any object but ``self``/``cls`` (``study._storage``), also
    through ``getattr``/``hasattr``/``setattr``/``delattr`` with the name as a literal; a write to
    ``sys.modules``.
    """
    tree = ast.parse(path.read_text(), str(path))
    library_names: set[str] = set()  # names the module binds to a library's module or object
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] in LIBRARIES:
                    library_names.add(alias.asname or alias.name.partition(".")[0])
                    if any(map(_private, alias.name.split("."))):
                        found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").partition(".")[0] in LIBRARIES:
            module = node.module or ""
            library_names.update(alias.asname or alias.name for alias in node.names)
            for alias in node.names:
                if any(map(_private, [*module.split("."), alias.name])):
                    found.append((node.lineno, f"from {module} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root(node)
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if (isinstance(root, ast.Name) and root.id in library_names) or (node.attr in PRIVATE_NAMES and not own):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTR_CALLS \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in PRIVATE_NAMES:
            found.append((node.lineno, ast.unparse(node)))
        found.extend((node.lineno, f"writes {ast.unparse(t)}") for t in _sys_modules_writes(node))
    return [f"{line}: {what}" for line, what in sorted(set(found))]


def _sys_modules_writes(node: ast.AST) -> list[ast.expr]:
    """What ``node`` writes of ``sys.modules``: ``sys.modules[x] = ...``, ``del sys.modules[x]``,
    ``sys.modules.pop(x)`` and the like, ``sys.modules = ...``."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign | ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MODULES_WRITES \
            and _is_sys_modules(node.func.value):
        return [node.func]
    return [t for t in targets if _is_sys_modules(t) or (isinstance(t, ast.Subscript) and _is_sys_modules(t.value))]


def test_layout_only_tuner_hooks_uses_other_libraries_private_api() -> None:
    mods = modules()
    wrong = {m: uses for m, path in mods.items() if not _under(m, HOOKS) and (uses := private_uses(path))
             and not (m in SYS_MODULES_WRITERS and all("writes sys.modules" in u for u in uses))}
    assert not wrong, ("a private API of another library is used outside tuner/hooks/ (move it into a hook there "
                       "that fails open, with a test): " + "; ".join(f"{m}: {u}" for m, u in wrong.items()))
    hooks = [m for m in mods if _under(m, HOOKS) and m != HOOKS]
    assert hooks and all(private_uses(mods[m]) for m in hooks), \
        "the rule finds nothing in a module of tuner/hooks/: it no longer reads the source (or the module is no hook)"


def test_layout_private_uses_flags_each_kind_of_private_use(tmp_path: Path) -> None:
    source = (
        "import sys\nimport ray._private.services as services\nfrom optuna.storages._rdb import models\n"
        "import tensorflow as tf\nfrom optuna_dashboard import _note\n\n"
        "class A:\n    def f(self, study, trial):\n        self._lock = 1\n        self._storage = 2\n"
        "        x = study._storage.get_trial(trial._trial_id)\n        y = getattr(trial, '_cached_frozen_trial')\n"
        "        z = tf.Graph._create_op_internal\n        sys.modules['keras'] = None\n"
        "        del sys.modules['keras']\n        sys.modules.pop('keras')\n        return other._draw\n"
    )
    path = tmp_path / "x.py"
    path.write_text(source)
    assert private_uses(path) == [
        "2: import ray._private.services", "3: from optuna.storages._rdb import models",
        "5: from optuna_dashboard import _note", "11: study._storage", "11: trial._trial_id",
        "12: getattr(trial, '_cached_frozen_trial')", "13: tf.Graph._create_op_internal",
        "14: writes sys.modules['keras']", "15: writes sys.modules['keras']", "16: writes sys.modules.pop",
    ]


ENVIRON = "tuner.environ"  # the one module that reads or sets environment variables
ENV_NAMES = {"environ", "getenv", "putenv", "unsetenv", "environb", "getenvb"}


def environment_uses(path: Path) -> list[str]:
    """``line: os.NAME`` for each use of ``os.environ``/``os.getenv``/... in ``path``, and each
    ``from os import environ`` (any alias)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name)
                and node.value.id == "os"):
            found.append((node.lineno, f"os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"from os import {a.name}") for a in node.names if a.name in ENV_NAMES]
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_layout_only_tuner_environ_reads_or_sets_environment_variables() -> None:
    mods = modules()
    wrong = {m: uses for m, path in mods.items() if m != ENVIRON and (uses := environment_uses(path))}
    assert not wrong, ("an environment variable is read or set outside tuner/environ.py (add a function there): "
                       + "; ".join(f"{m}: {u}" for m, u in wrong.items()))
    assert environment_uses(mods[ENVIRON]), "the rule finds nothing even in tuner/environ.py: it no longer reads it"


def test_layout_environment_uses_flags_each_form(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("import os\nfrom os import environ as e, getenv\nos.environ.get('A')\nos.getenv('B')\n"
                    "os.environ['C'] = '1'\nos.getpid()\n")
    assert environment_uses(path) == ["2: from os import environ", "2: from os import getenv", "3: os.environ",
                                      "4: os.getenv", "5: os.environ"]
