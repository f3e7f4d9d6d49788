"""How a trial's runs end as one state (tuner.driver.outcome.judge), and the invariants checked there."""

from __future__ import annotations

import pytest

from tuner.driver.outcome import Stop, check, judge
from tuner.records import RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState

CONFIG = TrainConfig(1e-3)


def run(seed: int, status: RunStatus, val_loss: float | None = None, error: str = "") -> RunRecord:
    return RunRecord(0, seed, 100, status, final=True, val_loss=val_loss, error=error or None)


SURVIVED = {0: run(0, RunStatus.SURVIVED, 0.2), 1: run(1, RunStatus.SURVIVED, 0.4)}
CUT = {0: run(0, RunStatus.SURVIVED, 0.2), 1: run(1, RunStatus.CANCELLED)}


def test_judge_survivors_are_complete_with_the_mean_validation_loss() -> None:
    outcome = judge(0, CONFIG, SURVIVED)
    assert (outcome.state, outcome.value, outcome.reason) == (TrialState.SURVIVED, pytest.approx(0.3), "")


def test_judge_divergence_beats_failure_and_failure_beats_a_stop() -> None:
    diverged = {**CUT, 2: run(2, RunStatus.DIVERGED), 3: run(3, RunStatus.FAILED, error="boom")}
    assert judge(0, CONFIG, diverged, stop=Stop(50, "behind")).state is TrialState.DIVERGED
    failed = {**CUT, 3: run(3, RunStatus.FAILED, error="boom")}
    outcome = judge(0, CONFIG, failed, stop=Stop(50, "behind"))
    assert (outcome.state, outcome.reason) == (TrialState.FAILED, "boom")
    assert judge(0, CONFIG, CUT).reason == "a seed run ended early"


def test_judge_a_stop_makes_a_cut_trial_stopped_and_an_ended_stop_a_survivor_too() -> None:
    stopped = judge(0, CONFIG, CUT, stop=Stop(50, "at step 50 it was behind"))
    assert (stopped.state, stopped.value, stopped.reason) == (TrialState.STOPPED, None, "at step 50 it was behind")
    assert judge(0, CONFIG, SURVIVED, stop=Stop(50, "late")).state is TrialState.SURVIVED  # the cancel came too late
    ended = judge(0, CONFIG, SURVIVED, stop=Stop(100, "its first seed was behind", ended=True))
    assert (ended.state, ended.value) == (TrialState.STOPPED, None)


@pytest.mark.parametrize(("state", "value", "reason", "seeds", "problem"), [
    (TrialState.SURVIVED, None, "", (), "a survived trial has no value"),
    (TrialState.STOPPED, 0.3, "behind", (), "a stopped trial has a value"),
    (TrialState.STOPPED, None, "", (), "a stopped trial has no reason"),
    (TrialState.FAILED, None, "", (), "a failed trial has no reason"),
    (TrialState.DIVERGED, None, "", (run(0, RunStatus.CANCELLED),), "a diverged trial has no diverged seed"),
])
def test_check_refuses_a_state_that_breaks_its_invariant(
        state: TrialState, value: float | None, reason: str, seeds: tuple[RunRecord, ...], problem: str) -> None:
    with pytest.raises(RuntimeError, match=f"trial 0: {problem}"):
        check(TrialOutcome(0, CONFIG, state, seeds, value=value, reason=reason))
