"""Model registry: built-in names map to lazy factories; user models load from a spec.

A model spec is one of:

- a built-in name (``iterated_mlp``, ``counting_cnn``);
- ``package.module:Name``: an importable module and the model class (or instance) in it;
- ``path/to/file.py:Name``: a Python file and the model class (or instance) in it;
- ``object:Name``: a model class or instance handed to ``tuner.launch`` / ``tuner.verify`` in Python
  (:func:`object_spec`), a notebook's say.

Loading a model never imports TensorFlow: models import it inside ``build``.

A model file reaches the workers of a (multi-node) Ray cluster through Ray's runtime env, not
through its path: :func:`runtime_env` ships the one file as a ``py_modules`` entry (Ray puts it on
every worker's ``PYTHONPATH``) and names it in ``TUNER_SHIPPED_MODEL``; a worker that sees the
spec's file named there imports the shipped module by the file's stem, never the driver's path.

A model object reaches them pickled by value (cloudpickle: a class defined in a notebook
cell, or in a module beside the notebook, travels as code, not as a name to import), in the job's
runtime env: ``TUNER_OBJECT_MODEL`` holds it, base64, so it is there on every node of a cluster
joined with ``--address`` too. A class from an installed package travels as its
``package.module:Name`` spec instead, and a built-in model as its name.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import sysconfig
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tuner import environ
from tuner.errors import ModelError
from tuner.models.base import UPDATES, Dataset, Knob, Loss, Model, ModelGraph, step_seed

__all__ = ["BUILTIN", "UPDATES", "Dataset", "Knob", "Loss", "Model", "ModelGraph", "load_model", "model_file",
           "runtime_env", "step_seed"]

OBJECT_PREFIX = "object:"
MAX_OBJECT_BYTES = 96 * 1024  # base64 characters: one environment string must stay under Linux's 128 KiB
_OBJECTS: dict[str, object] = {}  # object: spec -> the model object this process was given
_T = TypeVar("_T")

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
    if spec.startswith(OBJECT_PREFIX):
        model = _object_model(spec)
        check_contract(model, spec)
        return model
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


def runtime_env(spec: str) -> dict[str, object]:
    """The Ray runtime env that ships a ``path/to/file.py:Name`` model to every worker ({} for others).

    Raises:
        ModelError: the file's name would not import as itself on a worker (see
            :func:`_check_module_name`).
    """
    if spec.startswith(OBJECT_PREFIX):
        return {"env_vars": environ.shipping_object(spec, _pickled(spec))}
    file = model_file(spec)
    if file is None:
        return {}
    _check_module_name(file, spec)
    return {"py_modules": [str(file)], "env_vars": environ.shipping_file(spec.rpartition(":")[0])}


def object_spec(model: object) -> str:
    """The spec of a model given as a Python class or instance (see the module docs): a built-in's
    name, ``package.module:Name`` for a class of an installed package, else ``object:Name`` for a
    model this process holds and ships by value.

    Raises:
        ModelError: it is not a model (the contract's members it lacks), or too large to ship.
    """
    cls = model if isinstance(model, type) else type(model)
    module, name = cls.__module__, cls.__qualname__
    for builtin, target in BUILTIN.items():
        if target == f"{module}:{name}" and isinstance(model, type):
            return builtin
    spec = f"{OBJECT_PREFIX}{cls.__name__}"
    instance = _user_call(spec, f"creating {name}()", model) if isinstance(model, type) else model
    check_contract(instance, spec)
    if isinstance(model, type) and _installed(module) and "<locals>" not in name:
        return f"{module}:{name}"
    _OBJECTS[spec] = model
    _pickled(spec)  # too large to ship: say so now, before anything starts
    return spec


def _installed(module: str) -> bool:
    """Whether ``module`` is tuner's or comes from an installed package (site-packages): importable
    on every worker."""
    if module.partition(".")[0] == "tuner":
        return True
    file = getattr(sys.modules.get(module), "__file__", None)
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    return isinstance(file, str) and Path(file).resolve().is_relative_to(site)


def _pickled(spec: str) -> str:
    """The object of ``spec``, pickled by value with Ray's cloudpickle, base64."""
    import base64

    import cloudpickle  # the package (MLflow's dependency), not Ray's copy: importing Ray here would fix its
    # settings before tuner.environ.prepare_process set them

    model = _OBJECTS.get(spec)
    if model is None:
        raise _no_object(spec)
    cls = model if isinstance(model, type) else type(model)
    by_value = sys.modules.get(cls.__module__)
    if by_value is not None and cls.__module__ != "__main__":
        cloudpickle.register_pickle_by_value(by_value)  # a module beside the notebook travels as code
    try:
        data = base64.b64encode(cloudpickle.dumps(model)).decode("ascii")
    except Exception as exc:
        raise ModelError(f"model {spec!r} cannot be pickled to ship it to the workers: {type(exc).__name__}: "
                         f"{exc}; put it in a file and pass 'path/to/file.py:Name'") from None
    finally:
        if by_value is not None and cls.__module__ != "__main__":
            cloudpickle.unregister_pickle_by_value(by_value)
    if len(data) > MAX_OBJECT_BYTES:
        raise ModelError(f"model {spec!r} pickles to {len(data) // 1024} KiB, over the {MAX_OBJECT_BYTES // 1024} "
                         "KiB that can ship with the job: it holds large data (an array, a dataset?); load the "
                         "data inside data(knobs), or put the model in a file and pass 'path/to/file.py:Name'")
    return data


def _object_model(spec: str) -> Any:
    """The model of an ``object:`` spec: the one this process was given, else (on a worker) the one
    the job's runtime env ships."""
    model = _OBJECTS.get(spec)
    shipped = environ.shipped_object(spec) if model is None else None
    if shipped is not None:
        import base64
        import pickle

        model = _user_call(spec, "unpickling the shipped model", pickle.loads, base64.b64decode(shipped))
        _OBJECTS[spec] = model
    if model is None:
        raise _no_object(spec)
    return _user_call(spec, f"creating {model.__name__}()", model) if isinstance(model, type) else model


def _no_object(spec: str) -> ModelError:
    return ModelError(f"model {spec!r} was a Python object given to tuner in another process; give it again: "
                      f"tuner.verify(..., model={spec.removeprefix(OBJECT_PREFIX)}) or "
                      f"tuner.launch(model={spec.removeprefix(OBJECT_PREFIX)}, ...)")


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


def _user_call(spec: str, doing: str, fn: Callable[..., _T], *args: object) -> _T:
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
    if environ.shipped_file(where):  # a worker: the file came in Ray's runtime env
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
