"""best_config.yaml: the chosen config and the evidence that it is stable.

The exported trial is the one the end-of-launch verification chose (``tuner.driver.verify``): the best
validation loss among the raced configs whose survival on fresh seeds has a 95% lower bound at or
above ``--min-survival``; if none qualifies, the highest lower bound, and the YAML says plainly
that no config met the bar. Without a verification (``--verify-seeds 0``), it is the COMPLETE
trial that learned with the lowest validation loss among those raced to ``--race-seeds`` (all of
them if none was), and the YAML says it was not verified. Either way it is the study's incumbent
(``tuner.driver.trialrecord.incumbent``), the trial every view marks. A
config that survived but did not learn (validation loss not below the loss at initialisation) is
never exported as a success; if no trial survived, the longest-surviving one is exported with
``diverged: true``. Everything is read back from the Optuna storage, so a finished study can be
exported again without training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
import yaml

from tuner import atomic
from tuner.answer import BestConfig
from tuner.config import redact
from tuner.driver import studyrecord, trialrecord
from tuner.driver.trialrecord import REASON, TrialRecord
from tuner.errors import NoTrialFinished
from tuner.records import TrialState
from tuner.spaces import TUNER_KNOBS

if TYPE_CHECKING:
    from tuner.driver.evidence import Verification

_ORDER = ("learning_rate", "clip_norm", "l2_weight", "max_iter")


def best_trial(study: optuna.Study) -> tuple[TrialRecord, str] | None:
    """The trial to export, the incumbent (``tuner.driver.trialrecord.incumbent``), and the rule that
    picked it; None if the study has no finished trial."""
    return trialrecord.incumbent(trialrecord.study_records(study), studyrecord.choice(study),
                                 studyrecord.race_seeds(study))


def best_config(study: optuna.Study, storage: str, steps: int, model: str | None = None,
                runs: Mapping[int, str] | None = None) -> dict[str, object]:
    """The content of best_config.yaml for ``study`` (see the module docs).

    ``runs`` maps a trial number to its MLflow run id (``tuner.driver.mlflow_runs``: the search
    records none); ``mlflow_run_id`` is the one an old record holds, else the one ``runs`` names, else null.

    Raises:
        NoTrialFinished: the study has no finished trial (every trial failed).
    """
    found = best_trial(study)
    if found is None:
        raise NoTrialFinished(all_failed_message(study))
    trial, rule = found
    diverged = trial.state is not TrialState.SURVIVED
    stability: dict[str, object] = {
        "steps": trial.steps or steps,
        "seeds": list(trial.seed_numbers),
        "steps_survived": list(trial.steps_survived),
        "diverged": diverged,
        "val_loss": trial.value,
        "learned": trial.learned,
        "init_val_loss": trial.init_val_loss,
        "rule": rule,
        "verified": trial.verification.to_dict() if trial.verification else None,
    }
    if trial.margin is not None:
        stability["margin"] = trial.margin.to_dict()
    if diverged:
        stability["divergence_step"] = trial.divergence_step
        stability["diverged_on"] = trial.diverged_on
        stability["seed_status"] = [s.text() for s in trial.seeds]
    where: dict[str, object] = {
        "name": study.study_name,
        "model": model,
        "storage": redact(storage),
        "trial": trial.number,
        "mlflow_run_id": trial.run_id or (runs or {}).get(trial.number),
    }
    doc: dict[str, object] = {"config": ordered_config(dict(trial.config)), "stability": stability, "study": where}
    budgets = (studyrecord.owner(study) or {}).get("steps") or []
    if len(budgets) > 1:  # continued with --allow-steps-change
        where["searched_at_steps"] = budgets
    note = _note(diverged, trial.learned, trial.verification)
    if note:
        doc["note"] = note
    return BestConfig.of(doc, "the exported document").to_dict()  # the shape tuner.answer defines


def all_failed_message(study: optuna.Study, top: int = 3) -> str:
    """One line for a study whose every trial failed: how many, and the most common reasons."""
    failed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
    reasons = Counter(_reason(t) for t in failed)
    common = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common(top))
    return (f"all {len(failed)} trial(s) of study {study.study_name!r} failed, nothing to export; most common "
            f"reasons: {common or 'none recorded'}. The study and its MLflow runs are kept: fix the cause, then "
            "launch again with a new --study")


def _reason(trial: optuna.trial.FrozenTrial) -> str:
    record = trialrecord.read(trial)
    reason = record.reason if record is not None else trial.user_attrs.get(REASON)  # set by tuner.driver.liveness
    if not reason:
        return "interrupted (its launch stopped)" if record is None else "unknown"
    return " ".join(str(reason).split())[:160]


def is_success(doc: Mapping[str, object]) -> bool:
    """Whether best_config.yaml claims a stable config: it survived, learned, and (if verified)
    met the bar."""
    return BestConfig.of(doc).trusted


def _note(diverged: bool, learned: bool | None, verified: Verification | None) -> str:
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


def ordered_config(config: Mapping[str, object]) -> dict[str, object]:
    """Tuner's headline knobs first, then the model's knobs, then the other tuner knobs."""
    head = {k: config[k] for k in _ORDER if k in config}
    model_knobs = {k: v for k, v in config.items() if k not in head and k not in TUNER_KNOBS}
    rest = {k: v for k, v in config.items() if k not in head and k not in model_knobs}
    return {**head, **model_knobs, **rest}


def write_best(path: str | Path, doc: Mapping[str, object]) -> None:
    """Write ``doc`` as YAML (key order kept), atomically: on a full disk the earlier file stays whole.

    Raises:
        OutputError: it could not be written (``tuner.atomic``).
    """
    atomic.write_text(path, yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
