"""Stability telemetry: spikes, clipping, per-weight gradient norms, watched values, MLflow logging."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

from planted import Planted

from tuner.records import RunSpec, RunStatus, TrainConfig
from tuner.worker.telemetry import SPIKE_WARMUP, Telemetry


def test_telemetry_spike_is_loss_above_k_times_running_median() -> None:
    t = Telemetry(clip_norm=None)
    for step in range(1, SPIKE_WARMUP + 1):
        t.add(step, 1.0, 0.5)
    t.add(SPIKE_WARMUP + 1, 2.9, 0.5)  # below 3 x median 1.0: not a spike
    t.add(SPIKE_WARMUP + 2, 3.5, 0.5)
    t.add(SPIKE_WARMUP + 3, 1.0, 0.5)
    assert t.spike_steps == [SPIKE_WARMUP + 2]
    assert t.summary()["loss_spikes"] == 1.0


def test_telemetry_no_spike_called_during_warmup() -> None:
    t = Telemetry(clip_norm=None)
    for step, loss in enumerate([1.0, 100.0, 1.0, 1000.0], start=1):
        t.add(step, loss, 1.0)
    assert t.spike_steps == []


def test_telemetry_clip_fraction_and_report_metrics() -> None:
    t = Telemetry(clip_norm=1.0)
    for step, (loss, gnorm) in enumerate([(4.0, 0.5), (2.0, 2.0), (1.0, 3.0), (1.0, 0.1)], start=1):
        t.add(step, loss, gnorm)
    metrics = t.report(4, {"grad_norm/w": 0.25})
    assert metrics == {"loss_mean": 2.0, "clipped": 0.0, "clip_fraction": 0.5, "loss_spikes": 0.0, "grad_norm/w": 0.25}
    summary = t.summary()
    assert summary["grad_norm_max"] == 3.0 and summary["clip_fraction"] == 0.5
    assert summary["grad_norm_p50"] == pytest.approx(1.25)
    t.add(5, 0.5, 0.1)
    t.add(6, 1.5, 0.1)
    assert t.report(6, {})["loss_mean"] == 1.0  # the steps since the last report only


@pytest.mark.tf
def test_train_run_reports_per_weight_norms_and_watched_values_of_iterated_mlp() -> None:
    from tuner.models.iterated_mlp import IteratedMLP
    from tuner.worker.train import train_run

    model = IteratedMLP()
    knobs = {k: v.default for k, v in model.knobs.items()} | {"max_iter": 3, "epsilon": 1e-3}
    spec = RunSpec(0, 0, "iterated_mlp", TrainConfig(1e-3, clip_norm=0.5, knobs=knobs), 20, 10)
    records = list(train_run(model, model.data(knobs), spec))
    progress = records[0].metrics
    assert {f"iter_{i}/input_absmax" for i in range(3)} <= set(progress)
    per_weight = {k: v for k, v in progress.items() if k.startswith("grad_norm/")}
    assert "grad_norm/layer2/kernel" in per_weight and "grad_norm/out/bias" in per_weight
    # the per-weight norms make up the global norm fetched in the same run
    assert math.sqrt(sum(v * v for v in per_weight.values())) == pytest.approx(records[0].grad_norm, rel=1e-4)
    assert {"clipped", "clip_fraction", "loss_spikes"} <= set(progress)
    final = records[-1]
    assert final.status is RunStatus.SURVIVED
    assert {"grad_norm_max", "grad_norm_p99", "clip_fraction", "loss_spikes"} <= set(final.metrics)


@pytest.mark.tf
def test_tracker_logs_telemetry_forensics_tags_and_divergence_json(tmp_path: Path, monkeypatch) -> None:
    """A real diverging run, judged and logged to a real MLflow store (no Ray)."""
    from mlflow.tracking import MlflowClient

    from tuner.driver.outcome import judge
    from tuner.driver.tracking import Tracker
    from tuner.worker.train import train_run

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    model = Planted()
    knobs = {k: v.default for k, v in model.knobs.items()} | {"fault": "log", "bad_step": 33}
    config = TrainConfig(1e-2, clip_norm=0.1, knobs=knobs)
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "tele", {"model": "planted"})
    tracker.on_trial_start(0, config, (0,))
    records = list(train_run(model, model.data(knobs), RunSpec(0, 0, "planted", config, 60, 10)))
    for record in records:
        tracker.on_trial_result(record)
    tracker.on_trial_complete(judge(0, config, {0: records[-1]}))
    tracker.close()

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    run = client.get_run(tracker.runs()[0])
    tags = run.data.tags
    assert (tags["first_nonfinite_op"], tags["first_nonfinite_kind"]) == ("iter_1/hazard/Log", "forward")
    assert (tags["first_nonfinite_iteration"], tags["divergence_cause"]) == ("1", "model")
    assert tags["divergence_step"] == "33"
    history = client.get_metric_history(run.info.run_id, "s0/grad_norm/w")
    assert [m.step for m in history] == [10, 20, 30]
    assert {"s0/clip_fraction", "s0/clipped", "s0/loss_spikes", "s0/grad_norm_p90"} <= set(run.data.metrics)
    path = client.download_artifacts(run.info.run_id, "divergence.json", str(tmp_path))
    doc = json.loads(Path(path).read_text())
    assert (doc["step"], doc["op"], doc["seed"], doc["diverged_on"]) == (33, "iter_1/hazard/Log", 0, "loss")
    assert [p["step"] for p in doc["report_points"]] == [10, 20, 30]
