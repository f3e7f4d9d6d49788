"""Optuna intermediate values written in batches: many trials' steps in one storage transaction.

``Trial.report`` is one transaction per value: about 1.9 ms of driver CPU on SQLite on this
project's machine, and a driver that hears 2000 records/s from 2-seed trials reports 1000 values
a second (bench/driver_rate.py). Worse, Optuna's storage cache reads every running trial afresh,
intermediate values included, several times per ``ask`` (TPE's constant liar and search space):
with 100 trials running, each with a hundred values, an ask took about 0.5 s.

So the search keeps the values here. A running trial's latest value is written at once and then
at most every ``every`` seconds (its progress shows in Optuna's storage); all of its values are
written when something reads them: the pruner (before it decides on that trial) and the trial's
end (before it is told). The values Optuna holds at the end are the same as with ``report``; TPE
and the pruners read only finished trials' values, and the pruned trial's own. A trial stopped
mid-run (Ctrl-C: told FAIL and queued again) keeps the values written so far. A diverged trial's
values from its divergence step on, written while an earlier seed ran past it, are taken back
before its NaN is reported at that step (:meth:`Reports.retract`).

On an RDB storage (``RDBStorage``, also under Optuna's cache) the batch is one transaction that
inserts the rows Optuna's own ``report`` would (Optuna's RDB models, 5.x); any other storage gets
``Trial.report`` per value. As with ``report``, a step already reported keeps its first value, and
a trial finished meanwhile (failed as stale by another launch) gets nothing. The values written in
a batch are also put in the ``Trial``'s own copy of itself, as ``report`` does: ``should_prune``
reads the trial from there, and without them every pruner saw no step and stopped nothing (the
case from the batching's start until 2026-12-05: ``--pruner`` did nothing on a SQLite study).
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import optuna

log = logging.getLogger(__name__)


class Reports:
    """Intermediate values waiting to be written (see the module docs).

    Args:
        every: seconds between two writes of a running trial's latest value.
    """

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._pending: dict[int, tuple[optuna.trial.Trial, dict[int, float]]] = {}  # trial id -> (trial, step -> value)
        self._shown: dict[int, float] = {}  # trial id -> when its latest value was last written
        self._last = 0.0

    def add(self, trial: optuna.trial.Trial, step: int, value: float) -> None:
        """Keep ``value`` as the trial's intermediate value at ``step`` (the first one given wins)."""
        self._pending.setdefault(trial._trial_id, (trial, {}))[1].setdefault(step, float(value))

    def flush_due(self) -> None:
        """At most once a second: write the latest value of each trial not shown for ``every`` seconds."""
        now = time.monotonic()
        if now - self._last < 1.0:
            return
        self._last = now
        due = {}
        for tid, (trial, values) in self._pending.items():
            if now - self._shown.get(tid, -self.every) >= self.every:
                step = max(values)
                due[tid] = (trial, {step: values.pop(step)})
                self._shown[tid] = now
        self._pending = {tid: item for tid, item in self._pending.items() if item[1]}
        self._write(due)

    def flush(self, trial: optuna.trial.Trial | None = None) -> None:
        """Write every value kept of ``trial`` (None: of every trial), in one transaction where the
        storage allows it."""
        if trial is None:
            pending, self._pending, self._shown = self._pending, {}, {}
        else:
            item = self._pending.pop(trial._trial_id, None)
            self._shown.pop(trial._trial_id, None)
            pending = {trial._trial_id: item} if item else {}
        self._write(pending)

    def retract(self, trial: optuna.trial.Trial, step: int) -> int | None:
        """Write ``trial``'s values before ``step`` and take back those from ``step`` on.

        A diverged trial ends with NaN at its divergence step (tuner.driver.search), but a seed run
        after its first ones (the deferred seeds of ``--pruner first-seed``, a race seed) may diverge
        before a step the first ones reported. Optuna has no call that removes a value: on an RDB
        storage the rows are deleted (Optuna's RDB models, 5.x), on the in-memory one its copy of the
        trial is replaced, and the trial's own copy loses them too. Returns the last step from
        ``step`` on still held where a storage could not take them back (None: none is left).
        """
        item = self._pending.get(trial._trial_id)
        if item is not None:
            for gone in [s for s in item[1] if s >= step]:
                del item[1][gone]
        self.flush(trial)
        cached = getattr(trial, "_cached_frozen_trial", None)
        if cached is None:
            return None
        late = [s for s in cached.intermediate_values if s >= step]
        if not late:
            return None
        try:
            _delete(trial, step)
        except Exception as exc:  # a storage (or an Optuna) this does not know: the values stay
            log.debug("intermediate values from step %d could not be taken back (%s)", step, exc)
            return max(late)
        for s in late:
            del cached.intermediate_values[s]
        return None

    def _write(self, pending: dict[int, tuple[optuna.trial.Trial, dict[int, float]]]) -> None:
        if not pending:
            return
        trial = next(iter(pending.values()))[0]
        backend = _rdb(trial.study._storage)
        # batched only where the trials' own copies can be kept in step (Optuna 5's private attribute)
        if backend is not None and all(hasattr(t, "_cached_frozen_trial") for t, _ in pending.values()):
            try:
                _insert(backend, {tid: values for tid, (_, values) in pending.items()})
            except Exception as exc:  # a step reported twice, a schema Optuna changed: one value at a time
                log.debug("batched intermediate values failed (%s); reporting one by one", exc)
            else:
                for trial, values in pending.values():
                    _seen(trial, values)
                return
        for trial, values in pending.values():
            for step, value in values.items():
                try:
                    trial.report(value, step)
                except optuna.exceptions.UpdateFinishedTrialError:
                    break  # failed as stale by another launch; the search says so when it ends


