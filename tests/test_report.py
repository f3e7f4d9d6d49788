"""Study view: survival curves, stability map, ``tuner report``, and a launch's plots and MLflow records."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import optuna
import pytest

from tests.conftest import FIXTURES, PLANTED, run_tuner
from tuner.errors import ConfigError
from tuner.plots import TrialRow, kaplan_meier, other_knob, write_plots
from tuner.report import run_report, study_rows

PNG = b"\x89PNG\r\n\x1a\n"


def row(number: int, lr: float, survived: tuple[int, ...], status: str = "survived", **config) -> TrialRow:
    divergence = min(survived) + 1 if status == "diverged" else None
    return TrialRow(number, status, {"learning_rate": lr, **config}, survived, 100, divergence,
                    "loss" if divergence else None, 0.1 if status == "survived" else None)


def test_kaplan_meier_counts_cancelled_siblings_as_censored() -> None:
    # seed runs: diverged at 11 and 31, one cancelled at 20 (censored), one reached 100
    steps, alive = kaplan_meier([(10, True), (20, False), (30, True), (100, False)], budget=100)
    assert list(steps) == [0, 11, 31, 100]
    assert np.allclose(alive, [1.0, 0.75, 0.375, 0.375])  # at 31 two runs are at risk, one dies


def test_trial_row_seed_runs_mark_only_the_diverged_seed() -> None:
    r = TrialRow(0, "diverged", {"learning_rate": 1.0}, (40, 55), 100, divergence_step=41, diverged_on="loss")
    assert r.seed_runs() == [(40, True), (55, False)]


def test_other_knob_prefers_max_iter_then_the_most_telling_knob() -> None:
    rows = [row(i, 1e-3, (100,) if i % 2 else (10,), "survived" if i % 2 else "diverged",
                width=8 * (1 + i % 2), depth=3) for i in range(6)]
    assert other_knob(rows) == "width"  # depth never varies; width tracks survival exactly
    rows = [row(i, 1e-3, (i * 10,), "diverged", width=i, max_iter=4 + i % 2) for i in range(6)]
    assert other_knob(rows) == "max_iter"


def test_write_plots_writes_pngs_with_nulls_and_choices(tmp_path: Path) -> None:
    rows = [row(i, 10 ** -(2 + i / 3), (100, 100) if i % 3 else (30, 45), "survived" if i % 3 else "diverged",
                clip_norm=None if i % 2 else 0.5 * i) for i in range(9)]
    paths = write_plots(rows, tmp_path / "plots", prefix="s_")
    assert [p.name for p in paths] == ["s_stability_map.png", "s_survival.png"]
    assert all(p.read_bytes().startswith(PNG) for p in paths)


def test_report_unknown_study_is_a_clear_error(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    optuna.create_study(study_name="there", storage=storage)
    args = argparse.Namespace(study="missing", storage=storage, tracking_uri=None, out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"no such study .* studies there: \['there'\]"):
        run_report(args)
    args.storage = f"sqlite:///{tmp_path / 'nothing.db'}"
    with pytest.raises(ConfigError, match="no such database file"):
        run_report(args)
    assert not (tmp_path / "nothing.db").exists()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_launch_then_report_from_stores_alone(tmp_path: Path) -> None:
    """A real launch of the planted log fault; MLflow carries telemetry, forensics and plots; report reads it back."""
    from mlflow.tracking import MlflowClient

    storage, tracking = f"sqlite:///{tmp_path / 't.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    out = tmp_path / "out" / "best.yaml"
    out.parent.mkdir()
    result = run_tuner(
        ["launch", "--model", PLANTED, "--space", str(FIXTURES / "spaces" / "planted_log.yaml"),
         "--trials", "4", "--steps", "60", "--seeds", "2", "--report-every", "10", "--num-cpus", "2",
         "--sampler", "random", "--seed", "3", "--study", "s", "--storage", storage, "--tracking-uri", tracking,
         "--out", str(out)], cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out.parent / "s_stability_map.png").read_bytes().startswith(PNG)
    assert (out.parent / "s_survival.png").read_bytes().startswith(PNG)

    rows = study_rows(optuna.load_study(study_name="s", storage=storage))
    statuses = {r.number: r.status for r in rows}
    assert sorted(set(statuses.values())) == ["diverged", "survived"]
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
    assert {"best.yaml", "s_stability_map.png", "s_survival.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}
    assert parent.data.metrics["diverged_fraction"] == pytest.approx(
        sum(s == "diverged" for s in statuses.values()) / 4)
    for run in (r for r in runs if "trial" in r.data.tags):
        tags, metrics = run.data.tags, run.data.metrics
        telemetry = ("grad_norm/w", "clip_fraction", "clipped", "loss_spikes", "grad_norm_p99", "grad_norm_max")
        if statuses[int(tags["trial"])] == "survived":
            assert {f"seed{s}/{m}" for s in (0, 1) for m in telemetry} <= set(metrics)
            continue
        assert tags["divergence_step"] == "40"
        assert (tags["first_nonfinite_op"], tags["first_nonfinite_kind"]) == ("iter_1/hazard/Log", "forward")
        doc = json.loads(Path(client.download_artifacts(run.info.run_id, "divergence.json", str(tmp_path)))
                         .read_text())
        assert doc["step"] == 40 and [p["step"] for p in doc["report_points"]] == [10, 20, 30]
        assert {f"seed{doc['seed']}/{m}" for m in telemetry} <= set(metrics)  # the diverged seed's

    report_dir = tmp_path / "report"
    result = run_tuner(["report", "--study", "s", "--storage", storage, "--tracking-uri", tracking,
                        "--out-dir", str(report_dir)], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step 40: loss; iter_1/hazard/Log (forward, iteration 1)" in result.stdout
    diverged = sum(s == "diverged" for s in statuses.values())
    assert f"{diverged} of 4 finished trials diverged" in result.stdout
    assert "60,60 / 60" in result.stdout  # a survivor's seeds
    assert re.search(r"diverged\s*\S\s*(39,\d+|\d+,39) / 60", result.stdout)  # the diverged seed survived 39
    assert sorted(p.name for p in report_dir.iterdir()) == ["s_stability_map.png", "s_survival.png"]
