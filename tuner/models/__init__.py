"""Model registry: built-in names map to lazy factories; user models load from a spec.

A model spec is one of:

- a built-in name (``iterated_mlp``, ``counting_cnn``);
- ``package.module:Name``: an importable module and the model class (or instance) in it;
- ``path/to/file.py:Name``: a Python file and the model class (or instance) in it.

Loading a model never imports TensorFlow: models import it inside ``build``.

A model file reaches the workers of a (multi-node) Ray cluster through Ray's runtime env, not
through its path: :func:`runtime_env` ships the one file as a ``py_modules`` entry (Ray puts it on
every worker's ``PYTHONPATH``) and names it in ``TUNER_SHIPPED_MODEL``; a worker that sees the
spec's file named there imports the shipped module by the file's stem, never the driver's path.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.errors import ModelError
from tuner.models.base import UPDATES, Dataset, Knob, Loss, Model, ModelGraph, step_seed

__all__ = ["BUILTIN", "UPDATES", "Dataset", "Knob", "Loss", "Model", "ModelGraph", "load_model", "model_file",
           "runtime_env", "step_seed"]

# set on the workers by runtime_env(): the model file (as written in the spec) shipped to them
SHIPPED_ENV = "TUNER_SHIPPED_MODEL"

# contract member -> what to add when it is missing
CONTRACT: dict[str, str] = {
    "knobs": "a mapping of name -> tuner.models.Knob (a class attribute `knobs = {...}`)",
    "build": "a method `build(self, knobs) -> ModelGraph`",
    "data": "a method `data(self, knobs) -> Dataset`",
}
_MODELS_DIR = Path(__file__).resolve().parent
_TUNER_DIR = _MODELS_DIR.parent
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})

# built-in name -> "module:attribute", imported only when asked for
BUILTIN: dict[str, str] = {
    "iterated_mlp": "tuner.models.iterated_mlp:IteratedMLP",
    "counting_cnn": "tuner.models.counting_cnn:CountingCNN",
}


def load_model(spec: str) -> Model:
    """Return the model named by ``spec`` (see the module docs), checked against the contract.

    Raises:
        ModelError: the spec names nothing loadable, the model's code raised while being imported
            or created (the message points at its line), or the object is not a model.
    """
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ModelError(
            f"unknown model {spec!r}: use one of {sorted(BUILTIN)}, "
            "'package.module:Name' or 'path/to/file.py:Name'"
        )
    where, _, name = target.rpartition(":")
    module = _user_call(spec, f"importing {where}", _import, where, spec)
    obj = getattr(module, name, None)
    if obj is None:
        raise ModelError(f"model {spec!r}: {where} has no attribute {name!r}")
    model = _user_call(spec, f"creating {name}()", obj) if isinstance(obj, type) else obj
    check_contract(model, spec)
    return model


def model_file(spec: str) -> Path | None:
    """The file a ``path/to/file.py:Name`` spec points to (None for other specs)."""
    where = spec.rpartition(":")[0]
    return Path(where).resolve() if spec not in BUILTIN and where.endswith(".py") else None


def runtime_env(spec: str) -> dict[str, Any]:
    """The Ray runtime env that ships a ``path/to/file.py:Name`` model to every worker ({} for others).

    Raises:
        ModelError: the file's name would not import as itself on a worker (see
            :func:`_check_module_name`).
    """
    file = model_file(spec)
    if file is None:
        return {}
    _check_module_name(file, spec)
    return {"py_modules": [str(file)], "env_vars": {SHIPPED_ENV: spec.rpartition(":")[0]}}


def check_contract(model: object, spec: str) -> None:
    """Raise ModelError naming each contract member ``model`` lacks or gets wrong, and the fix."""
    missing = [m for m in CONTRACT if not hasattr(model, m)]
    if missing:
        fixes = "; ".join(f"missing {m}: add {CONTRACT[m]}" for m in missing)
        raise ModelError(f"model {spec!r} does not follow the model contract: {fixes} (see docs/models.md)")
    for member in ("build", "data"):
        if not callable(getattr(model, member)):
            raise ModelError(f"model {spec!r}: {member} must be {CONTRACT[member]}")
    knobs = model.knobs  # type: ignore[attr-defined]
    if not isinstance(knobs, Mapping) or not all(isinstance(k, Knob) for k in knobs.values()):
        raise ModelError(f"model {spec!r}: knobs must be {CONTRACT['knobs']}")


def user_code_error(spec: str, doing: str, exc: BaseException) -> ModelError:
    """A one-paragraph ModelError for an exception raised in a model's own code, at its line."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if _is_model_code(f.filename)]
    where = f" at {Path(mine[-1].filename).name}:{mine[-1].lineno} (`{mine[-1].line}`)" if mine else ""
    knob = any(f.name == "__post_init__" and Path(f.filename).name == "base.py" for f in frames)
    hint = "; fix this Knob: low <= high, and a default inside [low, high] (or None with nullable=True)"
    message = (str(exc).strip().splitlines() or [""])[0]  # TF's messages run to pages
    return ModelError(f"model {spec!r}: {doing} failed{where}: {type(exc).__name__}: {message}{hint if knob else ''}")


def _is_model_code(filename: str) -> bool:
    """Whether a traceback frame is in a model's code (not Python's, a library's or tuner's own)."""
    if filename.startswith("<") or filename.startswith(_LIBRARY_DIRS):
        return False
    path = Path(filename).resolve()
    if _TUNER_DIR not in path.parents:
        return True
    return path.parent == _MODELS_DIR and path.name not in ("base.py", "__init__.py")  # a built-in model


def _user_call(spec: str, doing: str, fn: Any, *args: Any) -> Any:
    """Call the model's code; its exceptions become a ModelError that points at its line."""
    try:
        return fn(*args)
    except ModelError:
        raise
    except Exception as exc:
        raise user_code_error(spec, doing, exc) from exc


def _import(where: str, spec: str) -> object:
    if not where.endswith(".py"):
        return _import_module(where, spec)
    if os.environ.get(SHIPPED_ENV) == where:  # a worker: the file came in Ray's runtime env
        return _import_shipped(Path(where).stem, spec)
    return _import_file(where)


def _import_module(name: str, spec: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelError(f"model {spec!r}: cannot import module {name!r}: {exc}") from exc


def _import_shipped(name: str, spec: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelError(
            f"model {spec!r}: the file was shipped to this worker in Ray's runtime env (py_modules) "
            f"but module {name!r} does not import here: {exc}. A model file must be self-contained "
            "(one file); put shared code in a package installed on every node"
        ) from exc


def _check_module_name(file: Path, spec: str) -> None:
    """Refuse a file name that a worker could not import as itself, by its stem."""
    if "." in file.stem:
        raise ModelError(f"model {spec!r}: the workers import {file.name} by its name, which has a dot; rename it")
    found = importlib.util.find_spec(file.stem)
    other = found.origin if found is not None else None
    if other and (not Path(other).is_file() or Path(other).resolve() != file):
        raise ModelError(
            f"model {spec!r}: the workers import {file.name} as module {file.stem!r}, but another "
            f"module has that name ({other}); rename the file to a name of its own"
        )


def _import_file(path: str) -> object:
    file = Path(path).resolve()
    if not file.is_file():
        raise ModelError(f"model file {path!r} does not exist")
    module_name = f"tuner_user_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    if module_spec is None or module_spec.loader is None:
        raise ModelError(f"model file {path!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
