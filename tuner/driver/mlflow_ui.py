"""What a person sees of a launch in the MLflow UI: the experiment's view, run names and descriptions.

Read from MLflow 3.17.2's own UI bundle (``mlflow/server/js/build/static/js``) and checked in a
headless Chromium from a fresh profile (``tests/test_ui.py``, ``bench/ui_screenshots.py``):

- **GenAI or model training** is the browser's choice, not the experiment's: a switch kept in the
  browser's localStorage (``mlflow.workflowType``, GenAI on a fresh profile) unless the URL says
  ``workflowType=machine_learning`` (the ``workflowType`` context in ``main.*.js``; its
  experiment-kind hook returns the switch's kind whenever the feature flag ``Z0`` is on, and in
  3.17.2 it is ``()=>!0``, so the experiment tag ``mlflow.experimentKind`` is not read). A new user
  who clicks the experiment in the list lands on the GenAI overview (traces, "No data"); the
  experiment's description, shown above every page of it, links to the trials table in the
  training view, and so does the link the launch prints (:func:`runs_link`). The tag
  ``mlflow.experimentKind`` = ``custom_model_development`` is kept for the versions that read it.
- **Columns** come from the browser's saved state of the experiment, or from a shared view (an
  experiment tag ``mlflow.sharedViewState.<key>``, opened with ``?viewStateShareKey=<key>``); the
  default is Run Name, Created, Dataset, Duration, Source, Models. A shared view is the one way a
  server sets columns, and MLflow shows it under a banner "You're viewing a shared view"
  (dismissable; "Override saved view" keeps it as the browser's own view, after which the table
  opens with tuner's columns and no banner). tuner's view picks: chosen, status, validation
  loss, seeds survived, divergence step and cause, why not chosen, learning rate, clip norm, L2
  weight and the description.
- **Nested runs fold** under their parent (a "+") while the table is sorted by creation time with no
  filter (``nestChildren`` in the runs table: ``!orderByKey && !searchFilter || orderByKey ===
  start_time``), and a shared view leaves expanded rows out. tuner's view filters on
  ``tags.phase = 'search'`` (a trial's own run, which holds its final status, race seeds
  included) and sorts by validation loss, lowest first: one flat row per trial, diverged and
  stopped trials (no validation loss) last.
- The run name is the one column always shown: a trial's run is renamed when it ends to carry its
  outcome (``trial-3 diverged@109``), and the exported trial's once the launch chose it
  (``trial-4 survived, exported``, tag ``chosen`` = ``true``); its description says in one
  sentence what went non-finite where and when, or what the export rests on.
- A diverged trial's run ends FINISHED (a green check), not FAILED: MLflow's FAILED says the run
  crashed, which tuner keeps for a trial that failed after its retries (``status`` ``failed``,
  with the reason), so that ``attributes.status = 'FAILED'`` finds crashes and nothing else. A
  divergence is what the training found, recorded by the name, the ``status`` tag, the
  description, the ``divergence_step`` metric and an ``s<i>/diverged_at_step`` point at the
  divergence step. Every chart of the run is titled with the run's name, so the loss chart, whose
  line ends at the last finite loss, says ``trial-3 diverged@109 (s0/loss)``. A NaN point in the
  loss itself would hide the whole chart (MLflow drops a chart whose latest value is NaN), and an
  infinite one is stored as 1.8e308: neither is logged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tuner.records import Forensics, NonFiniteKind, RunRecord, RunStatus, TrialOutcome, TrialState

if TYPE_CHECKING:
    from tuner.driver.trialrecord import TrialRecord

KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
NOTE_TAG = "mlflow.note.content"  # a run's or an experiment's description (markdown)
NAME_TAG = "mlflow.runName"
VIEW_KEY = "tuner"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
NOTE_MARK = "tuner study "  # how an experiment description tuner wrote starts (a user's own is kept)
OLD_NOTE_MARK = "<!-- tuner -->"  # how it started before (issue 28): rewritten too
CHOSEN_TAG = "chosen"  # "true" on the run of the trial best_config.yaml exports
WHY_TAG = "why_not_chosen"  # on every other trial's run: why it is not the export, in one short line
EXPORTED = ", exported"  # the exported trial's run name ends with this

_COLUMNS = [
    "tags.`chosen`", "tags.`status`", "metrics.`val_loss`", "metrics.`seeds_survived`", "metrics.`divergence_step`",
    "tags.`diverged_on`", "tags.`why_not_chosen`", "params.`learning_rate`", "params.`clip_norm`",
    "params.`l2_weight`", "attributes.`Description`",
]
TRIALS_FILTER = "tags.phase = 'search'"  # a trial's own run (not its race, verification or margin runs)
SORT_KEY = "metrics.`val_loss`"  # sorted by anything but the start time, MLflow shows nested runs flat
_KINDS = {NonFiniteKind.FORWARD: "forward pass", NonFiniteKind.BACKWARD: "backward pass",
          NonFiniteKind.UPDATE: "weight update", NonFiniteKind.DATA: "input data"}


def seed_key(position: int) -> str:
    """The prefix of a seed's metrics and tags in its run: ``s0`` for the run's first seed (``s0/loss``,
    ``s0.node_id``), ``s1`` for its second, ...; the run's ``seeds`` tag lists the seed values in that order."""
    return f"s{position}"


