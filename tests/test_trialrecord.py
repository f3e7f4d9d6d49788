"""The trial record: one typed attr per trial, per-seed statuses, old studies, and an earliest
divergence that does not depend on which worker ran faster (real training)."""

from __future__ import annotations

import doctest
import re
import types
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import optuna
import pytest

from tests.conftest import FIXTURES
from tests.fixtures.nan_sample import first_nan_step
from tuner.driver import trialrecord, views
from tuner.driver.counts import Counts
from tuner.driver.evidence import Choice, Verification
from tuner.driver.trialrecord import (
    ATTR,
    SeedResult,
    SeedStatus,
    TrialRecord,
    best,
    candidates,
    incumbent,
    mark_incumbent,
    read,
    short_reason,
    study_records,
    why_not,
)
from tuner.errors import DataError
from tuner.models import Dataset, Knob
from tuner.records import DivergedOn, Forensics, RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState


def outcome() -> TrialOutcome:
    """Seed 5 diverged at step 34 (a Log op), seed 6 was cancelled at step 40."""
    diverged = RunRecord(3, 5, 34, RunStatus.DIVERGED, final=True, steps_survived=33, diverged_on=DivergedOn.LOSS,
                         forensics=Forensics(34, op="iter_2/recompute_input/Log"))
    cancelled = RunRecord(3, 6, 40, RunStatus.CANCELLED, final=True, steps_survived=40, error="cancelled")
    return TrialOutcome(3, TrainConfig(1e-2, knobs={"max_iter": 6}), TrialState.DIVERGED, (diverged, cancelled))


def test_record_round_trips_and_tells_a_cancelled_sibling_from_a_diverged_seed() -> None:
    record = TrialRecord.from_outcome(outcome(), steps=100, stopped_at=40)
    again = TrialRecord.from_dict(record.to_dict())
    assert again == record and again.stopped_at == 40
    assert [s.status for s in again.seeds] == [SeedStatus.DIVERGED, SeedStatus.CANCELLED]
    assert (again.divergence_step, again.diverged_on, again.op) == (34, "loss", "iter_2/recompute_input/Log")
    assert again.weakest == 33  # the cancelled sibling does not count as the weakest seed
    assert again.seeds[1].text() == "seed 6: cancelled at step 40"
    with pytest.raises(ValueError, match="newer than this tuner reads"):
        TrialRecord.from_dict({**record.to_dict(), "version": 99})


def test_record_holds_no_mlflow_run_id_and_one_an_older_search_wrote_is_kept() -> None:
    record = TrialRecord.from_outcome(outcome(), steps=100)
    assert "run_id" not in record.to_dict() and record.run_id is None  # the search asks the tracker nothing
    older = {**record.to_dict(), "run_id": "abc"}  # version 1 as the search wrote it when it asked the tracker
    again = TrialRecord.from_dict(older)
    assert again.run_id == "abc" and again.version == 1 and again.to_dict() == older
    legacy = read(types.SimpleNamespace(number=3, user_attrs={"config": {}, "status": "survived", "seeds": [1],
                                                              "steps_survived": [10], "mlflow_run_id": "def"}))
    assert legacy is not None and legacy.run_id == "def" and legacy.version == 0


def test_old_studies_read_from_their_separate_attrs() -> None:
    study = optuna.create_study()
    attrs = {"config": {"learning_rate": 0.1}, "status": "diverged", "steps_survived": [40, 50], "seeds": [1, 2],
             "divergence_step": 41, "diverged_on": "loss", "val_loss": None, "steps": 100}
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs=attrs))
    (record,) = study_records(study)
    assert record.version == 0 and record.divergence_step == 41
    assert [s.status for s in record.seeds] == [SeedStatus.DIVERGED, SeedStatus.CANCELLED]


def test_best_prefers_learned_survivors_then_the_longest_weakest_seed() -> None:
    pruned = TrialRecord.from_outcome(outcome(), steps=100)
    assert best([pruned]) == (pruned, "no trial survived the budget: the one whose weakest seed survived longest")


class OneChoice:
    """A model whose ``data`` knob plants NaN labels when it is ``data_nan``."""

    knobs: Mapping[str, Knob] = {"data": Knob("categorical", "clean", choices=("clean", "data_nan"))}

    def build(self, knobs: Mapping[str, Any]) -> Any:
        raise NotImplementedError  # the preflight never builds

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        y = np.ones(16, np.float32)
        if knobs["data"] == "data_nan":
            y[3] = np.nan
        return Dataset(train=(np.ones((16, 2), np.float32), y), val=(np.ones((4, 2), np.float32), np.ones(4)),
                       batch_size=4)


