"""Study view: survival curves, stability map, ``tuner report``, and a launch's plots and MLflow records."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
import yaml
from matplotlib.figure import Figure
from rich.console import Console

from tests.conftest import FINISHED, FIXTURES, NO_VERIFY, PLANTED, run_tuner
from tuner.driver import studyrecord
from tuner.driver.counts import Counts
from tuner.driver.evidence import Choice, Margin, Verification
from tuner.driver.plots import kaplan_meier, other_knob, seed_runs, stability_map, write_plots
from tuner.driver.report import margin_line, run_report, study_rows
from tuner.driver.trialrecord import SeedResult, SeedStatus, TrialRecord, varying
from tuner.driver.views import trials_table
from tuner.errors import ConfigError
from tuner.records import TrialState

PNG = b"\x89PNG\r\n\x1a\n"


def row(number: int, lr: float, survived: tuple[int, ...], status: str = "survived", **config) -> TrialRecord:
    """A trial: survivors reach 100 steps; a diverged trial's weakest seed diverged, the others were cancelled."""
    seeds = []
    for i, steps in enumerate(survived):
        if status == "survived":
            seeds.append(SeedResult(i, SeedStatus.SURVIVED, steps, steps))
        elif i == survived.index(min(survived)):
            seeds.append(SeedResult(i, SeedStatus.DIVERGED, steps + 1, steps, diverged_on="loss"))
        else:
            seeds.append(SeedResult(i, SeedStatus.CANCELLED, steps, steps))
    return TrialRecord(number, TrialState(status), {"learning_rate": lr, **config}, 100, tuple(seeds),
                       value=0.1 if status == "survived" else None)


def test_kaplan_meier_counts_cancelled_siblings_as_censored() -> None:
    # seed runs: diverged at 11 and 31, one cancelled at 20 (censored), one reached 100
    steps, alive = kaplan_meier([(10, True), (20, False), (30, True), (100, False)], budget=100)
    assert list(steps) == [0, 11, 31, 100]
    assert np.allclose(alive, [1.0, 0.75, 0.375, 0.375])  # at 31 two runs are at risk, one dies


def test_seed_runs_mark_only_the_diverged_seed() -> None:
    assert seed_runs(row(0, 1.0, (40, 55), "diverged")) == [(40, True), (55, False)]


def test_other_knob_prefers_max_iter_then_the_most_telling_knob() -> None:
    rows = [row(i, 1e-3, (100,) if i % 2 else (10,), "survived" if i % 2 else "diverged",
                width=8 * (1 + i % 2), depth=3) for i in range(6)]
    assert other_knob(rows) == "width"  # depth never varies; width tracks survival exactly
    rows = [row(i, 1e-3, (i * 10,), "diverged", width=i, max_iter=4 + i % 2) for i in range(6)]
    assert other_knob(rows) == "max_iter"


