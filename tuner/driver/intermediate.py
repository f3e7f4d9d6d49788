"""Optuna intermediate values written in batches: many trials' steps in one storage transaction.

``Trial.report`` is one storage transaction per value: on a large cluster that costs the driver
more than it has (BENCHMARKS.md, "A driver for a large cluster"; bench/driver_rate.py). (The other
cost, Optuna's cache reading every running trial afresh several times per ``ask``, is gone: the
driver's storage keeps its own running trials in memory, :func:`tuner.hooks.driver_storage`.)

So the search keeps the values here. A running trial's latest value is written at once and then
at most every ``every`` seconds (its progress shows in Optuna's storage); all of its values are
written at the trial's end (before it is told; the driver's storage writes them in the transaction
that ends it, :func:`tuner.hooks.hold_intermediate_values`). The pruner reads a running trial's values from
the trial's own copy and only finished trials' from the storage, so it gets them in that copy
(:meth:`Reports.show`), without a write per record it decides on. The values Optuna holds at the
end are the same as with ``report``; TPE and the pruners read only finished trials' values, and
the pruned trial's own. A trial stopped
mid-run (Ctrl-C: told FAIL and queued again) keeps the values written so far. A diverged trial's
values from its divergence step on, written while an earlier seed ran past it, are taken back
before its NaN is reported at that step (:meth:`Reports.retract`).

On an RDB storage (``RDBStorage``, also under Optuna's cache) the batch is one transaction that
inserts the rows Optuna's own ``report`` would (:func:`tuner.hooks.insert_intermediate_values`:
Optuna's RDB models, 5.x); any other storage, or an Optuna whose internals differ, gets
``Trial.report`` per value. As with ``report``, a step already reported keeps its first value, and
a trial finished meanwhile (failed as stale by another launch) gets nothing. The values written in
a batch are also put in the ``Trial``'s own copy of itself, as ``report`` does: ``should_prune``
reads the trial from there, and without them every pruner sees no step and stops nothing
(tests/test_hooks.py fails when that hook stops working).
"""

from __future__ import annotations

import logging
import time

import optuna

from tuner import hooks

log = logging.getLogger(__name__)


class Reports:
    """Intermediate values waiting to be written (see the module docs).

    Args:
        every: seconds between two writes of a running trial's latest value.
    """

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._pending: dict[int, tuple[optuna.trial.Trial, dict[int, float]]] = {}  # number -> (trial, step -> value)
        self._shown: dict[int, float] = {}  # trial number -> when its latest value was last written
        self._last = 0.0

    def add(self, trial: optuna.trial.Trial, step: int, value: float) -> None:
        """Keep ``value`` as the trial's intermediate value at ``step`` (the first one given wins)."""
        self._pending.setdefault(trial.number, (trial, {}))[1].setdefault(step, float(value))

    def flush_due(self) -> None:
        """At most once a second: write the latest value of each trial not shown for ``every`` seconds."""
        now = time.monotonic()
        if now - self._last < 1.0:
            return
        self._last = now
        due = {}
        for number, (trial, values) in self._pending.items():
            if now - self._shown.get(number, -self.every) >= self.every:
                step = max(values)
                due[number] = (trial, {step: values.pop(step)})
                self._shown[number] = now
        self._pending = {number: item for number, item in self._pending.items() if item[1]}
        self._write(due)

    def flush(self, trial: optuna.trial.Trial | None = None) -> None:
        """Write every value kept of ``trial`` (None: of every trial), in one transaction where the
        storage allows it; a driver storage holds one trial's, to write them with the trial's next
        write (:func:`tuner.hooks.hold_intermediate_values`: the search flushes a trial at its end)."""
        if trial is None:
            pending, self._pending, self._shown = self._pending, {}, {}
        else:
            item = self._pending.pop(trial.number, None)
            self._shown.pop(trial.number, None)
            if item and hooks.hold_intermediate_values(trial, item[1]):
                return  # the driver's storage writes them with the trial's next write (its end)
            pending = {trial.number: item} if item else {}
        self._write(pending)

    def show(self, trial: optuna.trial.Trial) -> None:
        """Put every value kept of ``trial`` in its own copy (:func:`tuner.hooks.cached_trial`), which
        ``Trial.should_prune`` hands the pruner, without writing them yet (they go with the next
        batch); where they would not be batched (``Trial.report`` skips a step the copy holds), write
        them now (:meth:`flush`)."""
        item = self._pending.get(trial.number)
        if item is None:
            return
        own = hooks.cached_trial(trial)
        if own is None or not hooks.batches_values(trial):
            self.flush(trial)
            return
        for step, value in item[1].items():
            own.intermediate_values.setdefault(step, value)

    def retract(self, trial: optuna.trial.Trial, step: int) -> int | None:
        """Write ``trial``'s values before ``step`` and take back those from ``step`` on.

        A diverged trial ends with NaN at its divergence step (tuner.driver.search), but a seed run
        after its first ones (the deferred seeds of ``--pruner first-seed``, a race seed) may diverge
        before a step the first ones reported. Optuna has no call that removes a value: they are
        deleted from the storage and the trial's own copy
        (:func:`tuner.hooks.delete_intermediate_values_from`). Returns the last step from ``step`` on
        still held where a storage could not take them back (None: none is left).
        """
        item = self._pending.get(trial.number)
        if item is not None:
            for gone in [s for s in item[1] if s >= step]:
                del item[1][gone]
        self.flush(trial)
        own = hooks.cached_trial(trial)
        if own is None:
            return None
        late = [s for s in own.intermediate_values if s >= step]
        if not late or hooks.delete_intermediate_values_from(trial, step):
            return None
        return max(late)

    def _write(self, pending: dict[int, tuple[optuna.trial.Trial, dict[int, float]]]) -> None:
        if not pending or hooks.insert_intermediate_values(list(pending.values())):
            return
        for trial, values in pending.values():
            own = hooks.cached_trial(trial)
            for step, value in values.items():
                try:
                    if own is not None and step in own.intermediate_values:  # shown (show): report would skip it
                        hooks.write_intermediate_value(trial, step, value)
                    else:
                        trial.report(value, step)
                except optuna.exceptions.UpdateFinishedTrialError:
                    break  # failed as stale by another launch; the search says so when it ends
