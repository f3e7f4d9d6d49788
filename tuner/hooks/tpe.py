"""Optuna's TPE internals (see :mod:`tuner.hooks`): TPE reading a long study's best trials and its
most recent ones only."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)


TPE_WINDOW = 1000  # finished trials TPE reads past its best (:func:`windowed_tpe`)
TPE_BEST = 25  # the best finished trials TPE always reads: its largest "good" group (Optuna's default gamma)
ROWS_KEPT = 10_000  # observation rows WindowedTPE keeps past twice its window before it starts anew
_windowed_tpe: list[type] = []


def windowed_tpe(window: int = TPE_WINDOW, best: int = TPE_BEST, **tpe: Any) -> optuna.samplers.TPESampler:
    """Optuna's ``TPESampler(**tpe)`` that, past ``window`` finished trials, reads only the ``best``
    best of them (in TPE's own order: complete by value, then pruned) and the ``window`` most recent,
    with every trial in flight.

    TPE splits the trials it reads into a good group of at most 25 (its default gamma) and the rest,
    and weighs the rest by age (the oldest least). With ``best`` >= 25 the good group is the one it
    would draw from the whole study; the rest is the recent ``window``. An ask then costs
    O(``window``) instead of O(study): 0.23 s at 5000 finished trials, most of it TPE's per-trial
    Python (``bench/ask_cost.py --profile``). Up to ``window`` finished trials it is TPE itself.

    Fails open: without ``_split_trials`` or ``Study._get_trials`` the sampler reads every trial.
    """
    sampler: optuna.samplers.TPESampler = _windowed_tpe_type()(window, best, **tpe)
    return sampler


def _windowed_tpe_type() -> Any:
    """``WindowedTPE``, made once (Optuna imported then)."""
    if not _windowed_tpe:
        _windowed_tpe.append(_windowed_tpe_class())
    return _windowed_tpe[0]


def _windowed_tpe_from(state: dict[str, Any]) -> Any:
    """A pickled :func:`windowed_tpe` sampler, rebuilt (its class is made once Optuna is imported, so
    pickle cannot name it: Ray Tune pickles its searcher, and the benchmarks' Tune baseline uses
    tuner's sampler)."""
    cls = _windowed_tpe_type()
    sampler = cls.__new__(cls)
    sampler.__dict__.update(state)
    return sampler


def _windowed_tpe_class() -> type:
    import numpy as np
    import optuna
    from optuna.trial import FrozenTrial, TrialState

    split: Callable[..., tuple[list[FrozenTrial], list[FrozenTrial]]] | None = None
    try:
        from optuna.samplers._tpe.sampler import _split_trials as split
    except ImportError as exc:
        log.debug("TPE reads every trial of a study (no window): %s", exc)

    finished = (TrialState.COMPLETE, TrialState.PRUNED)

    class StudyWindow:
        """The study as TPE reads it: its trials through :meth:`WindowedTPE.visible`."""

        def __init__(self, study: optuna.Study, sampler: WindowedTPE) -> None:
            self._study, self._sampler = study, sampler

        def __getattr__(self, name: str) -> Any:
            return getattr(self._study, name)

        def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[FrozenTrial]:
            trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
            return self._sampler.visible(self._study, trials)

    class WindowedTPE(optuna.samplers.TPESampler):
        def __init__(self, window: int, best: int, **tpe: Any) -> None:
            super().__init__(**tpe)
            self.window, self.best = window, best
            self._best_of: dict[tuple[int, int, bool], frozenset[int]] = {}  # (finished, last, pruned?) -> numbers
            self._rows: dict[Any, dict[int, tuple[Any, ...]]] = {}  # (study, space) -> trial -> its observation row

        def __reduce__(self) -> tuple[Any, ...]:
            return _windowed_tpe_from, (dict(self.__dict__),)

        def visible(self, study: optuna.Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
            """``trials`` as this sampler reads them: every one up to ``window`` finished, else the
            ``best`` best finished, the ``window`` most recent finished and every other one; a pruned
            one with its last intermediate value only (:meth:`_last_value_only`)."""
            done = [t for t in trials if t.state in finished]
            if len(done) > self.window and split is not None:
                done.sort(key=lambda t: t.number)
                key = (len(done), done[-1].number, any(t.state is TrialState.PRUNED for t in done))
                best = self._best_of.get(key)
                if best is None:
                    best = frozenset(t.number for t in split(study, done, self.best)[0])
                    if len(self._best_of) > 8:
                        self._best_of.clear()
                    self._best_of[key] = best
                keep = best | {t.number for t in done[-self.window:]}
                trials = [t for t in trials if t.state not in finished or t.number in keep]
            return [self._last_value_only(study, t) if t.state is TrialState.PRUNED else t for t in trials]

        def _last_value_only(self, study: optuna.Study, trial: FrozenTrial) -> FrozenTrial:
            """A pruned trial with its last intermediate value only, made once per trial: TPE reads a
            pruned trial's intermediate values for its score alone (its last step and that step's value:
            ``_get_pruned_trial_score``), and took the max over all of them, for every pruned trial, at
            every ask: 20 % of TPE's time at 500 slots (BENCHMARKS.md). A finished trial never changes."""
            kept = self.__dict__.setdefault("_last_only", {})  # (a sampler pickled before it had them)
            key = (study.study_name, trial.number)
            slim = kept.get(key)
            if slim is None:
                if len(kept) > 2 * self.window + ROWS_KEPT:
                    kept.clear()
                slim = copy.copy(trial)
                values = trial.intermediate_values
                slim.intermediate_values = dict([max(values.items())]) if values else {}
                kept[key] = slim
            return slim

        def _get_internal_repr(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            """TPE's observations (one array per parameter, over ``trials``), each trial's row
            converted once: a trial's parameters never change once set, and TPE converted every
            trial's (a running one's from a JSON attr) twice per ask: 15 % of the driver's busy time
            at 500 slots (BENCHMARKS.md). The same arrays as TPE's own."""
            if kwargs or len(args) != 3 or not hasattr(super(), "_get_params"):
                return super()._get_internal_repr(*args, **kwargs)
            trials, space, study = args
            key = (study.study_name, tuple(space.items()))
            spaces = self.__dict__.setdefault("_rows", {})  # (a sampler pickled before it had rows)
            rows = spaces.get(key)
            if rows is None or len(rows) > 2 * self.window + ROWS_KEPT:  # a new space, or many rows: anew
                if len(spaces) >= 8:
                    spaces.clear()
                rows = spaces[key] = {}
            out = []
            for trial in trials:
                row = rows.get(trial.number)
                if row is None:
                    params = self._get_params(trial, study)
                    if not space.keys() <= params.keys():
                        continue  # as TPE: a trial without every parameter is left out (and not kept)
                    row = rows[trial.number] = tuple(d.to_internal_repr(params[n]) for n, d in space.items())
                out.append(row)
            columns = list(zip(*out, strict=True)) if out else [() for _ in space]
            return {name: np.asarray(column) for name, column in zip(space, columns, strict=True)}

        def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> Any:
            return super().infer_relative_search_space(StudyWindow(study, self), trial)  # type: ignore[arg-type]

        def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: Any) -> dict[str, Any]:
            return super().sample_relative(StudyWindow(study, self), trial, search_space)  # type: ignore[arg-type]

        def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                               param_distribution: Any) -> Any:
            return super().sample_independent(StudyWindow(study, self), trial, param_name,  # type: ignore[arg-type]
                                              param_distribution)

    return WindowedTPE
