"""The benchmark scripts keep working: each one's --smoke mode runs and prints its figure lines.

Timings are never asserted here (they belong in BENCHMARKS.md, measured on a quiet machine).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, bench_module

BENCH = ROOT / "bench"

# script -> the RESULT lines its smoke run must print
SCRIPTS = {
    "ask_cost.py": ["RESULT ask_cost driver cache median =", "RESULT ask_cost optuna cache median ="],
    "overhead.py": ["RESULT overhead tuner =", "RESULT overhead ray_tune_reuse ="],
    "scaling.py": ["RESULT scaling end_to_end =", "RESULT scaling steady ="],
    "pruning.py": ["RESULT pruning steps_fraction =", "RESULT pruning cancel_latency ="],
    "search_efficiency.py": ["RESULT efficiency tpe =", "RESULT efficiency ratio ="],
    "pruner_replay.py": ["RESULT pruner_replay --pruner behind: saved ="],
    "pruner_signals.py": ["RESULT pruner_signals val_behind =", "RESULT pruner_signals first_seed =",
                          "RESULT pruner_signals best_rank =",
                          "RESULT pruner_signals seed_to_seed ="],
    "robustness.py": ["RESULT robustness smoke worst_survival =", "RESULT robustness smoke compute_ratio ="],
    "tpe_window.py": ["RESULT tpe_window reads all:", "RESULT tpe_window reads 20:"],
    "driver_rate.py": ["RESULT driver_rate sqlite =", "RESULT driver_rate tensorflow_imported = no"],
    "driver_footprint.py": [
        "RESULT driver cpu_per_1000_records =", "RESULT driver peak_memory =", "RESULT driver tensorflow_imported = no",
        "RESULT driver record_cost =",
    ],
}


def _smoke(script: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_smoke_prints_its_figures(script: str) -> None:
    done = _smoke(script)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in SCRIPTS[script]:
        assert line in done.stdout, f"{line!r} missing from:\n{done.stdout[-3000:]}"
    assert "machine:" in done.stdout


def test_bench_scripts_are_all_smoke_tested() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")}
    helpers = {"benchlib.py", "bare_loop.py", "ray_tune_baseline.py", "reference_grid.py", "telemetry_overhead.py"}
    checked_elsewhere = {"ui_screenshots.py"}  # a browser check, not a timing: tests/test_ui.py runs it
    assert scripts - helpers - checked_elsewhere == set(SCRIPTS)


def test_pruner_replay_asks_the_shipped_pruner() -> None:
    """bench/pruner_replay.py replays recorded trials through the pruner a launch makes: ``behind``
    stops the trial far behind at its first step (a quarter of 600), not one behind only past half
    the steps, and keeps the winner; ``none`` stops nothing; a diverged trial (NaN) is never the
    pruner's to stop."""
    replay = bench_module("pruner_replay")
    steps = range(25, 601, 25)

    def curve(number: int, loss: float, val: float | None, last: int = 600) -> Any:
        values = {s: (loss if s < last or val is not None else float("nan")) for s in steps if s <= last}
        return replay.Curve(number, values, last, 2, val)

    late = curve(6, 1.0, 0.50)
    late.values.update({s: 5.0 for s in steps if s > 300})  # behind only past half the steps: batch noise there
    study = [curve(0, 1.0, 0.30), curve(1, 0.9, 0.20), curve(2, 1.1, 0.25), curve(3, 0.7, None, last=400),
             curve(4, 5.0, 0.90), curve(5, 0.8, 0.10), late]
    total = sum(c.steps * c.seeds for c in study)
    saved, kept_best, regret = replay.replay(study, replay.shipped("behind"))
    assert saved == pytest.approx((600 - 150) * 2 / total)  # trial 4, from step 150
    assert kept_best and regret == 1.0
    assert replay.replay(study, replay.shipped("none")) == (0.0, True, 1.0)


