"""The import graph of tuner/, read from the source with ``ast`` (nothing is imported): no cycle,
and the layout's rule, visible in the tree:

- ``tuner/driver/``: the launch's own process. It never imports TensorFlow, not even inside a
  function; of the worker package it names only ``tuner.worker.actor`` (the Ray actor class, which
  imports TensorFlow inside its methods).
- ``tuner/worker/``: the processes that train. Only its modules, a model's ``build``
  (``tuner/models/``) and the graph hooks (``tuner.hooks``, called only in a worker) import TensorFlow.
- ``tuner/*.py``: what both sides share (records, config, spaces, errors, ...). It imports neither
  side; only the command line (``tuner.cli``) dispatches to both, inside its functions.

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
TF_IN_FUNCTIONS = {"tuner.hooks"}
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
              and m not in ("tuner.cli", "tuner.__main__")]
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
