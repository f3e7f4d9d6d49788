"""tuner: find training configs of TF1 graph-mode models that do not diverge.

The public API (``__all__``; docs/api.md)::

    import tuner
    result = tuner.launch("iterated_mlp", trials=8, steps=300)   # python -m tuner launch ...
    result.config, result.trusted, result.reason                 # best_config.yaml, typed
    result.trials_dataframe()                                    # one row per trial
    tuner.load("iterated_mlp").plot_stability_map()              # a study, finished or running
    tuner.verify(result, seeds=16)                               # python -m tuner verify ...

Importing this package is cheap: the names below are loaded when first used, and TensorFlow and
Ray are imported only by the modules that need them (``tuner.worker.train`` and the model builders
in the workers; ``tuner.driver.executor`` in the driver).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first use: PEP 562)
_PUBLIC = {
    "launch": "tuner.api", "load": "tuner.api", "verify": "tuner.api", "Result": "tuner.api",
    "BestConfig": "tuner.answer",
    "TrialRecord": "tuner.driver.trialrecord", "SeedResult": "tuner.driver.trialrecord",
    "Verification": "tuner.driver.evidence",
    "TunerError": "tuner.errors", "ConfigError": "tuner.errors", "ModelError": "tuner.errors",
    "Interrupted": "tuner.errors", "NoTrialFinished": "tuner.errors",
    "Model": "tuner.models.base", "Knob": "tuner.models.base", "ModelGraph": "tuner.models.base",
    "Dataset": "tuner.models.base", "Loss": "tuner.models.base",
}
__all__ = [
    "BestConfig", "ConfigError", "Dataset", "Interrupted", "Knob", "Loss", "Model", "ModelError", "ModelGraph",
    "NoTrialFinished", "Result", "SeedResult", "TrialRecord", "TunerError", "Verification", "__version__",
    "launch", "load", "verify",
]

if TYPE_CHECKING:
    from tuner.answer import BestConfig
    from tuner.api import Result, launch, load, verify
    from tuner.driver.evidence import Verification
    from tuner.driver.trialrecord import SeedResult, TrialRecord
    from tuner.errors import ConfigError, Interrupted, ModelError, NoTrialFinished, TunerError
    from tuner.models.base import Dataset, Knob, Loss, Model, ModelGraph


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
