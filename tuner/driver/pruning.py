"""The pruners: what stops a finite trial that is behind (never counted as diverged), by name.

:data:`PRUNERS` is the one registry: each name of ``--pruner`` (the names themselves are
``tuner.config.PrunerName``, which the launch file's validation and the flag's choices use; a
shared module cannot import the driver) maps to its factory, the first step it may stop a trial
at, the words a stopped trial's reason gives, and its ``--pruner`` help. A new pruner is a class
here (validating its arguments in ``__init__``, with a runnable example in its docstring), its
name in ``PrunerName`` and its entry in :data:`PRUNERS`; this module refuses to import when the
two lists of names differ.

Each pruner only ever stops a finite trial whose mean training loss (``loss_mean``, over the steps
since the last report, the seeds averaged) is behind, and only from :func:`prune_start` on.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from tuner.config import LaunchConfig, PrunerName
from tuner.driver.seeding import FirstSeed

ASHA_REDUCTION = 3  # successive halving keeps the best third of the trials at each rung
BEHIND_FACTOR = 1.5  # ``behind`` stops a trial whose loss is above this many times the best at the same step
FIRST_SEED_FACTOR = 3.0  # ``first-seed``: its training-loss rule, while the first seed runs
FIRST_SEED_VAL_FACTOR = 1.2  # ``first-seed``: the first seed's validation loss against the best trial's


class BehindBestPruner(optuna.pruners.BasePruner):
    """Stop a trial whose loss at a step is more than ``factor`` x the lowest loss that a finished
    trial (survived, diverged later, or stopped later) had at the same step, between ``min_step``
    and ``max_step`` and once ``min_trials`` finished trials reached that step. Running trials are
    not compared: their values reach the storage in batches (tuner.driver.intermediate).

    Why: the training loss ranks the final validation loss only weakly on the shipped models, so a
    rank cut (ASHA's best third) stops the eventual best too often, while a trial far behind the best
    is rarely the winner. Late in a run the training loss sits on a floor of batch noise, where the
    ratio stops good trials for little saving, hence ``max_step``. Measured: BENCHMARKS.md
    (bench/pruner_replay.py).

    Example:
        >>> import optuna
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study(pruner=BehindBestPruner(min_step=10, min_trials=1))
        >>> done = study.ask()
        >>> done.report(1.0, 10)
        >>> _ = study.tell(done, 1.0)
        >>> trial = study.ask()
        >>> trial.report(1.6, 10)  # above 1.5 x 1.0 at the same step
        >>> trial.should_prune()
        True
    """

    def __init__(self, min_step: int, max_step: int | None = None, factor: float = BEHIND_FACTOR,
                 min_trials: int = 3) -> None:
        if min_step < 0 or (max_step is not None and max_step < 0):
            raise ValueError(f"min_step ({min_step}) and max_step ({max_step}) must be 0 or more")
        if not factor > 0:
            raise ValueError(f"factor must be above 0, got {factor}")
        if min_trials < 1:
            raise ValueError(f"min_trials must be 1 or more, got {min_trials}")
        self.min_step, self.max_step, self.factor, self.min_trials = min_step, max_step, factor, min_trials

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.min_step or (self.max_step is not None and step > self.max_step):
            return False
        value = trial.intermediate_values[step]
        if not math.isfinite(value):
            return False  # a divergence is the search's to report, not the pruner's
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        trials = study.get_trials(deepcopy=False, states=finished)
        others = [v for t in trials if (v := t.intermediate_values.get(step)) is not None and math.isfinite(v)]
        if len(others) < self.min_trials or value <= self.factor * min(others):
            return False
        return not self.cuts_a_winner(trials, step, self.factor * min(others))

    def cuts_a_winner(self, trials: list[optuna.trial.FrozenTrial], step: int, bar: float) -> bool:
        """Whether a finished trial above ``bar`` at ``step`` ended among the best (so the rule would be
        wrong at this step in this study): never here; :class:`FirstSeedPruner` checks."""
        return False


class FirstSeedPruner(BehindBestPruner):
    """Run a trial's first seed alone; its other seeds run only if that seed kept up.

    While the first seed trains (the trial's reported values are that seed's), it is stopped above
    ``factor`` x the lowest loss a finished trial's first seed had at the same step, between
    ``min_step`` and ``max_step`` (:class:`BehindBestPruner`), unless a trial that ran to the end was
    as far behind at that step and still ended within ``val_factor`` x the best validation loss
    (:meth:`cuts_a_winner`: the study itself shows that the rule is wrong there, as on a model that
    learns in a jump at a step that varies). When it ends, the search asks the
    pruner's :meth:`seed_policy` (``tuner.driver.seeding.FirstSeed``) whether the other seeds run:
    not when the first seed's validation loss is above ``val_factor`` x the best validation loss of
    a trial that survived all its seeds.

    Why it is the default: one seed's final validation loss ranks another seed's better than any
    reading part of the way in does, and a trial stopped after its first seed saves that seed's
    siblings whole; in real launches it trained markedly fewer search steps than no pruner with
    exports as good (BENCHMARKS.md; bench/pruner_signals.py, bench/robustness.py).

    Example:
        >>> pruner = FirstSeedPruner(min_step=10, max_step=50)
        >>> pruner.seed_policy().first((7, 9))  # seed 9 runs only if seed 7 keeps up
        (7,)
        >>> FirstSeedPruner(min_step=10, val_factor=0)
        Traceback (most recent call last):
        ...
        ValueError: val_factor must be above 0, got 0
    """

    def __init__(self, min_step: int, max_step: int | None = None, factor: float = FIRST_SEED_FACTOR,
                 val_factor: float = FIRST_SEED_VAL_FACTOR, min_trials: int = 3) -> None:
        super().__init__(min_step, max_step, factor, min_trials)
        if not val_factor > 0:
            raise ValueError(f"val_factor must be above 0, got {val_factor}")
        self.val_factor = val_factor

    def seed_policy(self) -> FirstSeed:
        """Which of a trial's seeds run, and when (``tuner.driver.seeding``)."""
        return FirstSeed(self.val_factor, self.min_trials)

    def cuts_a_winner(self, trials: list[optuna.trial.FrozenTrial], step: int, bar: float) -> bool:
        """Whether a trial of this study that ran to the end (COMPLETE) was above ``bar`` at ``step`` and
        still ended within ``val_factor`` x the best validation loss: then a loss this far behind at this
        step is no sign of a worse trial here (a model that learns in a jump, at a step that varies),
        and the training-loss rule stops nothing at this step."""
        ended = [(float(t.value), t.intermediate_values.get(step)) for t in trials
                 if t.state is optuna.trial.TrialState.COMPLETE and t.value is not None]
        if not ended:
            return False
        near_best = self.val_factor * min(value for value, _ in ended)
        return any(value <= near_best and at is not None and math.isfinite(at) and at > bar for value, at in ended)


@dataclass(frozen=True)
class Pruning:
    """One ``--pruner`` name: how to make it for trials of ``steps`` steps, from which step it may stop
    a trial (0: never), why it stopped one at a step (for the trial's reason), and its help."""

    make: Callable[[int], optuna.pruners.BasePruner]
    start: Callable[[int], int]
    reason: Callable[[optuna.pruners.BasePruner, int], str]
    help: str
    kind: type[optuna.pruners.BasePruner]


def _never(steps: int) -> int:
    return 0


def _behind_reason(pruner: optuna.pruners.BasePruner, step: int) -> str:
    factor = pruner.factor if isinstance(pruner, BehindBestPruner) else BEHIND_FACTOR
    return f"at step {step} its loss was more than {factor:g}x the lowest loss a finished trial had at that step"


def _first_seed_reason(pruner: optuna.pruners.BasePruner, step: int) -> str:
    factor = pruner.factor if isinstance(pruner, BehindBestPruner) else FIRST_SEED_FACTOR
    return (f"at step {step} its first seed's loss was more than {factor:g}x the lowest loss a finished "
            "trial's first seed had at that step; its other seeds were not run")


def _median_reason(pruner: optuna.pruners.BasePruner, step: int) -> str:
    return f"at step {step} its loss was behind the median of the completed trials"


def _asha_reason(pruner: optuna.pruners.BasePruner, step: int) -> str:
    return f"at step {step} its loss was not in the best third of the trials that reached that step"


PRUNERS: dict[PrunerName, Pruning] = {  # in the order ``--pruner`` lists them
    "none": Pruning(lambda steps: optuna.pruners.NopPruner(), _never, _median_reason, "",  # it never stops one
                    optuna.pruners.NopPruner),
    "behind": Pruning(
        lambda steps: BehindBestPruner(prune_start("behind", steps), max_step=steps // 2),
        lambda steps: max(1, steps // 4), _behind_reason,
        f"above {BEHIND_FACTOR:g}x the lowest loss a finished trial had at the same step, from a quarter to half "
        "the steps", BehindBestPruner),
    "first-seed": Pruning(
        lambda steps: FirstSeedPruner(prune_start("first-seed", steps), max_step=steps // 2),
        lambda steps: max(1, steps // 6), _first_seed_reason,
        f"a trial's first seed runs alone, stopped above {FIRST_SEED_FACTOR:g}x the lowest loss a finished trial's "
        "first seed had at the same step, from a sixth to half the steps, unless a trial as far behind there "
        "ended near the best; its other seeds run only if its "
        f"validation loss is within {FIRST_SEED_VAL_FACTOR:g}x the best trial's", FirstSeedPruner),
    "median": Pruning(
        lambda steps: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0),
        lambda steps: steps // 2, _median_reason,
        "behind the completed trials' median, from half its steps on", optuna.pruners.MedianPruner),
    "asha": Pruning(
        lambda steps: optuna.pruners.SuccessiveHalvingPruner(
            min_resource=prune_start("asha", steps), reduction_factor=ASHA_REDUCTION, min_early_stopping_rate=0),
        lambda steps: max(1, steps // 4), _asha_reason,
        "successive halving: only the best third goes on at a quarter of the steps, and again at 3x that",
        optuna.pruners.SuccessiveHalvingPruner),
}
NAMES: tuple[PrunerName, ...] = typing.get_args(PrunerName)
if tuple(PRUNERS) != NAMES:
    raise ImportError(f"tuner.driver.pruning.PRUNERS has {tuple(PRUNERS)}, tuner.config.PrunerName {NAMES}: "
                      "give each name one entry, in the same order")


def lookup(kind: str) -> Pruning:
    """The registry's entry for ``kind``; ValueError naming the valid names for an unknown one."""
    if kind not in PRUNERS:
        raise ValueError(f"unknown pruner {kind!r}; valid: {', '.join(NAMES)}")
    return PRUNERS[typing.cast(PrunerName, kind)]


def prune_start(kind: str, steps: int) -> int:
    """The first step at which ``kind`` may stop a finite trial (0: never): half the steps for
    ``median``, a quarter for ``behind`` and ``asha`` (its first rung; the next ones at 3x and 9x
    that step), a sixth for ``first-seed``."""
    return PRUNERS[typing.cast(PrunerName, kind)].start(steps) if kind in PRUNERS else 0


def prune_end(pruner: optuna.pruners.BasePruner) -> int:
    """The last step at which ``pruner`` may stop a trial (0: any): past it the search neither writes
    a trial's values for the pruner nor asks it (a write and a read of the study per record)."""
    return (pruner.max_step or 0) if isinstance(pruner, BehindBestPruner) else 0


def make_pruner(kind: str, steps: int = 0) -> optuna.pruners.BasePruner:
    """The study's pruner for trials of ``steps`` steps (see :data:`PRUNERS`; an unknown name: none)."""
    return PRUNERS[typing.cast(PrunerName, kind)].make(steps) if kind in PRUNERS else optuna.pruners.NopPruner()


def stop_reason(pruner: optuna.pruners.BasePruner, step: int) -> str:
    """Why ``pruner`` stopped a finite trial at ``step``, in words (its most specific registered class's)."""
    for cls in type(pruner).__mro__:
        entry = next((e for e in PRUNERS.values() if e.kind is cls), None)
        if entry is not None:
            return entry.reason(pruner, step)
    return _median_reason(pruner, step)


def help_text() -> str:
    """The ``--pruner`` help: each pruner's rule, the default first (``none`` is not described)."""
    default = LaunchConfig.model_fields["pruner"].default
    names = [default, *(n for n in NAMES if n not in (default, "none"))]
    rules = [f"{name} ({PRUNERS[typing.cast(PrunerName, name)].help})" for name in names]
    return (f"stop a finite trial that is behind, never counted as diverged: {', '.join(rules[:-1])} or {rules[-1]} "
            f"(default {default})")
