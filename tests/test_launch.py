"""``python -m tuner launch`` end to end in a subprocess: real Ray, TensorFlow, Optuna and MLflow."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import FIXTURES, run_tuner

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]

STATUS_OF = {
    optuna.trial.TrialState.COMPLETE: "survived",
    optuna.trial.TrialState.PRUNED: "diverged",
    optuna.trial.TrialState.FAIL: "failed",
}


def launch(tmp_path: Path, *extra: str, trials: int = 8, steps: int = 300) -> tuple[Path, dict]:
    out = tmp_path / "best.yaml"
    args = [
        "launch", "--trials", str(trials), "--steps", str(steps), "--seeds", "2", "--study", "s1",
        "--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
        "--out", str(out), "--num-cpus", "2", *extra,
    ]
    result = run_tuner(args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, yaml.safe_load(out.read_text())


def check_stores(tmp_path: Path, trials: int) -> list[optuna.trial.FrozenTrial]:
    """Optuna holds ``trials`` finished trials, none RUNNING; one MLflow child run each, statuses matching."""
    from mlflow.tracking import MlflowClient

    study = optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}")
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == trials
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    experiment = client.get_experiment_by_name("s1")
    runs = client.search_runs([experiment.experiment_id])
    children = {int(r.data.tags["trial"]): r for r in runs if "trial" in r.data.tags}
    assert sorted(children) == sorted(t.number for t in finished)
    for t in finished:
        run = children[t.number]
        assert run.data.tags["status"] == STATUS_OF[t.state]
        assert run.info.status == ("FAILED" if t.state == optuna.trial.TrialState.FAIL else "FINISHED")
        assert "mlflow.parentRunId" in run.data.tags
        assert "seed0/steps_survived" in run.data.metrics and "min_steps_survived" in run.data.metrics
        if t.state == optuna.trial.TrialState.PRUNED:
            assert int(run.data.tags["divergence_step"]) == t.user_attrs["divergence_step"]
            assert run.data.tags["diverged_on"] in ("loss", "gradient", "weight", "validation")
    return finished


def test_launch_iterated_mlp_end_to_end_then_continues(tmp_path: Path) -> None:
    _, doc = launch(tmp_path, "--model", "iterated_mlp")
    assert list(doc) == ["config", "stability", "study"] or list(doc) == ["config", "stability", "study", "note"]
    assert list(doc["config"])[:4] == ["learning_rate", "clip_norm", "l2_weight", "max_iter"]
    assert list(doc["stability"])[:5] == ["steps", "seeds", "steps_survived", "diverged", "val_loss"]
    assert list(doc["study"]) == ["name", "storage", "trial", "mlflow_run_id"]
    assert doc["stability"]["steps"] == 300 and len(doc["stability"]["steps_survived"]) == 2
    check_stores(tmp_path, 8)
    # the same study and storage again, asking for 10: two more trials run
    launch(tmp_path, "--model", "iterated_mlp", trials=10)
    check_stores(tmp_path, 10)


def test_launch_counting_cnn_end_to_end(tmp_path: Path) -> None:
    _, doc = launch(tmp_path, "--model", "counting_cnn")
    assert list(doc["config"])[:3] == ["learning_rate", "clip_norm", "l2_weight"]
    assert "max_iter" not in doc["config"] and "loss" in doc["config"]
    check_stores(tmp_path, 8)


def test_launch_learning_rate_one_diverges_every_trial(tmp_path: Path) -> None:
    _, doc = launch(tmp_path, "--space", str(FIXTURES / "spaces" / "lr_one.yaml"), trials=4)
    finished = check_stores(tmp_path, 4)
    assert all(t.state == optuna.trial.TrialState.PRUNED for t in finished)
    assert all(t.user_attrs["divergence_step"] <= 300 for t in finished)
    assert doc["stability"]["diverged"] is True
    assert doc["config"]["learning_rate"] == 1.0
    assert "No trial survived" in doc["note"]
