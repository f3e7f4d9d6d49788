"""``python -m tuner launch`` end to end in a subprocess: real Ray, TensorFlow, Optuna and MLflow."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import FINISHED, FIXTURES, NO_VERIFY, expected_status, run_tuner
from tuner.driver.trialrecord import read

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]


def launch(
    tmp_path: Path, *extra: str, trials: int = 8, steps: int = 300, codes: tuple[int, ...] = (0,)
) -> tuple[Path, dict]:
    out = tmp_path / "best.yaml"
    args = [
        "launch", "--trials", str(trials), "--steps", str(steps), "--seeds", "2", "--study", "s1",
        "--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
        "--out", str(out), "--num-cpus", "2", *extra,
    ]
    result = run_tuner(args, cwd=tmp_path)
    assert result.returncode in codes, result.stdout[-3000:] + result.stderr[-3000:]
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
    children = {int(r.data.tags["trial"]): r for r in runs if r.data.tags.get("phase") == "search"}
    assert sorted(children) == sorted(t.number for t in finished)
    for t in finished:
        run = children[t.number]
        assert run.data.tags["status"] == expected_status(t)
        assert run.info.status == ("FAILED" if t.state == optuna.trial.TrialState.FAIL else "FINISHED")
        assert "mlflow.parentRunId" in run.data.tags
        record = read(t)
        first_seed = record.seeds[0].seed
        assert run.data.tags["seeds"].split(",")[0] == str(first_seed)  # s0 is the run's first seed
        assert "s0/steps_survived" in run.data.metrics and "min_steps_survived" in run.data.metrics
        if record.state.value == "diverged":
            assert int(run.data.tags["divergence_step"]) == record.divergence_step
            assert run.data.tags["diverged_on"] in ("loss", "gradient", "weight", "validation")
    return finished


def test_launch_iterated_mlp_races_verifies_and_its_export_holds_on_fresh_seeds(tmp_path: Path) -> None:
    """8 trials x 300 steps: the exported config survives >= 15 of 16 fresh seeds at 3x its steps."""
    out, doc = launch(tmp_path, "--model", "iterated_mlp")
    assert list(doc) == ["config", "stability", "study"]
    assert list(doc["config"])[:4] == ["learning_rate", "clip_norm", "l2_weight", "max_iter"]
    stability = doc["stability"]
    assert list(stability)[:9] == ["steps", "seeds", "steps_survived", "diverged", "val_loss", "learned",
                                   "init_val_loss", "rule", "verified"]
    assert list(doc["study"]) == ["name", "model", "storage", "trial", "mlflow_run_id"]
    assert stability["steps"] == 300 and len(stability["seeds"]) == 8  # raced 2 -> 4 -> 8
    verified = stability["verified"]
    assert (verified["survived"], verified["runs"], verified["steps"], verified["met"]) == (16, 16, 600, True)
    assert not set(verified["seeds"]) & set(stability["seeds"])
    assert stability["margin"]["lr_factor"] >= 1.0 and "lowest validation loss" in stability["rule"]
    finished = check_stores(tmp_path, 8)
    study = optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}")
    assert len({s for t in finished for s in read(t).seed_numbers}) > 4  # each trial its own seeds
    assert study.user_attrs["tuner.compute"]["verify"]["runs"] >= 16
    phases = phase_runs(tmp_path)
    assert {"race", "verify", "margin"} <= set(phases) and phases["verify"] >= 1
    # retrained outside the launch, on 16 seeds it never saw, at 3x its steps
    result = run_tuner(["verify", str(out), "--seeds", "16", "--steps", "900", "--num-cpus", "2"], cwd=tmp_path)
    survived = re.search(r"survived (\d+)/16", result.stdout)
    assert survived and int(survived.group(1)) >= 15, result.stdout[-3000:] + result.stderr[-3000:]


def trial_runs(tmp_path: Path) -> dict[int, str]:
    """Trial number -> the id of the trial's own MLflow run (phase ``search``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    return {int(r.data.tags["trial"]): r.info.run_id for r in runs if r.data.tags.get("phase") == "search"}