def test_survival_bands_that_never_diverge_stay_distinguishable() -> None:
    """Two learning-rate bands that never diverge both sit at 1.0: each band's line has its own
    style and width, so the one drawn later does not hide the other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tuner.driver.plots import survival_curves

    rows = [row(i, 10 ** -(2 + i / 3), (30, 45) if i < 3 else (100, 100), "diverged" if i < 3 else "survived")
            for i in range(9)]
    fig, ax = plt.subplots()
    try:
        survival_curves(ax, rows)
        bands = [line for line in ax.get_lines() if str(line.get_label()).startswith("lr")]
        flat = [b for b in bands if set(b.get_ydata()) == {1.0}]
        assert len(bands) == 3 and len(flat) == 2
        assert len({(b.get_linestyle(), b.get_linewidth()) for b in flat}) == 2
        assert flat[0].get_linewidth() > flat[1].get_linewidth()  # the wider one drawn first shows under
    finally:
        plt.close(fig)


def test_plots_draw_stopped_trials_apart_and_count_their_seeds_as_far_as_they_ran() -> None:
    """A trial the pruner stopped (``--pruner first-seed``: one seed that survived its budget but was
    behind, or one seed stopped at step 30) is neither survived nor diverged on the map, and its seeds
    are censored where they stopped on the survival curve, not dropped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tuner.driver.plots import survival_curves

    rows = [row(0, 1e-3, (100, 100)), row(1, 2e-3, (100, 100)), row(2, 1e-2, (40, 55), "diverged"),
            TrialRecord(3, TrialState.STOPPED, {"learning_rate": 1e-4}, 100,
                        (SeedResult(0, SeedStatus.SURVIVED, 100, 100),)),
            TrialRecord(4, TrialState.STOPPED, {"learning_rate": 1e-5}, 100,
                        (SeedResult(0, SeedStatus.CANCELLED, 30, 30),))]
    fig, (left, right) = plt.subplots(1, 2)
    try:
        stability_map(left, rows)
        legend = {t.get_text() for t in left.get_legend().get_texts()}
        assert {"survived", "diverged", "stopped by the pruner"} <= legend
        survival_curves(right, rows)
        labels = {str(line.get_label()) for line in right.get_lines()}
        assert "all (8 seed runs)" in labels  # 2 + 2 + 2 + the two stopped trials' one seed each
        assert "cancelled seed (2, censored)" in labels  # trial 2's sibling and trial 4's stopped seed
    finally:
        plt.close(fig)


def test_write_plots_writes_pngs_with_nulls_and_choices(tmp_path: Path) -> None:
    rows = [row(i, 10 ** -(2 + i / 3), (100, 100) if i % 3 else (30, 45), "survived" if i % 3 else "diverged",
                clip_norm=None if i % 2 else 0.5 * i) for i in range(9)]
    paths = write_plots(rows, tmp_path / "plots", study="s")
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


RULE = "lowest validation loss among the configs whose verified 95% lower bound reached 0.8"


def add_trial(study: optuna.Study, number: int, lr: float, status: str = "survived", raced: int = 0,
              learned: bool | None = True) -> None:
    """A finished trial with the user attrs ``tuner.driver.search`` records (2 search seeds, ``raced`` race seeds)."""
    phases = ["search"] * 2 + ["race"] * raced
    survived = [40] + [100] * (len(phases) - 1) if status == "diverged" else [100] * len(phases)
    attrs: dict[str, Any] = {
        "config": {"learning_rate": lr, "clip_norm": 1.0}, "status": status, "steps": 100,
        "steps_survived": survived, "seeds": list(range(10 * number, 10 * number + len(phases))),
        "phases": phases, "val_loss": 0.5 + number / 10 if status == "survived" else None,
        "learned": learned if status == "survived" else None, "init_val_loss": 2.31,
        "divergence_step": 41 if status == "diverged" else None,
        "diverged_on": "loss" if status == "diverged" else None, "mlflow_run_id": None,
    }
    state = optuna.trial.TrialState.COMPLETE if status == "survived" else optuna.trial.TrialState.PRUNED
    study.add_trial(optuna.trial.create_trial(
        state=state, value=attrs["val_loss"], user_attrs=attrs))
    assert study.trials[-1].number == number


def verification(survived: int, runs: int = 16) -> Verification:
    return Verification(seeds=tuple(range(2**30, 2**30 + runs)), steps=100, survived=survived, runs=runs,
                        min_survival=0.8, val_loss=0.5, init_val_loss=2.31)


def verified_study(storage: str) -> optuna.Study:
    """Trial 0 chosen (16/16, margin 3x), 1 verified 9/16, 2 survived without learning, 3 diverged."""
    study = optuna.create_study(study_name="v", storage=storage)
    add_trial(study, 0, 1e-3, raced=6)
    add_trial(study, 1, 3e-3, raced=6)
    add_trial(study, 2, 1e-5, learned=False)
    add_trial(study, 3, 1e-1, status="diverged")
    studyrecord.save_verification(study, 0, verification(16))
    studyrecord.save_verification(study, 1, verification(9))
    studyrecord.save_choice(study, Choice(0, True, RULE))
    studyrecord.save_margin(study, 0, Margin(
        lr_factor=3.0, steps=100, seeds=16, tried={1.5: "survived 16/16", 2.0: "survived 16/16",
                                                   3.0: "survived 16/16", 5.0: "diverged at step 30 (seed 7)"},
        losses={1.0: 0.5, 1.5: 0.55, 2.0: 0.6, 3.0: 0.7, 5.0: None}, init_val_loss=2.31,
    ))
    return study