def test_a_one_choice_list_is_fixed_so_the_preflight_checks_it() -> None:
    from tuner.driver.launch import run_preflight
    from tuner.spaces import space_from

    space = space_from({"data": {"choices": ["data_nan"]}}, "one", OneChoice.knobs, "<test>")
    assert "data" not in space.searched()
    config = types.SimpleNamespace(model="one", allow_bad_data=False)
    with pytest.raises(DataError, match="1 sample"):
        run_preflight(config, OneChoice(), space)


class FixedSeeds:
    """A seed stream whose trials get the seeds given, in that order."""

    def __init__(self, seeds: Mapping[int, tuple[int, ...]]) -> None:
        self.seeds = seeds

    def search(self, number: int, count: int) -> tuple[int, ...]:
        return self.seeds[number]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_same_config_records_the_same_earliest_divergence_whichever_seed_runs_first(ray_cluster: None) -> None:
    """One run at a time: trial 0 trains its late-diverging seed first, trial 1 its early one. Both record
    the early seed's step; trial 1's late seed is cancelled (once past that step), not diverged."""
    from tuner.driver.executor import ClusterConfig, RayExecutor
    from tuner.driver.search import Budget, Search
    from tuner.spaces import space_from

    steps = {s: first_nan_step(s) for s in range(1000, 1100)}
    early = next(s for s in steps if 10 <= steps[s] <= 20)
    late = next(s for s in steps if steps[s] >= steps[early] + 15)
    model = f"{FIXTURES / 'nan_sample.py'}:NanSample"
    space = space_from({"learning_rate": 1e-2}, "nan_sample", {"batch_size": Knob("int", 4, 1, 64)}, "<test>")
    study = optuna.create_study(direction="minimize")
    study.enqueue_trial({})
    study.enqueue_trial({})
    executor = RayExecutor(ClusterConfig(cpus_per_trial=1, max_concurrent=1))
    try:
        Search(study, space, model, executor, Budget(2, 60, seeds=2, report_every=5),
               stream=FixedSeeds({0: (late, early), 1: (early, late)})).run()  # type: ignore[arg-type]
    finally:
        executor.close()
    first, second = study_records(study)  # the whole study in one call
    assert first.divergence_step == second.divergence_step == steps[early]
    assert [s.status for s in first.seeds] == [SeedStatus.DIVERGED, SeedStatus.DIVERGED]
    assert [s.status for s in second.seeds] == [SeedStatus.DIVERGED, SeedStatus.CANCELLED]
    assert second.seeds[1].step >= steps[early]  # cancelled only once past the divergence
    assert read(study.trials[1]) == second and ATTR in study.trials[1].user_attrs


def test_launch_warns_before_overwriting_another_studys_best_config(tmp_path: Any, capsys: Any) -> None:
    from tuner.config import LaunchConfig
    from tuner.driver.resume import warn_overwrite

    out = tmp_path / "best_config.yaml"
    out.write_text("config: {learning_rate: 0.01}\nstudy: {name: iterated_mlp}\n")
    warn_overwrite(LaunchConfig.model_construct(study="tty", model="iterated_mlp", out=str(out)))
    assert "holds study 'iterated_mlp''s best config" in " ".join(capsys.readouterr().out.split())
    warn_overwrite(LaunchConfig.model_construct(study="iterated_mlp", model="iterated_mlp", out=str(out)))
    assert capsys.readouterr().out == ""


def test_progress_line_names_the_op_the_knobs_and_the_clock() -> None:
    import io

    from rich.console import Console

    from tuner.driver.progress import ProgressView

    buffer = io.StringIO()
    with ProgressView(2, live=False, console=Console(file=buffer, width=80), keys=["learning_rate", "max_iter"],
                      steps=100) as view:
        view.on_trial_start(3, outcome().config, (5, 6))
        view.on_trial_result(RunRecord(3, 5, 50, RunStatus.RUNNING, steps_survived=50))
        assert view.progress() == pytest.approx(0.5)
        rendered = io.StringIO()
        Console(file=rendered, width=80).print(view._render())
        assert "seed 5: 50/100" in rendered.getvalue()
        view.on_trial_complete(outcome(), TrialRecord.from_outcome(outcome(), 100))
    line = " ".join(buffer.getvalue().split())
    assert line.startswith("[1/2 ") and "elapsed" in line
    assert "at step 34 (loss, iter_2/recompute_input/Log, seed 5); seed 6: cancelled at step 40" in line
    assert "learning_rate=0.01 max_iter=6" in line