def runs_link(experiment_id: str) -> str:
    """The URL fragment of a study's trials table: the training view, tuner's shared view (columns,
    filter, sort), one flat row per trial."""
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"


def runs_url(base: str, experiment_id: str) -> str:
    """:func:`runs_link` on the MLflow UI at ``base`` (``http://127.0.0.1:5000``)."""
    return f"{base.rstrip('/')}/{runs_link(experiment_id)}"


def view_state() -> dict[str, object]:
    """tuner's shared view of the runs table (see the module docs)."""
    return {"selectedColumns": _COLUMNS, "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo", *_COLUMNS],
            "columnWidths": {"attributes.`Run Name`": 260, "tags.`why_not_chosen`": 300},
            "searchFilter": TRIALS_FILTER, "orderByKey": SORT_KEY, "orderByAsc": True}


def experiment_note(experiment_id: str, study: str, exported: str | None = None) -> str:
    """The experiment's description: plain words first (the experiment list shows its first 25 or so
    characters, as typed), then the link to the trials table (Markdown, on the experiment's pages)."""
    head = f"{NOTE_MARK}{study}: " + (f"{exported}. " if exported else "")
    return (f"{head}[Open the trials table]({runs_link(experiment_id)}) (training view: one run per trial, "
            "named by its outcome; the column chosen marks the exported one).")


def is_tuner_note(note: str | None) -> bool:
    """Whether an experiment description is one tuner wrote (and may rewrite)."""
    return not note or note.startswith((NOTE_MARK, OLD_NOTE_MARK))


def experiment_tags(experiment_id: str, study: str) -> dict[str, str]:
    """The tags that make a study's experiment open in the training views, with tuner's columns."""
    return {KIND_TAG: TRAINING_KIND, VIEW_TAG: json.dumps(view_state()),
            NOTE_TAG: experiment_note(experiment_id, study)}


def exported_name(name: str) -> str:
    """The run name of the exported trial: ``trial-4 survived, exported``."""
    return name if name.endswith(EXPORTED) else f"{name}{EXPORTED}"


def run_labels(name: str, outcome: TrialOutcome) -> dict[str, str]:
    """The tags that rename a finished trial's (or phase's) run and describe it."""
    return {NAME_TAG: run_name(name, outcome), NOTE_TAG: description(outcome)}


def run_name(name: str, outcome: TrialOutcome) -> str:
    """``name`` with the outcome: ``trial-3 diverged@109``, ``trial-1 survived``, ``trial-4 stopped``."""
    first = outcome.divergence
    if outcome.state is TrialState.DIVERGED and first is not None:
        return f"{name} diverged@{first.step}"
    return f"{name} {outcome.state.value}"


def description(outcome: TrialOutcome) -> str:
    """One sentence: what went non-finite where and when, or how the trial ended."""
    first = outcome.divergence
    if outcome.state is TrialState.DIVERGED and first is not None:
        return divergence_sentence(first, outcome)
    if outcome.state is TrialState.SURVIVED:
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
    if first is not None and outcome.state is TrialState.DIVERGED:
        points.append(("divergence_step", float(first.step), first.step))
    return points


EXPORT_BREAK = "\n\n"  # between the export sentence and the run's own description


def exported_note(sentence: str, note: str) -> str:
    """The exported trial's run description: what the export rests on, then how the trial ended."""
    return f"{sentence}{EXPORT_BREAK}{note}" if note else sentence


def unexported_note(note: str) -> str:
    """A run description without the export sentence :func:`exported_note` put first."""
    head, sep, rest = note.partition(EXPORT_BREAK)
    return rest if sep and head.startswith("Trial ") and " is exported (best_config.yaml)" in head else note


def export_sentence(record: TrialRecord, rule: str) -> str:
    """What the export rests on, in one sentence: ``Trial 4 is exported (best_config.yaml): validation
    loss 0.0545 on 8 seeds; verified on fresh seeds x 1200 steps: survived 16/16 (...); rule: ...``."""
    parts = [f"Trial {record.number} is exported (best_config.yaml)"]
    if record.value is not None:
        parts.append(f"validation loss {record.value:.4g} on {len(record.seeds)} seed(s)")
    else:
        parts.append(f"{record.state.value}, weakest seed survived {record.weakest} steps")
    v = record.verification
    parts.append(f"verified on fresh seeds x {v.steps} steps: {v.text()}" if v else "not verified on fresh seeds")
    if record.margin is not None:
        parts.append(f"survives {record.margin.lr_factor:g}x its learning rate")
    return f"{parts[0]}: {'; '.join(parts[1:])}; rule: {rule}."


def exported_phrase(record: TrialRecord) -> str:
    """A few words for the experiment list: ``trial 4 exported, val loss 0.0545, verified 16/16``."""
    text = f"trial {record.number} exported"
    if record.value is not None:
        text += f", val loss {record.value:.4g}"
    if record.verification is not None:
        text += f", verified {record.verification.survived}/{record.verification.runs}"
    return text
