"""The seed policies (tuner.driver.seeding): which search seeds run first, and whether the rest run."""

from __future__ import annotations

import optuna

from tuner.driver.outcome import Act
from tuner.driver.pruning import FirstSeedPruner, make_pruner
from tuner.driver.seeding import AllSeeds, FirstSeed, seed_policy
from tuner.records import RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState

CONFIG = TrainConfig(1e-3)


def outcome(state: TrialState, value: float | None = None) -> TrialOutcome:
    seed = RunRecord(0, 7, 9, RunStatus.DIVERGED if state is TrialState.DIVERGED else RunStatus.SURVIVED, final=True)
    return TrialOutcome(0, CONFIG, state, (seed,), value=value, reason="" if value is not None else "x")


def test_seed_policy_comes_with_the_first_seed_pruner_only() -> None:
    assert seed_policy(make_pruner("first-seed", 600)) == FirstSeed(1.2, 3)
    assert seed_policy(FirstSeedPruner(10, val_factor=2.0, min_trials=1)) == FirstSeed(2.0, 1)
    for other in (make_pruner("behind", 600), optuna.pruners.MedianPruner(), optuna.pruners.NopPruner()):
        assert isinstance(seed_policy(other), AllSeeds) and seed_policy(other).first((3, 4)) == (3, 4)


def test_first_seed_runs_the_rest_only_for_an_unstopped_survivor_within_val_factor_of_the_best() -> None:
    policy = FirstSeed(val_factor=1.2)
    assert policy.first((3, 4, 5)) == (3,)
    best = [0.2, 0.5, 0.6]
    assert policy.after_first(outcome(TrialState.SURVIVED, 0.24), False, best).act is Act.RUN  # 1.2 x 0.2
    behind = policy.after_first(outcome(TrialState.SURVIVED, 0.25), False, best)
    assert (behind.act, behind.state) == (Act.TELL, TrialState.STOPPED)
    assert behind.reason == ("its first seed's validation loss 0.25 was more than 1.2x the best trial's 0.2; "
                             "its other seeds were not run")
    assert policy.after_first(outcome(TrialState.SURVIVED, 0.25), False, best[:2]).act is Act.RUN  # < 3 trials
    for ended in (policy.after_first(outcome(TrialState.SURVIVED, 0.1), True, best),  # the pruner stopped it
                  policy.after_first(outcome(TrialState.DIVERGED), False, best)):
        assert (ended.act, ended.state, ended.reason) == (Act.TELL, None, "")  # it ends as its first seed did