def test_pruner_signals_reads_the_steps_as_a_launch_reports_them() -> None:
    """bench/pruner_signals.py's reports: the seeds' mean of the 25 step losses before each report
    step (what the search reports, from tuner.worker.telemetry's ``loss_mean``), another window's
    median where asked, and NaN just after a diverged trial's last finite step."""
    signals = bench_module("pruner_signals")
    first = [float(i) for i in range(1, 601)]  # the loss at step k is k
    second = [2.0 * x for x in first]
    trials = {"0": {"value": 0.5, "state": "COMPLETE",
                    "seeds": {"7": {"losses": first, "val": 0.4}, "8": {"losses": second, "val": 0.6}}},
              "1": {"value": None, "state": "PRUNED",
                    "seeds": {"9": {"losses": first[:130], "val": None}, "10": {"losses": second[:140], "val": None}}}}
    for run, scale in ((trials["0"]["seeds"]["7"], 1.0), (trials["0"]["seeds"]["8"], 2.0)):
        run["val_at"] = {str(s): scale * s / 100 for s in range(25, 301, 25)}
    done, diverged = signals.curves(trials, signals.SIGNALS["mean of 25 (what a launch reports)"])
    assert (done.steps, done.seeds, done.val_loss) == (600, 2, 0.5)
    assert done.values[25] == pytest.approx(1.5 * 13.0) and done.values[600] == pytest.approx(1.5 * 588.0)
    assert sorted(diverged.values) == [*range(25, 126, 25), 131] and math.isnan(diverged.values[131])
    assert (diverged.steps, diverged.val_loss) == (131, None)
    median = signals.curves(trials, signals.SIGNALS["median of 100"])[0]
    assert median.values[300] == pytest.approx(1.5 * 250.5)
    behind = signals.curves({"0": trials["0"]}, signals.val_in_window)[0]  # val from 150 to 200 (of 600)
    assert behind.values[150] == pytest.approx(1.5 * 1.5) and behind.values[200] == pytest.approx(1.5 * 2.0)
    assert behind.values[125] == done.values[125] and behind.values[225] == done.values[225]


def test_pruner_signals_replays_first_seed_through_the_search_counting_the_steps_each_trial_ran() -> None:
    """bench/pruner_signals.py replays recorded runs through tuner's own Search: with ``first-seed`` a
    trial whose first seed ended above 1.2x the best trial's validation loss never runs its second
    seed, one whose first seed is 3x behind at a sixth of the steps stops there; ``none`` runs all."""
    signals = bench_module("pruner_signals")
    flat = [1.0] * 600

    def trial(val_a: float, val_b: float, losses: list[float] = flat) -> dict:
        return {"value": (val_a + val_b) / 2, "state": "COMPLETE",
                "seeds": {"1": {"losses": losses, "val": val_a}, "2": {"losses": flat, "val": val_b}}}

    trials = {str(i): trial(0.1, 0.1) for i in range(5)}  # two trials in flight: 3 finished before trial 5 ends
    trials["5"] = trial(0.5, 0.1)  # its first seed: 5x the best trial's validation loss
    trials["6"] = trial(0.1, 0.1, [10.0] * 600)  # 10x the finished first seeds' loss at step 100
    trials["7"] = trial(0.11, 0.3)  # within 1.2x: both seeds run
    steps, values = signals.replay_search(trials, "first-seed")
    assert steps == {**{i: 1200 for i in range(5)}, 5: 600, 6: 100, 7: 1200}
    assert sorted(values) == [0, 1, 2, 3, 4, 7] and values[7] == pytest.approx(0.205)
    steps, values = signals.replay_search(trials, "none")
    assert set(steps.values()) == {1200} and sorted(values) == list(range(8))