def test_a_finished_study_counts_as_done_only_when_verified_as_the_command_asks(tmp_path: Any) -> None:
    from tests.test_report import verified_study
    from tuner.config import LaunchConfig
    from tuner.driver.resume import finished_study

    storage = f"sqlite:///{tmp_path / 't.db'}"
    verified_study(storage)  # 4 trials, trial 0 verified on 16 seeds x 100 steps (bar 0.8), its margin measured

    def config(**changes: Any) -> LaunchConfig:
        flags = {"study": "v", "model": "iterated_mlp", "storage": storage, "trials": 4, "steps": 50,
                 "verify_seeds": 16, "verify_steps": None, "min_survival": 0.8, "margin": True}
        return LaunchConfig.model_construct(**{**flags, **changes})

    assert finished_study(config()) is not None
    assert finished_study(config(trials=5)) is None  # more trials asked
    assert finished_study(config(verify_seeds=8)) is None  # another verification asked
    assert finished_study(config(verify_seeds=0)) is not None


def complete(number: int, value: float, seeds: int, reason: str = "") -> TrialRecord:
    """A COMPLETE trial that learned, on ``seeds`` seeds (the first two search seeds, the rest race seeds)."""
    runs = tuple(SeedResult(100 * number + i, SeedStatus.SURVIVED, 600, 600, "search" if i < 2 else "race",
                            val_loss=value) for i in range(seeds))
    return TrialRecord(number, TrialState.SURVIVED, {"learning_rate": 1e-3 * (number + 1)}, 600, runs,
                       value=value, learned=True, init_val_loss=2.3, reason=reason)


def stopped(number: int, reason: str, stopped_at: int = 600) -> TrialRecord:
    """A trial the pruner stopped after its first seed (survived) or mid-run (its seeds cancelled)."""
    status = SeedStatus.SURVIVED if stopped_at == 600 else SeedStatus.CANCELLED
    runs = (SeedResult(100 * number, status, stopped_at, stopped_at, val_loss=0.167),)
    return TrialRecord(number, TrialState.STOPPED, {"learning_rate": 0.1}, 600, runs, reason=reason,
                       stopped_at=stopped_at)


def test_the_incumbent_is_the_raced_trial_the_export_picks_not_the_lowest_loss_on_two_seeds() -> None:
    """Issue 28: trial 20 (0.0473 on 2 seeds, not raced) was "best so far" while trial 4 (0.0545 on 8) was exported."""
    raced, lucky = complete(4, 0.0545, 8), complete(20, 0.0473, 2)
    assert best([raced, lucky])[0] is lucky  # without racing every learned survivor is in the pool
    top, rule = incumbent([raced, lucky], race_seeds=8)
    assert top is raced and "raced to 8 seeds" in rule and "not verified" in rule
    assert [r.number for r in candidates([raced, lucky], 8)] == [4]  # what verification would try first
    assert incumbent([raced, lucky], Choice(20, True, "rule"), race_seeds=8) == (lucky, "rule")  # a choice wins
    marked = {r.number: r for r in mark_incumbent([raced, lucky], race_seeds=8)}
    assert (marked[4].chosen, marked[4].why, marked[20].chosen) == (True, "", False)
    assert marked[20].why == "0.0473 on 2 seeds; not raced to 8"  # an older record: no search-time reason
    said = "0.0473 on 2 seeds is within 1 standard error of trial 4's 0.0545 on 8 seeds; not raced"
    assert mark_incumbent([raced, complete(20, 0.0473, 2, said)], race_seeds=8)[1].why == said  # the search's words