def _seen(trial: optuna.trial.Trial, values: dict[int, float]) -> None:
    """Give ``trial``'s own copy the values written past it, as ``Trial.report`` does: the pruner
    reads the trial through it (``Trial.should_prune``), and without them sees no step at all."""
    for step, value in values.items():
        trial._cached_frozen_trial.intermediate_values.setdefault(step, value)


def _delete(trial: optuna.trial.Trial, step: int) -> None:
    """Delete ``trial``'s stored values from ``step`` on (RDB or in-memory storage; else raise)."""
    storage = trial.study._storage
    backend = _rdb(storage)
    if backend is not None:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        value_model = models.TrialIntermediateValueModel
        with _create_scoped_session(backend.scoped_session, True) as session:
            session.query(value_model).filter(value_model.trial_id == trial._trial_id,
                                              value_model.step >= step).delete(synchronize_session=False)
        return
    if isinstance(storage, optuna.storages.InMemoryStorage):
        with storage._lock:
            frozen = copy.copy(storage._get_trial(trial._trial_id))
            frozen.intermediate_values = {s: v for s, v in frozen.intermediate_values.items() if s < step}
            storage._set_trial(trial._trial_id, frozen)
        return
    raise TypeError(f"{type(storage).__name__} cannot take back intermediate values")


def _rdb(storage: Any) -> Any:
    """The RDBStorage behind ``storage`` (Optuna's cache wraps it), or None."""
    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, optuna.storages.RDBStorage) else None


def _insert(backend: Any, pending: dict[int, dict[int, float]]) -> None:
    """Insert the values of running trials in one transaction (steps they already hold are kept)."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    value_model = models.TrialIntermediateValueModel
    with _create_scoped_session(backend.scoped_session, True) as session:
        ids = list(pending)
        running = {tid for tid, state in session.query(models.TrialModel.trial_id, models.TrialModel.state)
                   .filter(models.TrialModel.trial_id.in_(ids)) if state == optuna.trial.TrialState.RUNNING}
        first = min(min(values) for values in pending.values())
        held = set(session.query(value_model.trial_id, value_model.step)
                   .filter(value_model.trial_id.in_(ids), value_model.step >= first))
        rows = []
        for tid in running:
            for step, value in pending[tid].items():
                if (tid, step) not in held:
                    stored, kind = value_model.intermediate_value_to_stored_repr(value)
                    rows.append(value_model(trial_id=tid, step=step, intermediate_value=stored,
                                            intermediate_value_type=kind))
        session.add_all(rows)
