"""The pruner registry (tuner.driver.pruning): one entry per ``--pruner`` name, each pruner's
argument checks and its docstring example, the reasons a stopped trial gives."""

from __future__ import annotations

import argparse
import doctest
import typing

import optuna
import pytest

from tuner.cli import parser
from tuner.config import LaunchConfig, PrunerName
from tuner.driver import pruning, seeding
from tuner.driver.pruning import PRUNERS, BehindBestPruner, FirstSeedPruner, make_pruner, prune_start, stop_reason


@pytest.mark.parametrize("module", [pruning, seeding])
def test_pruning_docstring_examples_run(module: object) -> None:
    """The examples in the pruners' and the seed policy's docstrings run and print what they show."""
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0


def test_pruning_registry_feeds_the_config_type_and_the_flag() -> None:
    names = typing.get_args(PrunerName)
    assert tuple(PRUNERS) == names == pruning.NAMES
    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    launch = next(a for a in commands.choices["launch"]._actions if "--pruner" in a.option_strings)
    assert tuple(launch.choices or ()) == names and launch.help is not None and launch.help == pruning.help_text()
    assert all(f"{name} (" in launch.help for name in names if name != "none")
    assert LaunchConfig.model_fields["pruner"].default in names


@pytest.mark.parametrize("name", typing.get_args(PrunerName))
def test_make_pruner_builds_each_registered_kind_and_its_start(name: str) -> None:
    pruner = make_pruner(name, 600)
    assert type(pruner) is PRUNERS[name].kind  # type: ignore[index]
    assert prune_start(name, 600) == {"none": 0, "behind": 150, "first-seed": 100, "median": 300, "asha": 150}[name]


def test_make_pruner_of_an_unknown_name_prunes_nothing_and_pruning_names_the_valid_ones() -> None:
    assert isinstance(make_pruner("bogus", 100), optuna.pruners.NopPruner) and prune_start("bogus", 100) == 0
    with pytest.raises(ValueError, match="unknown pruner 'bogus'; valid: none, behind, first-seed, median, asha"):
        pruning.lookup("bogus")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_step": -1}, "min_step"), ({"min_step": 1, "max_step": -2}, "max_step"),
    ({"min_step": 1, "factor": 0.0}, "factor must be above 0"),
    ({"min_step": 1, "factor": float("nan")}, "factor must be above 0"),
    ({"min_step": 1, "min_trials": 0}, "min_trials must be 1 or more"),
])
def test_behind_pruners_reject_bad_arguments_when_made(kwargs: dict[str, typing.Any], message: str) -> None:
    for cls in (BehindBestPruner, FirstSeedPruner):
        with pytest.raises(ValueError, match=message):
            cls(**kwargs)
    with pytest.raises(ValueError, match="val_factor must be above 0"):
        FirstSeedPruner(1, val_factor=-1.0)


def test_stop_reason_names_each_pruners_rule_and_factor() -> None:
    assert stop_reason(make_pruner("behind", 200), 60) == (
        "at step 60 its loss was more than 1.5x the lowest loss a finished trial had at that step")
    assert stop_reason(FirstSeedPruner(10, factor=4.0), 40).startswith(
        "at step 40 its first seed's loss was more than 4x the lowest loss a finished trial's first seed had")
    assert "not in the best third" in stop_reason(make_pruner("asha", 200), 60)
    assert "behind the median" in stop_reason(make_pruner("median", 200), 100)


def _finished(study: optuna.Study, loss_at_10: float, value: float | None) -> None:
    """A trial that reported ``loss_at_10`` at step 10 and ended COMPLETE with ``value`` (None: PRUNED)."""
    trial = study.ask()
    trial.report(loss_at_10, 10)
    if value is None:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, value)


def _asked_at_10(study: optuna.Study, loss: float) -> bool:
    trial = study.ask()
    trial.report(loss, 10)
    return trial.should_prune()


def test_first_seed_loss_rule_stands_down_where_a_trial_as_far_behind_ended_among_the_best() -> None:
    """A model that learns in a jump at a step that varies (examples/adding_lstm.py): a trial still on
    the plateau at step 10 ended the best, so being behind at step 10 says nothing in this study."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=FirstSeedPruner(min_step=10, max_step=20, factor=3.0, val_factor=1.2))
    for loss, value in ((0.01, 0.10), (0.20, 0.50), (0.30, 0.60)):  # the early learner ended best
        _finished(study, loss, value)
    assert _asked_at_10(study, 0.16)  # above 3 x 0.01, and no trial that far behind ended near the best
    _finished(study, 0.16, 0.11)  # a late learner: 16x behind at step 10, then within 1.2x of the best
    assert not _asked_at_10(study, 0.16)
    assert not _asked_at_10(study, 0.5)  # stood down at this step, however far behind
    stopped = optuna.create_study(pruner=FirstSeedPruner(min_step=10, max_step=20, factor=3.0, val_factor=1.2))
    for loss, value in ((0.01, 0.10), (0.20, 0.50), (0.30, 0.60), (0.16, None)):  # one stopped there: no final
        _finished(stopped, loss, value)
    assert _asked_at_10(stopped, 0.16)
    behind = optuna.create_study(pruner=BehindBestPruner(min_step=10, max_step=20, factor=3.0))
    for loss, value in ((0.01, 0.10), (0.20, 0.50), (0.30, 0.60), (0.16, 0.11)):
        _finished(behind, loss, value)
    assert _asked_at_10(behind, 0.16)  # --pruner behind keeps its fixed rule