def test_why_not_gives_every_lost_trial_one_short_line() -> None:
    top = replace(complete(4, 0.0545, 8), verification=verification(16))
    below = replace(complete(5, 0.06, 8), verification=verification(13))
    assert why_not(below, top) == "verified 13/16 (lower bound 0.57): below the bar 0.8"
    assert why_not(complete(6, 0.07, 8), top) == "val loss 0.07 > trial 4's 0.0545; not verified"
    unlearned = replace(complete(7, 2.4, 2), learned=False)
    assert why_not(unlearned, top) == "did not learn: val loss 2.4 not below 2.3 at init"
    failed = TrialRecord(8, TrialState.FAILED, {}, 600, (), reason="ValueError: " + "x " * 200)
    assert why_not(failed, top).startswith("failed: ValueError: x x") and len(why_not(failed, top)) <= 90
    assert why_not(failed, top).endswith("...") and why_not(top, top) == ""
    pruned = TrialRecord.from_outcome(outcome(), steps=100)
    assert why_not(pruned, top) == "diverged at step 34 (seed 5): loss"


def verification(survived: int) -> Verification:
    return Verification(seeds=tuple(range(16)), steps=1200, survived=survived, runs=16, min_survival=0.8,
                        val_loss=0.05, init_val_loss=2.3)


def test_a_stopped_trial_reads_stopped_with_its_reason_in_the_pruners_own_words() -> None:
    """The reasons come from real searches (tests/test_search.py's fake executor): a rewording there fails here."""
    from tests.test_search import THREE_FINISHED, first_seed_search
    from tuner.driver.pruning import FirstSeedPruner, make_pruner

    search, _ = first_seed_search(FirstSeedPruner(min_step=40, max_step=100, factor=100.0),
                                  [*THREE_FINISHED, 10**-3.5])
    search.run()
    behind = read(search.study.trials[3])
    assert re.fullmatch(r"stopped: first seed 1(\.01)? > 1\.2 x best 0\.1444", short_reason(behind))
    search, _ = first_seed_search(make_pruner("first-seed", 200), [*THREE_FINISHED, 10**-3.5])
    search.run()
    early = read(search.study.trials[3])
    assert short_reason(early) == "stopped at step 40: first seed's loss > 3 x the best first seed's"
    assert views.describe(early).startswith("trial 3: stopped at step 40: first seed's loss > 3 x")
    row = views.outcome_text(stopped(9, behind.reason))
    assert row.splitlines() == [short_reason(behind), "seeds 1 (the others not run): 600 / 600"]
    assert views.outcome_text(stopped(9, early.reason, 40)).splitlines()[1] == "seeds 1: 40s / 600"
    assert "c cancelled (a sibling diverged)," in views.LEGEND and "s stopped by the pruner" in views.LEGEND


def test_counts_have_one_definition_in_the_launch_run_and_every_view(tmp_path: Any) -> None:
    """30 trials: 4 survived, 4 diverged, 22 stopped. Issue 28 saw "30/30 finished", "4 of 8" and 0.1333."""
    from tuner.driver.launch import _study_summary

    pruned = TrialRecord.from_outcome(outcome(), steps=600)
    median = "at step 40 its loss was behind the median of the completed trials"
    records = ([complete(n, 0.05 + n / 100, 2) for n in range(4)] + [replace(pruned, number=n) for n in range(4, 8)]
               + [stopped(n, median) for n in range(8, 30)])
    counts = Counts.of(records)
    assert (counts.finished, counts.judged, counts.diverged_fraction) == (30, 8, 0.5)
    assert counts.line() == ("30 trials finished: 4 survived, 4 diverged, 22 stopped by the pruner, 0 failed; "
                             "diverged fraction 50% (4 of the 8 trials that survived or diverged)")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 't.db'}")
    state = {TrialState.SURVIVED: optuna.trial.TrialState.COMPLETE, TrialState.FAILED: optuna.trial.TrialState.FAIL}
    for r in records:
        study.add_trial(optuna.trial.create_trial(state=state.get(r.state, optuna.trial.TrialState.PRUNED),
                                                  value=r.value, user_attrs={ATTR: r.to_dict()}))
    summary = _study_summary(study)  # the MLflow launch run's metrics
    assert (summary["trials_finished"], summary["diverged_fraction"], summary["trials_stopped"]) == (30, 0.5, 22)


def test_trialrecord_docstring_examples_run() -> None:
    """The record's and the counts' examples run and print what they show."""
    from tuner.driver import counts

    results = [doctest.testmod(module, optionflags=doctest.ELLIPSIS) for module in (trialrecord, counts)]
    assert results[0].attempted >= 7 and results[1].attempted >= 5 and not any(r.failed for r in results)