def test_robustness_interval_of_the_median_ratio_is_narrow_only_where_the_seeds_agree() -> None:
    """bench/robustness.py's paired bootstrap over sampler seeds: the same exports give exactly 1;
    exports that agree seed by seed within 2 % give an interval within 2 %; exports whose losses
    spread over two orders of magnitude (as on examples/adding_lstm.py) give one too wide to tell 5 %."""
    robustness = bench_module("robustness")
    alt = [0.0002, 0.0003, 0.0003, 0.0005, 0.0005, 0.0007, 0.003, 0.006, 0.008, 0.028]
    assert robustness.bootstrap_interval(alt, alt, draws=500) == (1.0, 1.0)
    close = [v * (1.02 if i % 2 else 0.98) for i, v in enumerate(alt)]
    low, high = robustness.bootstrap_interval(close, alt, draws=500)
    assert 0.98 <= low <= high <= 1.02
    shuffled = [0.0003, 0.0002, 0.028, 0.0005, 0.006, 0.0003, 0.0007, 0.0005, 0.003, 0.008]  # the same values
    low, high = robustness.bootstrap_interval(shuffled, alt, draws=500)
    assert low < 0.5 and high > 2.0


def test_robustness_model_and_space_reach_every_launch_and_the_model_every_held_out_check(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/robustness.py --model FILE:Name --space FILE: each launch (run in a temporary folder) gets
    both by absolute path, and each ``tuner verify`` the model (a config file never picks the code it
    runs) and no space. The launches are recorded here instead of run (the smoke runs real ones)."""
    import types

    robustness = bench_module("robustness")
    calls: list[list[str]] = []

    def tuner(argv: list[str], cwd: str) -> tuple[int, str]:
        calls.append(argv)
        return 0, "survived 4/4 seeds; validation loss 0.25 (mean)"

    monkeypatch.setattr(robustness, "tuner", tuner)
    monkeypatch.setattr(robustness.optuna, "load_study", lambda **_: types.SimpleNamespace(user_attrs={}))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["robustness.py", "--smoke", "--model", "examples/adding_lstm.py:AddingRNN",
                                      "--space", "examples/adding_lstm.yaml", "--json", str(tmp_path / "r.json")])
    robustness.main()
    model = f"{ROOT / 'examples' / 'adding_lstm.py'}:AddingRNN"
    launches = [argv for argv in calls if argv[0] == "launch"]
    checks = [argv for argv in calls if argv[0] == "verify"]
    assert len(launches) == len(checks) == 2  # tuner now and no racing, each checked on held-out seeds
    for argv in launches:
        assert argv[argv.index("--model") + 1] == model
        assert argv[argv.index("--space") + 1] == str(ROOT / "examples" / "adding_lstm.yaml")
    for argv in checks:
        assert argv[argv.index("--model") + 1] == model and "--space" not in argv
    assert "robustness of examples/adding_lstm.py:AddingRNN" in capsys.readouterr().out


def test_search_efficiency_constrained_tpe_is_told_how_early_a_trial_diverged() -> None:
    """bench/search_efficiency.py's ``tpe-constrained``: tuner's TPE (make_sampler's settings) whose
    constraint a diverged trial breaks by the share of steps it did not survive, through the real
    search loop (tests/test_search.py's in-process executor)."""
    import optuna

    from tests.test_search import FakeExecutor, make_search

    efficiency = bench_module("search_efficiency")
    sampler = efficiency.constrained_tpe(seed=0, searched=1)
    assert isinstance(sampler, optuna.samplers.TPESampler) and sampler._multivariate and sampler._constant_liar
    search = make_search(2, FakeExecutor(), sampler)
    search.study.enqueue_trial({"learning_rate": 0.02})  # diverges at step 25 or 26 of 200, by its seed
    search.study.enqueue_trial({"learning_rate": 10**-2.5})  # survives
    search.run()
    diverged, survived = search.study.trials
    assert diverged.state is optuna.trial.TrialState.PRUNED
    (violation,) = diverged.system_attrs["constraints"]
    assert violation in (pytest.approx(1 - 24 / 200), pytest.approx(1 - 25 / 200))  # its earliest seed's
    assert tuple(survived.system_attrs["constraints"]) == (0.0,)
