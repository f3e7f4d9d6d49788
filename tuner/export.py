"""best_config.yaml: the chosen config and the evidence that it is stable.

The exported trial is the one the end-of-launch verification chose (``tuner.verify``): the best
validation loss among the raced configs whose survival on fresh seeds has a 95% lower bound at or
above ``--min-survival``; if none qualifies, the highest lower bound, and the YAML says plainly
that no config met the bar. Without a verification (``--verify-seeds 0``), it is the COMPLETE
trial that learned with the lowest validation loss, and the YAML says it was not verified. A
config that survived but did not learn (validation loss not below the loss at initialisation) is
never exported as a success; if no trial survived, the longest-surviving one is exported with
``diverged: true``. Everything is read back from the Optuna storage, so a finished study can be
exported again without training.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner import studyrecord
from tuner.config import redact
from tuner.errors import NoTrialFinished
from tuner.spaces import TUNER_KNOBS

_ORDER = ("learning_rate", "clip_norm", "l2_weight", "max_iter")
_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
UNVERIFIED_RULE = "lowest validation loss among the COMPLETE trials that learned (not verified on fresh seeds)"


def best_trial(study: optuna.Study) -> tuple[optuna.trial.FrozenTrial, str] | None:
    """The trial to export and the rule that picked it; None if the study has no finished trial."""
    trials = [t for t in study.get_trials(deepcopy=False, states=_FINISHED) if "config" in t.user_attrs]
    chosen = studyrecord.choice(study)
    by_number = {t.number: t for t in trials}
    if chosen is not None and chosen.trial in by_number:
        return by_number[chosen.trial], chosen.rule
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    learned = [t for t in complete if t.user_attrs.get("learned") is not False]
    if learned:
        return min(learned, key=lambda t: (t.value, t.number)), UNVERIFIED_RULE
    if complete:
        rule = "no COMPLETE trial learned: the lowest validation loss of those that survived"
        return min(complete, key=lambda t: (t.value, t.number)), rule
    trials = [t for t in trials if t.user_attrs.get("status") != "stopped"]  # finite, stopped for its loss
    if not trials:
        return None
    rule = "no trial survived the budget: the one whose weakest seed survived longest"
    return max(trials, key=lambda t: (min(t.user_attrs["steps_survived"], default=0), -t.number)), rule


def best_config(study: optuna.Study, storage: str, steps: int, model: str | None = None) -> dict[str, Any]:
    """The content of best_config.yaml for ``study`` (see the module docs).

    Raises:
        NoTrialFinished: the study has no finished trial (every trial failed).
    """
    found = best_trial(study)
    if found is None:
        raise NoTrialFinished(all_failed_message(study))
    trial, rule = found
    attrs = trial.user_attrs
    diverged = trial.state != optuna.trial.TrialState.COMPLETE
    verified = studyrecord.verifications(study).get(trial.number)
    margin = studyrecord.margins(study).get(trial.number)
    stability: dict[str, Any] = {
        "steps": attrs.get("steps", steps),
        "seeds": attrs["seeds"],
        "steps_survived": attrs["steps_survived"],
        "diverged": diverged,
        "val_loss": attrs.get("val_loss"),
        "learned": attrs.get("learned"),
        "init_val_loss": attrs.get("init_val_loss"),
        "rule": rule,
        "verified": verified.to_dict() if verified else None,
    }
    if margin is not None:
        stability["margin"] = margin.to_dict()
    if diverged:
        stability["divergence_step"] = attrs.get("divergence_step")
        stability["diverged_on"] = attrs.get("diverged_on")
    doc: dict[str, Any] = {
        "config": ordered_config(attrs["config"]),
        "stability": stability,
        "study": {
            "name": study.study_name,
            "model": model,
            "storage": redact(storage),
            "trial": trial.number,
            "mlflow_run_id": attrs.get("mlflow_run_id"),
        },
    }
    note = _note(diverged, attrs.get("learned"), verified)
    if note:
        doc["note"] = note
    return doc


def all_failed_message(study: optuna.Study, top: int = 3) -> str:
    """One line for a study whose every trial failed: how many, and the most common reasons."""
    failed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
    reasons = Counter(_reason(t) for t in failed)
    common = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common(top))
    return (f"all {len(failed)} trial(s) of study {study.study_name!r} failed, nothing to export; most common "
            f"reasons: {common or 'none recorded'}. The study and its MLflow runs are kept: fix the cause, then "
            "launch again with a new --study")


def _reason(trial: optuna.trial.FrozenTrial) -> str:
    reason = trial.user_attrs.get("reason")
    if not reason:
        return "interrupted (its launch stopped)" if trial.user_attrs.get("status") is None else "unknown"
    return " ".join(str(reason).split())[:160]


def is_success(doc: dict[str, Any]) -> bool:
    """Whether best_config.yaml claims a stable config: it survived, learned, and (if verified)
    met the bar."""
    stability = doc["stability"]
    verified = stability.get("verified")
    return (not stability["diverged"] and stability.get("learned") is not False
            and (verified is None or bool(verified["met"])))


def _note(diverged: bool, learned: bool | None, verified: Any) -> str:
    if diverged:
        return ("No trial survived the budget on every seed: this is the longest-surviving config. "
                "Narrow the search space (lower learning rates, clipping, fewer iterations) and launch again.")
    if learned is False:
        return ("This config survived but did not learn: its validation loss is not below its loss at "
                "initialisation. No config that learned survived; widen the search space toward lower "
                "learning rates and launch again.")
    if verified is not None and not verified.met:
        return (f"No config met the bar: this one {verified.text()} on fresh seeds, below the required "
                f"{verified.min_survival:g}. Do not rely on it; launch more trials, raise --race-seeds or "
                "narrow the space toward what survived.")
    if verified is None:
        return "Not verified on fresh seeds: check it with `python -m tuner verify` before relying on it."
    return ""


def ordered_config(config: dict[str, Any]) -> dict[str, Any]:
    """Tuner's headline knobs first, then the model's knobs, then the other tuner knobs."""
    head = {k: config[k] for k in _ORDER if k in config}
    model_knobs = {k: v for k, v in config.items() if k not in head and k not in TUNER_KNOBS}
    rest = {k: v for k, v in config.items() if k not in head and k not in model_knobs}
    return {**head, **model_knobs, **rest}


def write_best(path: str | Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as YAML (key order kept)."""
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
