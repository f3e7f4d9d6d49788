"""What a person sees of a study in the MLflow UI and optuna-dashboard.

See tuner.driver.mlflow_ui and bench/ui_screenshots.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    return TrialOutcome(number, TrainConfig(3e-3), TrialState.PRUNED, (first, sibling))


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
    tracker.on_trial_complete(TrialOutcome(0, TrainConfig(1e-3), TrialState.COMPLETE, (survived,), value=0.25))
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


def _chromium() -> str | None:
    return bench_module("ui_screenshots").find_chromium()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_ui_screenshots_show_the_study_in_mlflow_and_optuna_dashboard(tmp_path: Path) -> None:
    """A tiny launch seen in headless Chromium: every check of bench/ui_screenshots.py passes."""
    import subprocess

    if _chromium() is None:
        pytest.skip("no chromium binary installed (apt-get install chromium): the browser check needs one")
    pytest.importorskip("playwright", reason="playwright (the dev extra) drives the browser")
    out = tmp_path / "shots"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "ui_screenshots.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert len(list(out.glob("*.png"))) >= 6
