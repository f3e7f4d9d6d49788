"""best_config.yaml: the chosen config and the evidence that it is stable.

The best trial is the COMPLETE one with the lowest validation loss. If no trial survived the
budget, it is the one that survived longest (its slowest seed), and the YAML says plainly that
it diverged. Everything is read back from the Optuna storage, so a finished study can be exported
again without training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner.config import redact
from tuner.spaces import TUNER_KNOBS

_ORDER = ("learning_rate", "clip_norm", "l2_weight", "max_iter")
_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The best COMPLETE trial; else the longest-surviving PRUNED one; None if neither."""
    trials = [t for t in study.get_trials(deepcopy=False, states=_FINISHED) if "config" in t.user_attrs]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if complete:
        return min(complete, key=lambda t: (t.value, t.number))
    if not trials:
        return None
    return max(trials, key=lambda t: (min(t.user_attrs["steps_survived"], default=0), -t.number))


def best_config(study: optuna.Study, storage: str, steps: int) -> dict[str, Any]:
    """The content of best_config.yaml for ``study`` (see the module docs)."""
    trial = best_trial(study)
    if trial is None:
        raise ValueError(f"study {study.study_name!r} has no finished trial to export")
    attrs = trial.user_attrs
    diverged = trial.state != optuna.trial.TrialState.COMPLETE
    doc: dict[str, Any] = {
        "config": ordered_config(attrs["config"]),
        "stability": {
            "steps": attrs.get("steps", steps),
            "seeds": attrs["seeds"],
            "steps_survived": attrs["steps_survived"],
            "diverged": diverged,
            "val_loss": attrs.get("val_loss"),
        },
        "study": {
            "name": study.study_name,
            "storage": redact(storage),
            "trial": trial.number,
            "mlflow_run_id": attrs.get("mlflow_run_id"),
        },
    }
    if diverged:
        doc["stability"]["divergence_step"] = attrs.get("divergence_step")
        doc["stability"]["diverged_on"] = attrs.get("diverged_on")
        doc["note"] = (
            "No trial survived the budget on every seed: this is the longest-surviving config. "
            "Narrow the search space (lower learning rates, clipping, fewer iterations) and launch again."
        )
    return doc


def ordered_config(config: dict[str, Any]) -> dict[str, Any]:
    """Tuner's headline knobs first, then the model's knobs, then the other tuner knobs."""
    head = {k: config[k] for k in _ORDER if k in config}
    model_knobs = {k: v for k, v in config.items() if k not in head and k not in TUNER_KNOBS}
    rest = {k: v for k, v in config.items() if k not in head and k not in model_knobs}
    return {**head, **model_knobs, **rest}


def write_best(path: str | Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as YAML (key order kept)."""
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
