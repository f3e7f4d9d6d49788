"""What a person sees of a study in the MLflow UI and optuna-dashboard.

See tuner.driver.mlflow_ui and bench/ui_screenshots.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.conftest import ROOT, bench_module
from tuner.records import (
    DivergedOn,
    Forensics,
    NonFiniteKind,
    RunRecord,
    RunStatus,
    TrainConfig,
    TrialOutcome,
    TrialState,
)


def diverged_outcome(number: int) -> TrialOutcome:
    """Seed 7 diverges at step 109 in iter_2/recompute_input/Log; seed 8 is cancelled at step 100."""
    found = Forensics(109, NonFiniteKind.FORWARD, op="iter_2/recompute_input/Log", op_type="Log",
                      layer="recompute_input", iteration=2)
    first = RunRecord(number, 7, 109, RunStatus.DIVERGED, final=True, steps_survived=108, last_finite_loss=1.2,
                      diverged_on=DivergedOn.LOSS, forensics=found)
    sibling = RunRecord(number, 8, 100, RunStatus.CANCELLED, final=True, steps_survived=100)
    return TrialOutcome(number, TrainConfig(3e-3), TrialState.DIVERGED, (first, sibling))


def test_tracker_opens_the_training_views_and_names_each_run_by_its_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = Tracker(uri, "s", {"model": "planted"})
    survived = RunRecord(0, 5, 200, RunStatus.SURVIVED, final=True, steps_survived=200, val_loss=0.25,
                         init_val_loss=2.0)
    tracker.on_trial_start(0, TrainConfig(1e-3), (5,))
    tracker.on_trial_start(1, TrainConfig(3e-3), (7, 8))
    tracker.on_trial_complete(TrialOutcome(0, TrainConfig(1e-3), TrialState.SURVIVED, (survived,), value=0.25))
    # the final record of a divergence at step 109 holds the last finite loss, of step 108
    tracker.on_trial_result(dataclasses.replace(diverged_outcome(1).seeds[0], loss=1.2))
    tracker.on_trial_complete(diverged_outcome(1))
    tracker.close()

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("s")
    assert experiment is not None
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(experiment.tags["mlflow.sharedViewState.tuner"])
    assert "tags.`status`" in view["selectedColumns"] and "params.`learning_rate`" in view["selectedColumns"]
    link = f"#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=tuner"
    assert link in experiment.tags["mlflow.note.content"]

    runs = {r.data.tags["trial"]: r for r in client.search_runs([experiment.experiment_id]) if "trial" in r.data.tags}
    assert runs["0"].info.run_name == "trial-0 survived"
    assert runs["0"].data.tags["mlflow.note.content"] == (
        "Survived 200 steps on its 1 seed; validation loss 0.25 (at initialisation 2).")
    diverged = runs["1"]
    assert (diverged.info.run_name, diverged.info.status) == ("trial-1 diverged@109", "FINISHED")
    assert diverged.data.tags["mlflow.note.content"] == (
        "Seed 7 diverged at step 109: the loss went non-finite first, in op iter_2/recompute_input/Log "
        "(Log, forward pass, loop iteration 2); 1 other seed(s) were cancelled.")
    marker = client.get_metric_history(diverged.info.run_id, "s0/diverged_at_step")  # seed 7, the run's first
    assert [(m.step, m.value) for m in marker] == [(109, 109.0)]
    loss = client.get_metric_history(diverged.info.run_id, "s0/loss")
    assert [(m.step, m.value) for m in loss] == [(108, 1.2)]  # charted at the step it was measured
    assert diverged.data.metrics["divergence_step"] == 109.0


def test_tracker_keeps_an_experiment_description_the_user_wrote(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    Tracker(uri, "s", {}).close()
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("s")
    assert experiment is not None
    experiment_id = experiment.experiment_id
    client.set_experiment_tag(experiment_id, "mlflow.note.content", "my notes")
    Tracker(uri, "s", {}).close()
    assert client.get_experiment(experiment_id).tags["mlflow.note.content"] == "my notes"


def survived_outcome(number: int, value: float, seeds: tuple[int, ...] = (5,)) -> TrialOutcome:
    runs = tuple(RunRecord(number, seed, 200, RunStatus.SURVIVED, final=True, steps_survived=200, val_loss=value,
                           init_val_loss=2.0) for seed in seeds)
    return TrialOutcome(number, TrainConfig(1e-3 * (number + 1)), TrialState.SURVIVED, runs, value=value)


def stopped_outcome(number: int) -> TrialOutcome:
    run = RunRecord(number, 5, 50, RunStatus.CANCELLED, final=True, steps_survived=50)
    return TrialOutcome(number, TrainConfig(1e-2), TrialState.STOPPED, (run,),
                        reason="its first seed's validation loss 0.9 was more than 1.2x the best trial's 0.25;")


def told_study(outcomes: list[TrialOutcome]) -> optuna.Study:
    """An in-memory study holding ``outcomes``, each told as the search tells it (its record, its
    intermediate values, then tuner.driver.outcome.tell)."""
    from tuner.driver.outcome import tell
    from tuner.driver.trialrecord import ATTR, TrialRecord

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", study_name="s")
    for outcome in outcomes:
        trial = study.ask()
        trial.report(1.5, 25)
        trial.report(1.2, 50)
        trial.set_user_attr(ATTR, TrialRecord.from_outcome(outcome, 200).to_dict())
        tell(study, trial.number, outcome)
    return study


def test_a_stopped_trial_has_no_value_and_tpe_ranks_it_as_before() -> None:
    """optuna-dashboard draws a PRUNED trial's value on the val_loss axis: a trial the pruner
    stopped (its intermediate values are training losses) is told with none; TPE's ranking of
    pruned trials reads the intermediate values alone, which are kept."""
    from optuna.samplers._tpe.sampler import _get_pruned_trial_score

    study = told_study([survived_outcome(0, 0.25), stopped_outcome(1)])
    survived, stopped = study.trials
    assert (survived.state, survived.value) == (optuna.trial.TrialState.COMPLETE, 0.25)
    assert (stopped.state, stopped.value) == (optuna.trial.TrialState.PRUNED, None)
    assert stopped.intermediate_values == {25: 1.5, 50: 1.2}
    assert _get_pruned_trial_score(stopped, study) == (-50, 1.2)  # as when Optuna's tell gave it 1.2


def test_a_switched_off_knob_is_not_suggested_and_old_trials_still_read() -> None:
    from tuner.spaces import space_from

    space = space_from({"clip_norm": {"low": 0.5, "high": 50.0, "log": True, "nullable": True}}, "m", {}, "<test>")
    study = optuna.create_study()
    study.enqueue_trial({"use_clip_norm": False})
    study.enqueue_trial({"use_clip_norm": True, "clip_norm": 2.0})
    study.enqueue_trial({"use_clip_norm": False, "clip_norm": 0.337})  # as a study written before held it
    configs, params = [], []
    for _ in range(3):
        trial = study.ask()
        configs.append(space.suggest(trial).flat()["clip_norm"])
        params.append({k: v for k, v in trial.params.items() if "clip_norm" in k})
    assert configs == [None, 2.0, None]
    assert params[:2] == [{"use_clip_norm": False}, {"use_clip_norm": True, "clip_norm": 2.0}]


def test_the_experiment_description_reads_as_words_and_the_view_shows_trials_flat() -> None:
    from tuner.driver import mlflow_ui

    note = mlflow_ui.experiment_note("3", "st", "trial 4 exported, val loss 0.0545")
    assert note.startswith("tuner study st: trial 4 exported") and "<!--" not in note and "**" not in note
    assert f"]({mlflow_ui.runs_link('3')})" in note
    view = mlflow_ui.view_state()
    assert view["searchFilter"] == "tags.phase = 'search'"  # one row per trial: its own run
    assert view["orderByKey"] != "attributes.start_time"  # MLflow nests (folds) child runs only by start time
    assert "tags.`chosen`" in view["selectedColumns"] and "tags.`why_not_chosen`" in view["selectedColumns"]
    assert mlflow_ui.is_tuner_note("<!-- tuner -->**[Trials of study st") and not mlflow_ui.is_tuner_note("mine")


def test_tracker_marks_the_exported_trial_and_moves_the_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from tuner.driver import studyrecord
    from tuner.driver.evidence import Choice
    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    outcomes = [survived_outcome(0, 0.25), survived_outcome(1, 0.30), stopped_outcome(2)]
    study = told_study(outcomes)
    tracker = Tracker(uri, "s", {})
    for outcome in outcomes:
        tracker.on_trial_start(outcome.number, outcome.config, (5,))
        tracker.on_trial_complete(outcome)
    tracker.mark_export(study)
    tracker.close()

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("s")
    assert experiment is not None

    def runs() -> dict[str, Any]:
        found = client.search_runs([experiment.experiment_id])
        return {r.data.tags.get("trial", "launch"): r for r in found if r.data.tags.get("phase") in ("search", None)}

    first = runs()
    assert first["0"].data.tags["chosen"] == "true" and first["0"].info.run_name == "trial-0 survived, exported"
    note = first["0"].data.tags["mlflow.note.content"]
    assert note.startswith("Trial 0 is exported (best_config.yaml): validation loss 0.25 on 1 seed(s)")
    assert note.endswith("Survived 200 steps on its 1 seed; validation loss 0.25 (at initialisation 2).")
    assert "chosen" not in first["1"].data.tags and first["1"].data.tags["why_not_chosen"]
    assert first["2"].data.tags["why_not_chosen"].startswith("stopped")
    latest = max((r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("tuner.role")),
                 key=lambda r: r.info.start_time)
    assert latest.data.tags["mlflow.note.content"].startswith("Trial 0 is exported")
    assert client.get_experiment(experiment.experiment_id).tags["mlflow.note.content"].startswith(
        "tuner study s: trial 0 exported, val loss 0.25")

    studyrecord.save_choice(study, Choice(1, True, "a verification chose it"))  # a later launch chose trial 1
    again = Tracker(uri, "s", {})
    again.mark_export(study)
    again.close()
    second = runs()
    assert "chosen" not in second["0"].data.tags and second["0"].info.run_name == "trial-0 survived"
    assert second["0"].data.tags["mlflow.note.content"].startswith("Survived 200 steps")
    assert second["1"].data.tags["chosen"] == "true" and "why_not_chosen" not in second["1"].data.tags


def test_the_dashboard_study_note_names_the_export_and_keeps_the_users_note() -> None:
    from optuna_dashboard import get_note, save_note

    from tuner.driver import dashboard, studyrecord
    from tuner.driver.evidence import Choice
    from tuner.driver.trialrecord import study_records

    study = told_study([survived_outcome(0, 0.25), survived_outcome(1, 0.30, seeds=(5, 6, 7, 8)), stopped_outcome(2)])
    studyrecord.save_choice(study, Choice(1, True, "a verification chose it"))
    save_note(study, "my own words")
    assert dashboard.save_study_note(study, study_records(study))
    note = get_note(study)
    assert note.startswith("### Exported by tuner: trial 1 (best_config.yaml)")
    assert "Optuna's *Best Trial* (trial 0, lowest val_loss) is not the export" in note
    assert "3 trials finished: 2 survived, 0 diverged, 1 stopped by the pruner, 0 failed" in note
    assert note.endswith("---\n\nmy own words")
    line = study.user_attrs[dashboard.EXPORTED_ATTR]  # the study page's user-attrs table, beside "Best Trial"
    assert line.startswith("trial 1: survived") and "The Best Trial card (trial 0, lowest val_loss) is not" in line
    dashboard.save_study_note(study, study_records(study))  # a later launch: tuner's part replaced, the user's kept
    assert get_note(study).count("Exported by tuner") == 1 and get_note(study).endswith("my own words")


def _chromium() -> str | None:
    return bench_module("ui_screenshots").find_chromium()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_both_uis_show_the_study_as_a_person_sees_it(tmp_path: Path) -> None:
    """One tiny launch, seen in headless Chromium from a fresh profile through the URLs it printed:
    every check of bench/ui_screenshots.py passes (the trials table, one row per trial, the
    exported run marked, a diverged run's step, optuna-dashboard's exported trial)."""
    import subprocess

    if _chromium() is None:
        pytest.skip("no chromium binary installed (apt-get install chromium): the browser check needs one")
    pytest.importorskip("playwright", reason="playwright (the dev extra) drives the browser")
    out = tmp_path / "shots"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "ui_screenshots.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "FAIL" not in done.stdout and len(list(out.glob("*.png"))) >= 6
