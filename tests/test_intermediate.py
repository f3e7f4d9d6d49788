"""Batched intermediate values: Optuna holds what ``Trial.report`` would have written, value for value."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from tuner.driver.intermediate import Reports

VALUES = {10: 1.5, 20: float("nan"), 30: float("inf"), 40: 0.25}


@pytest.mark.parametrize("storage", ["sqlite", "memory"])
def test_reports_batched_hold_what_report_writes(tmp_path: Path, storage: str) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}" if storage == "sqlite" else None
    study = optuna.create_study(storage=url)
    by_report, batched, stale = study.ask(), study.ask(), study.ask()
    for step, value in VALUES.items():
        by_report.report(value, step)
    reports = Reports(every=3600.0)
    for trial in (batched, stale):
        for step, value in VALUES.items():
            reports.add(trial, step, value)
    reports.add(batched, 10, 99.0)  # a step reported twice keeps its first value, as with report
    reports.flush_due()  # the first write of a running trial: its latest value only
    assert list(study.trials[batched.number].intermediate_values) == [40]
    study.tell(stale, state=optuna.trial.TrialState.FAIL)  # failed meanwhile (by another launch, as stale)
    reports.flush()
    held = study.trials[batched.number].intermediate_values
    assert held.keys() == VALUES.keys()
    for step, value in study.trials[by_report.number].intermediate_values.items():
        assert held[step] == value or (math.isnan(held[step]) and math.isnan(value))
    assert study.trials[stale.number].intermediate_values == {40: 0.25}  # nothing written once it was failed


@pytest.mark.parametrize("storage", ["sqlite", "memory"])
def test_reports_batched_are_seen_by_the_trials_pruner(tmp_path: Path, storage: str) -> None:
    """``Trial.should_prune`` reads the trial's own copy: the batch puts its values there, as report does
    (without, every pruner saw no step on a SQLite study and stopped nothing)."""
    url = f"sqlite:///{tmp_path / 'o.db'}" if storage == "sqlite" else None
    study = optuna.create_study(storage=url, pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    trial = study.ask()
    reports = Reports(every=3600.0)
    reports.add(trial, 10, 0.5)
    reports.flush(trial)
    assert not trial.should_prune()
    reports.add(trial, 20, 5.0)
    reports.flush(trial)
    assert trial.should_prune()  # the pruner saw step 20's value, above its bound


@pytest.mark.parametrize("storage", ["sqlite", "memory"])
def test_reports_shown_reach_the_pruner_at_once_and_the_storage_with_the_batch(tmp_path: Path, storage: str) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}" if storage == "sqlite" else None
    study = optuna.create_study(storage=url, pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    trial = study.ask()
    reports = Reports(every=3600.0)
    reports.add(trial, 10, 0.5)
    reports.add(trial, 20, 5.0)
    reports.show(trial)
    assert trial.should_prune()  # the pruner saw step 20's value
    written = study.trials[trial.number].intermediate_values  # a fresh read of the storage
    assert written == ({} if storage == "sqlite" else {10: 0.5, 20: 5.0})  # on SQLite not written yet
    reports.add(trial, 30, 0.7)
    reports.flush(trial)
    assert study.trials[trial.number].intermediate_values == {10: 0.5, 20: 5.0, 30: 0.7}


def test_reports_shown_reach_the_storage_when_the_batch_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that fails falls back to ``Trial.report``, which skips a step the trial's copy holds: the
    values the pruner was shown are written to the storage all the same."""
    from tuner import hooks

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}")
    trial = study.ask()
    reports = Reports(every=3600.0)
    reports.add(trial, 10, 0.5)
    reports.add(trial, 20, 5.0)
    reports.show(trial)
    reports.add(trial, 30, 0.7)
    monkeypatch.setattr(hooks, "insert_intermediate_values", lambda pending: False)  # as when the insert raised
    reports.flush(trial)
    assert study.trials[trial.number].intermediate_values == {10: 0.5, 20: 5.0, 30: 0.7}
