"""Model registry: built-in names map to lazy factories; user models load from a spec.

A model spec is one of:

- a built-in name (``iterated_mlp``, ``counting_cnn``);
- ``package.module:Name``: an importable module and the model class (or instance) in it;
- ``path/to/file.py:Name``: a Python file and the model class (or instance) in it.

Loading a model never imports TensorFlow: models import it inside ``build``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from tuner.errors import ModelError
from tuner.models.base import Dataset, Knob, Model, ModelGraph

__all__ = ["BUILTIN", "Dataset", "Knob", "Model", "ModelGraph", "load_model", "model_file"]

# built-in name -> "module:attribute", imported only when asked for
BUILTIN: dict[str, str] = {
    "iterated_mlp": "tuner.models.iterated_mlp:IteratedMLP",
    "counting_cnn": "tuner.models.counting_cnn:CountingCNN",
}


def load_model(spec: str) -> Model:
    """Return the model named by ``spec`` (see the module docs), checked against the contract.

    Raises:
        ModelError: the spec names nothing loadable, or the object is not a model.
    """
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ModelError(
            f"unknown model {spec!r}: use one of {sorted(BUILTIN)}, "
            "'package.module:Name' or 'path/to/file.py:Name'"
        )
    where, _, name = target.rpartition(":")
    module = _import_file(where) if where.endswith(".py") else _import_module(where, spec)
    obj = getattr(module, name, None)
    if obj is None:
        raise ModelError(f"model {spec!r}: {where} has no attribute {name!r}")
    model = obj() if isinstance(obj, type) else obj
    check_contract(model, spec)
    return model


def model_file(spec: str) -> Path | None:
    """The file a ``path/to/file.py:Name`` spec points to (None for other specs)."""
    where = spec.rpartition(":")[0]
    return Path(where).resolve() if spec not in BUILTIN and where.endswith(".py") else None


def check_contract(model: object, spec: str) -> None:
    """Raise ModelError naming each contract member ``model`` lacks or gets wrong."""
    missing = [m for m in ("knobs", "build", "data") if not hasattr(model, m)]
    if missing:
        raise ModelError(
            f"model {spec!r} does not follow the model contract: missing {', '.join(missing)} "
            "(see docs/models.md)"
        )
    for member in ("build", "data"):
        if not callable(getattr(model, member)):
            raise ModelError(f"model {spec!r}: {member} must be a method")
    knobs = model.knobs  # type: ignore[attr-defined]
    if not isinstance(knobs, dict) or not all(isinstance(k, Knob) for k in knobs.values()):
        raise ModelError(f"model {spec!r}: knobs must be a dict of name -> tuner.models.Knob")


def _import_module(name: str, spec: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelError(f"model {spec!r}: cannot import module {name!r}: {exc}") from exc


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
    module_spec.loader.exec_module(module)
    return module