def table_lines(rows: list[TrialRecord], width: int = 250) -> dict[int, str]:
    """Trial number -> its row of the printed trials table, its cells' lines joined by spaces."""
    console = Console(record=True, width=width)
    console.print(trials_table(rows, varying(rows), {}))
    return table_rows(console.export_text())


def table_rows(text: str) -> dict[int, str]:
    """Trial number -> its row of a printed trials table, its cells' lines joined by spaces."""
    assert "\u2026" not in text  # nothing cut to an ellipsis
    blocks: dict[int, list[str]] = {}
    number = None
    for line in text.splitlines():
        start = re.match(r"\W*(\d+)\s+\W", line)
        number = int(start.group(1)) if start else number
        if number is not None and line.startswith("\u2502"):
            blocks.setdefault(number, []).append(line)
    columns = {n: zip(*(line.split("\u2502") for line in b), strict=True) for n, b in blocks.items()}
    return {n: " | ".join(" ".join(" ".join(c).split()) for c in cols) for n, cols in columns.items()}


def test_report_table_shows_seeds_verification_and_did_not_learn(tmp_path: Path) -> None:
    rows = study_rows(verified_study(f"sqlite:///{tmp_path / 't.db'}"))
    for width in (250, 80):  # piped output: 80 columns, nothing cut
        lines = table_lines(rows, width)
        assert re.search(r"\| survived, val loss 0\.5 seeds 8 \(6 raced\): (100, ){7}100 / 100 \| "
                         r"16/16 \(>= 0\.81\) \* \| learning_rate=0\.001", lines[0])
        assert re.search(r"seeds 8 \(6 raced\).* \| 9/16 \(>= 0\.33\) \| learning_rate=0\.003", lines[1])
        assert "*" not in lines[1] and "verified 9/16 (lower bound 0.33): below the bar 0.8 |" in lines[1]
        assert ("survived, did not learn, val loss 0.7 seeds 2: 100, 100 / 100 did not learn: val loss 0.7 not "
                "below 2.31 at init |  | learning_rate=1e-05") in lines[2]
        assert "diverged seeds 2: 40x, 100c / 100 step 41: loss |  | learning_rate=0.1" in lines[3]
        assert "/16" not in lines[2] + lines[3]


def test_report_prints_the_rule_and_the_margin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    verified_study(storage)
    args = argparse.Namespace(study="v", storage=storage, tracking_uri=None, out_dir=str(tmp_path / "plots"))
    assert run_report(args) == 0
    out = capsys.readouterr().out
    assert ("4 trials finished: 3 survived, 1 diverged, 0 stopped by the pruner, 0 failed; diverged fraction 25% "
            "(1 of the 4 trials that survived or diverged)") in " ".join(out.split())
    assert f"trial 0, by the rule: {RULE}" in " ".join(out.split())
    # mean of min(loss, init) over lr x 1, 1.5, 2, 3, 5 (5x diverged: the init loss) minus the best loss
    assert ("trial 0 survives up to 3x its learning rate; LR sensitivity (Wortsman et al.) over lr x 1, 1.5, 2, 3, 5: "
            "0.432 (loss at init 2.31)") in " ".join(out.split())
    assert all(p.read_bytes().startswith(PNG) for p in (tmp_path / "plots").iterdir())


