"""A trial's MLflow run found by its tags, not asked of the search: two launches of a study on one
store, a phase run that carries the trial's tag too, a store that is missing or does not answer."""

from __future__ import annotations

import socket
import time
import types
from pathlib import Path
from typing import Any

import pytest

from tuner.driver.mlflow_runs import own_runs, stored_runs
from tuner.records import Phase, RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState


def run(run_id: str, start: int, **tags: str) -> types.SimpleNamespace:
    """A stand-in for an MLflow ``Run`` with these tags."""
    return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id, start_time=start),
                                 data=types.SimpleNamespace(tags=tags))


def test_own_runs_are_the_trials_search_runs_the_latest_started_of_a_number() -> None:
    runs = [run("new", 20, trial="0", phase="search"), run("old", 10, trial="0", phase="search"),
            run("race", 30, trial="0", phase="race"), run("before-phases", 5, trial="1"),
            run("launch", 1, **{"tuner.role": "study"})]
    assert {n: r.info.run_id for n, r in own_runs(runs).items()} == {0: "new", 1: "before-phases"}


def finished(tracker: Any, number: int, config: TrainConfig) -> None:
    """Trial ``number`` starts, reports once and ends, heard as the search tells a callback."""
    final = RunRecord(number, 7, 10, RunStatus.SURVIVED, final=True, steps_survived=10, val_loss=0.5)
    tracker.on_trial_start(number, config, (7,))
    tracker.on_trial_result(final)
    tracker.on_trial_complete(TrialOutcome(number, config, TrialState.SURVIVED, (final,), value=0.5))


def test_tracker_runs_names_this_launchs_and_earlier_launchs_trial_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.driver.tracking import Tracker

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    uri, config = f"sqlite:///{tmp_path / 'm.db'}", TrainConfig(1e-2)
    first = Tracker(uri, "s", {"model": "planted"})
    finished(first, 0, config)
    first.on_phase_start(0, Phase.VERIFY, config, (100, 101))  # a run of trial 0's config, tagged trial 0 too
    verified = RunRecord(0, 100, 10, RunStatus.SURVIVED, final=True, steps_survived=10, val_loss=0.4,
                         phase=Phase.VERIFY)
    first.on_phase_end(TrialOutcome(0, config, TrialState.SURVIVED, (verified,), value=0.4, phase=Phase.VERIFY))
    first.close()
    earlier = first.runs()
    assert list(earlier) == [0]

    second = Tracker(uri, "s", {"model": "planted"})  # the study continued by a second launch
    finished(second, 1, config)
    assert second.flush()
    runs = second.runs()
    assert runs[0] == earlier[0] and sorted(runs) == [0, 1]
    second.close()
    assert stored_runs(uri, "s") == runs  # what a launch of the finished study reads, read only
    assert stored_runs(uri, "no-such-study") == {}


def test_stored_runs_creates_no_store_and_never_waits_for_one_that_does_not_answer(tmp_path: Path) -> None:
    import mlflow.tracking  # noqa: F401  (its import is not what is bounded below)

    missing = tmp_path / "m.db"
    assert stored_runs(f"sqlite:///{missing}", "s") == {} and not missing.exists()
    with socket.socket() as sock:  # a port nothing listens on: a tracking server that is down
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    assert stored_runs(f"http://127.0.0.1:{port}", "s") == {}
    assert time.monotonic() - start < 30.0  # no retries: MLflow's default backoff would take minutes