def phase_runs(tmp_path: Path) -> dict[str, int]:
    """MLflow runs per phase tag of the study's trials."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    return dict(Counter(r.data.tags["phase"] for r in runs if "phase" in r.data.tags))


def test_launch_continues_a_study_with_more_trials(tmp_path: Path) -> None:
    launch(tmp_path, "--model", "iterated_mlp", *NO_VERIFY, trials=3, steps=100, codes=FINISHED)
    check_stores(tmp_path, 3)
    # the same study and storage again, asking for 5: two more trials run
    _, doc = launch(tmp_path, "--model", "iterated_mlp", *NO_VERIFY, trials=5, steps=100, codes=FINISHED)
    finished = check_stores(tmp_path, 5)
    assert doc["study"]["mlflow_run_id"] == trial_runs(tmp_path)[doc["study"]["trial"]]  # this launch's or the first's
    # resumed inside TPE's random start-up: the seeded sampler must not replay trials 0 and 1
    configs = [tuple(sorted(t.params.items())) for t in finished]
    assert len(set(configs)) == 5
    assert optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}").metric_names == ["val_loss"]
    # the same command once more: nothing to train, the best shown as YAML, no empty MLflow launch run
    args = ["launch", "--model", "iterated_mlp", *NO_VERIFY, "--trials", "5", "--steps", "100", "--study", "s1",
            "--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
            "--out", str(tmp_path / "best.yaml")]
    again = run_tuner(args, cwd=tmp_path, timeout=120)
    assert again.returncode in FINISHED, again.stdout[-3000:] + again.stderr[-3000:]
    text = " ".join(again.stdout.split())
    assert "already has 5 finished trial(s)" in text and "--trials 10 runs 5 more" in text
    assert "config: learning_rate: " in text and "None" not in text
    # it names the exported trial and how to open it, its MLflow run found read only (issue 28)
    assert f"best config: trial {doc['study']['trial']}, survived 2 seeds; not verified" in text
    assert f"/runs/{doc['study']['mlflow_run_id']}?workflowType=machine_learning" in text
    assert f"trials?numbers={doc['study']['trial']}" in text
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["study"] == doc["study"]  # its run found read only
    assert "INFO" not in again.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    assert sum(r.data.tags.get("tuner.role") == "study" for r in runs) == 2  # the two launches that trained
    assert client.get_experiment_by_name("s1").artifact_location == (tmp_path / "mlartifacts").resolve().as_uri()


def test_launch_first_seed_pruner_stops_trials_behind_before_their_second_seed(tmp_path: Path) -> None:
    """The default ``--pruner first-seed`` in a real launch: of two learning rates, 1e-5 barely learns
    in 120 steps, so once three trials at 3e-3 survived, a 1e-5 trial ends on its first seed
    (STOPPED, told PRUNED, recorded and tagged ``stopped``): its second seed never runs."""
    space = tmp_path / "space.yaml"
    space.write_text("model: iterated_mlp\nparams:\n  learning_rate: {choices: [1.0e-5, 3.0e-3]}\n  max_iter: 4\n"
                     "  epsilon: 1.0e-6\n  input_clip: 10.0\n  clip_norm: 1.0\n")  # guarded: no trial diverges
    launch(tmp_path, "--model", "iterated_mlp", "--space", str(space), "--sampler", "random", "--seed", "0",
           "--no-margin", *NO_VERIFY, trials=8, steps=120, codes=FINISHED)
    finished = check_stores(tmp_path, 8)
    stopped = [t for t in finished if read(t).state.value == "stopped"]
    assert [t for t in stopped if t.params["learning_rate"] == 1e-5], [
        (t.number, t.params, read(t).state) for t in finished]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = trial_runs(tmp_path)
    for t in stopped:
        record = read(t)
        assert t.state == optuna.trial.TrialState.PRUNED
        assert len(record.seeds) == 1 and record.divergence_step is None and "first seed" in record.reason
        metrics = client.get_run(runs[t.number]).data.metrics
        assert "s0/steps_survived" in metrics and not [k for k in metrics if k.startswith("s1/")]
    study = optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}")
    seeds_run = sum(len(read(t).seeds) for t in finished)
    assert study.user_attrs["tuner.compute"]["search"]["runs"] == seeds_run < 2 * 8


def test_launch_counting_cnn_end_to_end_with_the_optimizer_and_clip_mode_searched(tmp_path: Path) -> None:
    space = FIXTURES / "spaces" / "cnn_optimizers.yaml"
    _, doc = launch(tmp_path, "--model", "counting_cnn", "--space", str(space), *NO_VERIFY, codes=FINISHED)
    assert list(doc["config"])[:3] == ["learning_rate", "clip_norm", "l2_weight"]
    assert "max_iter" not in doc["config"] and "loss" in doc["config"]
    assert doc["config"]["optimizer"] in ("rmsprop", "momentum", "sgd")
    assert doc["config"]["clip_mode"] in ("global", "per_tensor", "value")
    finished = check_stores(tmp_path, 8)
    tried = {read(t).config["optimizer"] for t in finished}
    assert tried <= {"rmsprop", "momentum", "sgd"} and len(tried) >= 2  # TPE's random start-up tries several


def test_launch_learning_rate_one_diverges_every_trial_and_is_no_success(tmp_path: Path) -> None:
    _, doc = launch(tmp_path, "--space", str(FIXTURES / "spaces" / "lr_one.yaml"), trials=4, codes=(3,))
    finished = check_stores(tmp_path, 4)
    assert all(t.state == optuna.trial.TrialState.PRUNED for t in finished)
    assert all(read(t).divergence_step <= 300 for t in finished)
    assert doc["stability"]["diverged"] is True
    assert doc["config"]["learning_rate"] == 1.0
    assert "No trial survived" in doc["note"]
