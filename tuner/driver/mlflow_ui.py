"""What a person sees of a launch in the MLflow UI: the experiment's views, run names and descriptions.

Checked in a headless browser on MLflow 3.17.2 (``bench/ui_screenshots.py``):

- MLflow 3.17 opens an experiment in its GenAI views (an Overview of traces and tokens, the runs
  under "Evaluation runs") unless the page's URL says ``workflowType=machine_learning`` or the user
  picked "Model training" in the toggle at the top left (kept in the browser, GenAI by default).
  The experiment tag ``mlflow.experimentKind`` = ``custom_model_development`` marks the study as
  model training for the pages and versions that read it; the experiment's description (shown
  above its runs) links to the training views of its runs, in the view below.
- The runs table shows Run Name, Created, Dataset, Duration, Source and Models; a study's params,
  metrics and tags are columns the user has to pick. Per-seed metrics and tags are named by the
  seed's position in its run (``s0/loss``, ``s1/val_loss``, ``s0.node_id``: :func:`seed_key`), the
  values in the run's ``seeds`` tag, so every run offers the same few columns, not one set per
  seed value the study's seed stream drew. A shared view (an
  experiment tag ``mlflow.sharedViewState.<key>``, opened with ``?viewStateShareKey=<key>``) picks
  them: status, divergence step and cause, phase, learning rate, clip norm, L2 weight, validation
  loss, steps survived and the description. MLflow leaves expanded rows out of shared views, so a
  launch's trials stay folded under its run's "+".
- The run name is the one column always shown: a trial's run is renamed when it ends to carry its
  outcome (``trial-3 diverged@109``), and its description says in one sentence what went
  non-finite where and when.
- A diverged trial's run ends FINISHED (a green check), not FAILED: MLflow's FAILED says the run
  crashed, which tuner keeps for a trial that failed after its retries (``status`` ``failed``,
  with the reason), so that ``attributes.status = 'FAILED'`` finds crashes and nothing else. A
  divergence is what the training found, recorded by the name, the ``status`` tag, the
  description, the ``divergence_step`` metric and an ``s<i>/diverged_at_step`` point at the
  divergence step beside the seed's loss and gradient-norm charts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tuner.records import Forensics, NonFiniteKind, RunRecord, RunStatus, TrialOutcome, TrialState

KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
NOTE_TAG = "mlflow.note.content"  # a run's or an experiment's description (markdown)
NAME_TAG = "mlflow.runName"
VIEW_KEY = "tuner"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
NOTE_MARK = "<!-- tuner -->"  # an experiment description tuner wrote (a user's own is kept)

_COLUMNS = [
    "tags.`status`", "metrics.`divergence_step`", "tags.`diverged_on`", "tags.`first_nonfinite_op`", "tags.`phase`",
    "params.`learning_rate`", "params.`clip_norm`", "params.`l2_weight`",
    "metrics.`val_loss`", "metrics.`min_steps_survived`", "attributes.`Description`",
]
_KINDS = {NonFiniteKind.FORWARD: "forward pass", NonFiniteKind.BACKWARD: "backward pass",
          NonFiniteKind.UPDATE: "weight update", NonFiniteKind.DATA: "input data"}


def seed_key(position: int) -> str:
    """The prefix of a seed's metrics and tags in its run: ``s0`` for the run's first seed (``s0/loss``,
    ``s0.node_id``), ``s1`` for its second, ...; the run's ``seeds`` tag lists the seed values in that order."""
    return f"s{position}"


def runs_link(experiment_id: str) -> str:
    """The URL fragment of a study's runs in the training views, with tuner's columns."""
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"


def experiment_tags(experiment_id: str, study: str) -> dict[str, str]:
    """The tags that make a study's experiment open in the training views, with tuner's columns."""
    view = {"selectedColumns": _COLUMNS, "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo", *_COLUMNS],
            "columnWidths": {"attributes.`Run Name`": 230, "metrics.`divergence_step`": 140},
            "orderByKey": "attributes.start_time", "orderByAsc": False}
    note = (f"{NOTE_MARK}**[Trials of study {study}: status, divergence step, learning rate, validation "
            f"loss]({runs_link(experiment_id)})** (tuner: a run per launch, its trials nested under it, "
            f"each named by its outcome)")
    return {KIND_TAG: TRAINING_KIND, VIEW_TAG: json.dumps(view), NOTE_TAG: note}