def test_report_without_a_choice_names_the_unverified_incumbent(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    study = optuna.create_study(study_name="v", storage=storage)
    add_trial(study, 0, 1e-3)
    rows = study_rows(study)
    assert (rows[0].raced, rows[0].verification, rows[0].chosen) == (0, None, True)
    assert run_report(argparse.Namespace(study="v", storage=storage, tracking_uri=None, out_dir=str(tmp_path))) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("exported (*): trial 0, by the rule: lowest validation loss among the COMPLETE trials that learned "
            "(not verified on fresh seeds)") in out
    assert "learning rate;" not in out and "lowest validation loss: trial" not in out


def test_margin_line_when_the_first_factor_already_diverged() -> None:
    tried = {f: "diverged at step 12 (seed 3)" for f in (5.0, 3.0, 2.0, 1.5)}
    margin = Margin(lr_factor=1.0, steps=100, seeds=16, tried=tried,
                    losses={1.0: 0.5, 5.0: None, 3.0: None, 2.0: None, 1.5: None}, init_val_loss=2.0)
    # 1x: 0.5, the other four factors diverged and count as the init loss: (0.5 + 4 * 2.0) / 5 - 0.5
    assert margin_line(4, margin) == ("trial 4 does not survive 1.5x its learning rate; LR sensitivity "
                                      "(Wortsman et al.) over lr x 1, 1.5, 2, 3, 5: 1.2 (loss at init 2)")
    assert margin_line(4, Margin(lr_factor=5.0, steps=100, seeds=16)) == "trial 4 survives up to 5x its learning rate"


def legend(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_stability_map_labels_verified_trials_and_stars_the_chosen(tmp_path: Path) -> None:
    rows = study_rows(verified_study(f"sqlite:///{tmp_path / 't.db'}"))
    ax = Figure().add_subplot()
    stability_map(ax, rows)
    assert sorted(t.get_text() for t in ax.texts) == ["16/16", "9/16"]
    assert legend(ax) == ["survived", "diverged", "exported (trial 0)"]
    ax = Figure().add_subplot()
    stability_map(ax, [row(i, 10.0 ** -i, (100,)) for i in range(1, 4)])
    assert [t.get_text() for t in ax.texts] == []
    assert legend(ax) == ["survived", "diverged"]


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
         "--out", str(out), "--pruner", "none", *NO_VERIFY], cwd=tmp_path,  # seeds side by side (see below)
    )
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    # piped (80 columns): each trial's line and the table name the op and show the searched knobs
    assert "iter_1/hazard/Log" in result.stdout and "\u2026" not in result.stdout
    assert re.search(r"learning_rate=0\.00\d+\s+clip_norm=0\.\d+\s+bad_step=", result.stdout)
    assert "INFO" not in result.stderr
    assert (out.parent / "s_stability_map.png").read_bytes().startswith(PNG)
    assert (out.parent / "s_survival.png").read_bytes().startswith(PNG)

    rows = study_rows(optuna.load_study(study_name="s", storage=storage))
    statuses = {r.number: r.state.value for r in rows}
    assert sorted(set(statuses.values())) == ["diverged", "survived"]
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
    assert {"best.yaml", "s_stability_map.png", "s_survival.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}
    own = {int(r.data.tags["trial"]): r.info.run_id for r in runs if r.data.tags.get("phase") == "search"}
    exported = yaml.safe_load(out.read_text())["study"]
    assert exported["mlflow_run_id"] == own[exported["trial"]]  # asked of the tracker once the search ended
    counts = Counts.of(rows)  # one definition: the launch run's metric, the launch's and report's lines
    assert parent.data.metrics["diverged_fraction"] == pytest.approx(counts.diverged_fraction)
    assert counts.judged == 4 and parent.data.metrics["trials_finished"] == 4
    said = " ".join(result.stdout.split())
    # the end of the launch names the exported trial, marks it in its table, and says how to open it
    number = exported["trial"]
    assert f"best config: trial {number}, survived 2 seeds; not verified on fresh seeds" in said
    assert [n for n, line in table_rows(result.stdout).items() if "| * |" in line] == [number]
    assert counts.line() in said
    experiment = client.get_experiment_by_name("s").experiment_id
    assert (f"then open http://127.0.0.1:5000/#/experiments/{experiment}/runs/{own[number]}"
            "?workflowType=machine_learning") in result.stdout
    assert f"mlflow ui --backend-store-uri {tracking}" in result.stdout
    assert f"optuna-dashboard {storage}" in result.stdout
    study_id = optuna.storages.get_storage(storage).get_study_id_from_name("s")
    assert f"then open http://127.0.0.1:8080/dashboard/studies/{study_id}/trials?numbers={number}" in result.stdout
    for run in (r for r in runs if "trial" in r.data.tags):
        tags, metrics = run.data.tags, run.data.metrics
        telemetry = ("grad_norm/w", "clip_fraction", "clipped", "loss_spikes", "grad_norm_p99", "grad_norm_max")
        seeds = tags["seeds"].split(",")  # the run's seed values, by position (s0, s1, ...)
        if statuses[int(tags["trial"])] == "survived":
            assert {f"s{i}/{m}" for i in range(len(seeds)) for m in telemetry} <= set(metrics)
            continue
        assert tags["divergence_step"] == "40"
        assert (tags["first_nonfinite_op"], tags["first_nonfinite_kind"]) == ("iter_1/hazard/Log", "forward")
        doc = json.loads(Path(client.download_artifacts(run.info.run_id, "divergence.json", str(tmp_path)))
                         .read_text())
        assert doc["step"] == 40 and [p["step"] for p in doc["report_points"]] == [10, 20, 30]
        assert {f"s{seeds.index(str(doc['seed']))}/{m}" for m in telemetry} <= set(metrics)  # the diverged seed's

    report_dir = tmp_path / "report"
    result = run_tuner(["report", "--study", "s", "--storage", storage, "--tracking-uri", tracking,
                        "--out-dir", str(report_dir)], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = table_rows(result.stdout)
    assert all("step 40: loss; iter_1/hazard/Log (forward, iteration 1)" in table[n]
               for n, s in statuses.items() if s == "diverged")
    assert counts.line() in " ".join(result.stdout.split())
    assert f"exported (*): trial {number}, by the rule: lowest validation loss" in result.stdout
    assert [n for n, line in table.items() if "| * |" in line] == [number]  # report, YAML, launch: one trial
    # both seeds meet the planted fault at step 40: the sibling passes it before it may be cancelled
    assert all(("seeds 2: 39x, 39x / 60" if s == "diverged" else "seeds 2: 60, 60 / 60") in table[n]
               for n, s in statuses.items())
    assert sorted(p.name for p in report_dir.iterdir()) == ["s_stability_map.png", "s_survival.png"]


def test_stability_map_puts_a_log_searched_knob_on_a_log_axis_with_labels_apart() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [row(i, 2e-4 + 5e-5 * i, (100,) if i % 2 else (30,), "survived" if i % 2 else "diverged",
                epsilon=10.0 ** -(2 + i)) for i in range(6)]  # a learning rate within one decade
    fig = Figure(figsize=(7, 4.8), layout="constrained")
    ax = fig.add_subplot()
    stability_map(ax, rows, log_knobs={"epsilon"})
    assert (ax.get_xscale(), ax.get_yscale(), ax.get_ylabel()) == ("log", "log", "epsilon")
    FigureCanvasAgg(fig).draw()
    for axis in (ax.xaxis, ax.yaxis):
        boxes = [t.get_window_extent() for t in axis.get_ticklabels(minor=True) + axis.get_ticklabels()
                 if t.get_visible() and t.get_text()]
        assert len(boxes) >= 2
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_report_defaults_are_launchs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """No --study: the model's name; no --tracking-uri: sqlite:///mlflow.db when it exists (here it does not)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    study = optuna.create_study(study_name="iterated_mlp", storage="sqlite:///tuner.db")
    add_trial(study, 0, 1e-3)
    args = argparse.Namespace(study=None, model=None, storage="sqlite:///tuner.db", tracking_uri=None,
                              out_dir=str(tmp_path))
    assert run_report(args) == 0
    assert (tmp_path / "iterated_mlp_survival.png").is_file() and not (tmp_path / "mlflow.db").exists()
    assert "learning_rate=0.001" in capsys.readouterr().out