def run_labels(name: str, outcome: TrialOutcome) -> dict[str, str]:
    """The tags that rename a finished trial's (or phase's) run and describe it."""
    return {NAME_TAG: run_name(name, outcome), NOTE_TAG: description(outcome)}


def run_name(name: str, outcome: TrialOutcome) -> str:
    """``name`` with the outcome: ``trial-3 diverged@109``, ``trial-1 survived``, ``trial-4 stopped``."""
    first = outcome.divergence
    if outcome.state is TrialState.PRUNED and first is not None:
        return f"{name} diverged@{first.step}"
    return f"{name} {outcome.state.value}"


def description(outcome: TrialOutcome) -> str:
    """One sentence: what went non-finite where and when, or how the trial ended."""
    first = outcome.divergence
    if outcome.state is TrialState.PRUNED and first is not None:
        return divergence_sentence(first, outcome)
    if outcome.state is TrialState.COMPLETE:
        steps = min(outcome.steps_survived, default=0)
        value = f"; validation loss {outcome.value:.4g}" if outcome.value is not None else ""
        init = f" (at initialisation {outcome.init_val_loss:.4g})" if outcome.init_val_loss is not None else ""
        learned = "" if outcome.learned is not False else ": it did not learn"
        seeds = "its 1 seed" if len(outcome.seeds) == 1 else f"all {len(outcome.seeds)} seeds"
        return f"Survived {steps} steps on {seeds}{value}{init}{learned}."
    what = "Stopped" if outcome.state is TrialState.STOPPED else "Failed"
    return f"{what}: {outcome.reason or 'no reason recorded'}."


def divergence_sentence(first: RunRecord, outcome: TrialOutcome) -> str:
    """``Seed 7 diverged at step 109: the loss went non-finite first, in op ... (forward pass).``"""
    what = first.cause or "a value"  # "loss", or with several losses 'gradient of loss "g_loss"'
    where = _where(first.forensics)
    also = [f"seed {r.seed} at step {r.step}" for r in outcome.seeds
            if r.status is RunStatus.DIVERGED and r is not first]
    cancelled = sum(r.status is RunStatus.CANCELLED for r in outcome.seeds)
    tail = f"; {', '.join(also)} diverged too" if also else ""
    tail += f"; {cancelled} other seed(s) were cancelled" if cancelled else ""
    return f"Seed {first.seed} diverged at step {first.step}: the {what} went non-finite first{where}{tail}."


def _where(found: Forensics | None) -> str:
    if found is None or found.kind is None:
        return " (the replay of that step did not find the op)" if found is not None else ""
    if found.kind is NonFiniteKind.DATA:
        samples = ", ".join(map(str, found.samples[:5]))
        return f", from the data: sample(s) {samples} of the step's batch hold non-finite values"
    parts = [_KINDS[found.kind]]
    if found.iteration is not None:
        parts.append(f"loop iteration {found.iteration}")
    if found.forward_op:
        parts.append(f"the gradient of {found.forward_op}")
    return f", in op {found.op} ({found.op_type}, {', '.join(parts)})"


def divergence_points(outcome: TrialOutcome, positions: Mapping[int, int]) -> list[tuple[str, float, int]]:
    """(metric, value, step) marking each diverged seed's divergence step on its charts:
    ``divergence_step`` (the first, a column of the runs table) and ``s<i>/diverged_at_step``, i the
    seed's position in the run (``positions``: seed -> position, holding every seed of ``outcome``)."""
    diverged = [r for r in outcome.seeds if r.status is RunStatus.DIVERGED]
    points = [(f"{seed_key(positions[r.seed])}/diverged_at_step", float(r.step), r.step) for r in diverged]
    first = outcome.divergence
    if first is not None and outcome.state is TrialState.PRUNED:
        points.append(("divergence_step", float(first.step), first.step))
    return points
