"""Optuna's cache and RDB internals (see :mod:`tuner.hooks`): the driver storage, which keeps the
trials a driver runs in memory."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuner.hooks.trials import add_value_rows, cached_trial

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage, RDBStorage

log = logging.getLogger(__name__)


RESYNC_S = 30.0  # seconds between two full reads of a driver's running trials (:func:`driver_storage`)
FRESH_S = 0.5  # seconds within which a read serves the copies without asking the database (:func:`driver_storage`)
_driver_storage: list[type] = []  # the DriverStorage class, made once Optuna is imported
# what a driver storage holds for a trial: its parameters (name, internal value, distribution), its
# attributes ((a user attribute?, key) -> value), whether its first heartbeat, and intermediate values
# (step -> value)
Held = tuple[list[tuple[str, float, Any]], dict[tuple[bool, str], Any], bool, dict[int, float]]


def driver_storage(backend: RDBStorage, resync: float = RESYNC_S, fresh: float = FRESH_S) -> BaseStorage:
    """Optuna's cache over ``backend`` (``_CachedStorage``), keeping the running trials this storage
    created (or started from WAITING) in memory, for the one driver that writes them.

    Optuna's cache reads every unfinished trial back from the database at each ``get_all_trials``,
    and TPE with the constant liar calls it several times per ask (uncached, to see the trials in
    flight): an ask costs O(trials in flight) queries' worth of rows (``bench/ask_cost.py``). Here a
    trial of this driver is written through to the database and its copy in memory is updated by the
    same call, so a read fetches only the other drivers' unfinished trials and the trials created
    since the last read (its own included, once), and only if the last read is ``fresh`` seconds old
    or more: the pruner's decisions and TPE's reads, hundreds a second on a large cluster, cost no
    query between two, and another driver's trials show here at most ``fresh`` s later (the search
    counts the study's open trials once a second anyway). Every ``resync`` seconds a read is a full one, as
    Optuna's (this driver's trials too: it repairs any drift, such as a trial another launch failed
    as stale). A trial this driver creates is read back once, by the next read. A parameter whose
    distribution the study holds already is checked at once, and it and the trial's attributes are
    held and written with the trial's others in one transaction (:func:`flush_held`, or the
    storage's next read or write); a trial this driver finishes is written with what it holds (the
    intermediate values the search writes at its end too, :func:`hold_intermediate_values`), its
    state and values in one transaction, and its copy finished in memory. A state it starts (an
    enqueued trial) is read back from the database (one trial). Batched and deleted intermediate
    values (:func:`insert_intermediate_values`, :func:`delete_intermediate_values_from`) update the
    copies too. A trial the search runs takes 3 commits, 8 when each attribute, its first heartbeat and
    its last values were one (``tests/test_driver_storage.py``).

    Fails open: when Optuna's cache or its RDB internals are not where this looks
    (``optuna.storages._cached_storage``, ``RDBStorage._get_trials``), ``backend`` is returned, which
    Optuna wraps in its own cache: the same trials, each ask reading every trial in flight.
    """
    try:
        cls = _driver_storage_class()
        for name in ("_get_trials", "_create_new_trial", "_set_trial_attr_without_commit",
                     "_set_trial_value_without_commit", "check_trial_is_updatable"):
            if not callable(getattr(backend, name, None)):
                raise AttributeError(f"RDBStorage has no {name}")
    except (ImportError, AttributeError) as exc:
        log.debug("Optuna's own cache serves the driver's trials (each ask reads every trial in flight): %s", exc)
        return backend
    storage: BaseStorage = cls(backend, resync, fresh)
    return storage


def flush_held(study: optuna.Study) -> None:
    """Write the parameters and attributes a :func:`driver_storage` holds for ``study``'s trials (it
    writes them in one transaction, at its next read or write, or here: after a trial's
    suggestions). Does nothing on another storage."""
    flush = getattr(getattr(study, "_storage", None), "flush_held", None)
    if flush is not None:
        flush()


def hold_intermediate_values(trial: optuna.trial.Trial, values: Mapping[int, float]) -> bool:
    """Hand a running ``trial``'s intermediate values (step -> value) to its :func:`driver_storage`, to
    be written with the trial's next write (the search's next is its end: one transaction, one commit
    fewer), and put them in the trial's own copy (:func:`tuner.hooks.cached_trial`), as
    ``Trial.report`` does. False, with nothing held, on another storage or for a trial the storage
    does not run (the caller writes them then)."""
    hold = getattr(getattr(trial.study, "_storage", None), "hold_values", None)
    own = cached_trial(trial)
    if hold is None or own is None or not hold(trial._trial_id, values):
        return False
    for step, value in values.items():
        own.intermediate_values.setdefault(step, value)
    return True


def _driver_storage_class() -> type:
    """``DriverStorage``, a ``_CachedStorage`` that keeps its own running trials (see :func:`driver_storage`)."""
    if _driver_storage:
        return _driver_storage[0]
    import datetime
    import json
    import time

    import optuna
    from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from sqlalchemy.exc import IntegrityError

    running = optuna.trial.TrialState.RUNNING
    from optuna.trial import FrozenTrial

    class DriverStorage(_CachedStorage):
        def __init__(self, backend: RDBStorage, resync: float, fresh: float) -> None:
            super().__init__(backend)
            self._fresh = fresh
            self._read: dict[int, float] = {}  # study id -> time.monotonic() of its last read
            self._own: set[int] = set()  # ids of this driver's running trials: their copies here are current
            self._seen: dict[int, int] = {}  # study id -> the largest trial id read
            self._resync = resync
            self._synced: dict[int, float] = {}  # study id -> time.monotonic() of its last full read
            # trial id -> parameters not written yet: (name, internal value, distribution), checked against the study's
            self._params: dict[int, list[tuple[str, float, Any]]] = {}
            # trial id -> attributes not written yet: (a user attribute?, key) -> value
            self._attrs: dict[int, dict[tuple[bool, str], Any]] = {}
            self._beats: set[int] = set()  # ids of this driver's trials whose first heartbeat is held
            self._values: dict[int, dict[int, float]] = {}  # trial id -> intermediate values not written yet
            self._beaten: set[int] = set()  # ids of this driver's trials whose first heartbeat was held once

        def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
            trial_id: int = super().create_new_trial(study_id, template_trial)
            with self._lock:  # read back once, by the next read (others' trials may have smaller ids)
                study = self._studies[study_id]
                state = study.trials[self._trial_id_to_study_id_and_number[trial_id][1]].state
                if state == running:
                    self._own.add(trial_id)
                elif not state.is_finished():  # an enqueued trial (WAITING): any driver may start it
                    study.unfinished_trial_ids.add(trial_id)
            return trial_id

        def _read_trials_from_remote_storage(self, study_id: int) -> None:
            now = time.monotonic()
            full = now - self._synced.get(study_id, -float("inf")) >= self._resync
            if not full and now - self._read.get(study_id, -float("inf")) < self._fresh:
                return  # read less than `fresh` s ago: the copies serve
            self._read[study_id] = now
            if full:
                self.flush_held()  # a full read replaces this driver's copies with the database's
            with self._lock:
                study = self._studies.setdefault(study_id, _StudyInfo())
                if full:
                    self._synced[study_id] = now
                    own = {tid for tid in self._own if self._trial_id_to_study_id_and_number[tid][0] == study_id}
                    included, after = study.unfinished_trial_ids | own, study.last_finished_trial_id
                else:  # others' unfinished trials, and those created since
                    included, after = set(study.unfinished_trial_ids), self._seen.get(study_id, -1)
                trials = self._backend._get_trials(study_id, states=None, included_trial_ids=included,
                                                   trial_id_greater_than=after)
                self._add_trials_to_cache(study_id, trials)
                for trial in trials:
                    self._classify(study_id, study, trial)

        def _classify(self, study_id: int, study: _StudyInfo, trial: FrozenTrial) -> None:
            """Book ``trial``, just put in the cache: finished, this driver's, or to read again."""
            tid = trial._trial_id
            self._seen[study_id] = max(self._seen.get(study_id, -1), tid)
            if trial.state.is_finished():
                self._own.discard(tid)
                self._beaten.discard(tid)
                study.unfinished_trial_ids.discard(tid)
                study.last_finished_trial_id = max(study.last_finished_trial_id, tid)
            elif tid not in self._own:
                study.unfinished_trial_ids.add(tid)

        def _reread(self, trial_id: int, started: bool = False) -> None:
            """Read trial ``trial_id`` back after this storage changed its state (or failed to)."""
            trial = self._backend.get_trial(trial_id)
            with self._lock:
                if trial_id not in self._trial_id_to_study_id_and_number:
                    return  # never read here: the next read brings it
                study_id = self._trial_id_to_study_id_and_number[trial_id][0]
                study = self._studies[study_id]
                self._add_trials_to_cache(study_id, [trial])
                if started and trial.state == running:
                    self._own.add(trial_id)
                    study.unfinished_trial_ids.discard(trial_id)
                self._classify(study_id, study, trial)

        def flush_held(self) -> None:
            """Write what is held, all trials' in one transaction (a trial finished meanwhile, failed
            as stale by another launch, is read back instead)."""
            with self._lock:
                held = {tid: self._take(tid) for tid in {*self._params, *self._attrs, *self._beats, *self._values}}
            if not held:
                return
            try:
                self._flush(held, ignore=False)
            except IntegrityError:  # the heartbeat thread wrote a first beat meanwhile: again, without them
                self._flush({tid: (params, attrs, False, values) for tid, (params, attrs, _, values) in held.items()},
                            ignore=True)

        def _flush(self, held: Mapping[int, Held], ignore: bool) -> None:
            try:
                with _create_scoped_session(self._backend.scoped_session, ignore) as session:
                    for trial_id, writes in held.items():
                        self._write(session, self._updatable(session, trial_id), *writes)
            except optuna.exceptions.UpdateFinishedTrialError:  # one trial failed by another launch
                for trial_id, writes in held.items():
                    try:
                        with _create_scoped_session(self._backend.scoped_session, True) as session:
                            self._write(session, self._updatable(session, trial_id), *writes)
                    except optuna.exceptions.UpdateFinishedTrialError:
                        self._reread(trial_id)

        def _take(self, trial_id: int) -> Held:
            """What is held for ``trial_id``, no longer held. Under the lock."""
            beat = trial_id in self._beats
            self._beats.discard(trial_id)
            return self._params.pop(trial_id, []), self._attrs.pop(trial_id, {}), beat, self._values.pop(trial_id, {})

        def _restore(self, held: Mapping[int, Held]) -> None:
            """Hold again what a transaction that failed on a key did not write (before anything held since)."""
            with self._lock:
                for trial_id, (params, attrs, _, values) in held.items():
                    self._params[trial_id] = [*params, *self._params.get(trial_id, [])]
                    self._attrs[trial_id] = {**attrs, **self._attrs.get(trial_id, {})}
                    if values:  # a step's first value wins
                        self._values[trial_id] = {**self._values.get(trial_id, {}), **values}

        def _updatable(self, session: Any, trial_id: int) -> Any:
            """The trial's row, for update; raises ``UpdateFinishedTrialError`` if it has finished."""
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            self._backend.check_trial_is_updatable(trial_id, trial.state)  # type: ignore[arg-type]
            return trial

        def _write(self, session: Any, trial: Any, params: Sequence[tuple[str, float, Any]],
                   attrs: Mapping[tuple[bool, str], Any], beat: bool, values: Mapping[int, float]) -> None:
            """Add the held ``params`` (their distributions checked already), ``attrs``, first
            ``beat`` and intermediate ``values`` (a step the database holds keeps its value) of ``trial``."""
            if beat and session.query(models.TrialHeartbeatModel.trial_id).filter(
                    models.TrialHeartbeatModel.trial_id == trial.trial_id).first() is None:
                session.add(models.TrialHeartbeatModel(trial_id=trial.trial_id))
            session.add_all([models.TrialParamModel(trial_id=trial.trial_id, param_name=name, param_value=value,
                                                    distribution_json=optuna.distributions.distribution_to_json(d))
                             for name, value, d in params])
            for (user, key), value in attrs.items():
                kind = models.TrialUserAttributeModel if user else models.TrialSystemAttributeModel
                self._backend._set_trial_attr_without_commit(session, kind, trial.trial_id, key, value)
            add_value_rows(session, {trial.trial_id: values})

        def _through(self, trial_id: int, write: Callable[[], Any]) -> Any:
            """``write()`` to the database, after what is held; where the trial has finished already
            (another launch failed it as stale), read it back, then raise as the database did."""
            self.flush_held()
            try:
                return write()
            except optuna.exceptions.UpdateFinishedTrialError:
                self._reread(trial_id)
                raise

        def _change(self, trial_id: int, change: Callable[[FrozenTrial], None]) -> None:
            """Apply ``change`` to a copy of this driver's running trial ``trial_id`` (copy on write:
            a list a sampler holds keeps the trials it was given)."""
            with self._lock:
                if trial_id not in self._own:
                    return
                study_id, number = self._trial_id_to_study_id_and_number[trial_id]
                trial = copy.copy(self._studies[study_id].trials[number])
                change(trial)
                self._studies[study_id].trials[number] = trial

        def get_trial(self, trial_id: int) -> FrozenTrial:
            with self._lock:
                if trial_id in self._own:
                    study_id, number = self._trial_id_to_study_id_and_number[trial_id]
                    return copy.deepcopy(self._studies[study_id].trials[number])
            trial: FrozenTrial = super().get_trial(trial_id)
            return trial

        def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                            distribution: optuna.distributions.BaseDistribution) -> None:
            with self._lock:
                known = None
                if trial_id in self._own:  # a distribution this study holds already: checked here, written later
                    known = self._studies[self._trial_id_to_study_id_and_number[trial_id][0]].param_distribution.get(
                        param_name)
            if known is not None:
                optuna.distributions.check_distribution_compatibility(known, distribution)
                with self._lock:
                    self._params.setdefault(trial_id, []).append((param_name, param_value_internal, distribution))
            else:
                self._through(trial_id, lambda: super(DriverStorage, self).set_trial_param(
                    trial_id, param_name, param_value_internal, distribution))
            value = distribution.to_external_repr(param_value_internal)

            def change(t: FrozenTrial) -> None:
                t.params = {**t.params, param_name: value}
                t.distributions = {**t.distributions, param_name: distribution}

            self._change(trial_id, change)

        def set_trial_state_values(self, trial_id: int, state: optuna.trial.TrialState,
                                   values: Sequence[float] | None = None) -> bool:
            if state.is_finished() and self._finish(trial_id, state, values):
                return True
            changed: bool = self._through(
                trial_id, lambda: super(DriverStorage, self).set_trial_state_values(trial_id, state, values))
            if changed:
                self._reread(trial_id, started=state == running)
            return changed

        def _finish(self, trial_id: int, state: optuna.trial.TrialState, values: Sequence[float] | None) -> bool:
            """Finish this driver's running trial ``trial_id``: what it holds, its values and state in
            one transaction (as ``RDBStorage.set_trial_state_values``), then its copy here, as the
            database now has it. False, with nothing written, for a trial not this driver's."""
            with self._lock:
                if trial_id not in self._own:
                    return False
                params, attrs, _, reported = self._take(trial_id)  # a first beat held: none needed now
                writes = (params, attrs, False, reported)
            now = datetime.datetime.now()
            try:
                with _create_scoped_session(self._backend.scoped_session) as session:
                    trial = self._updatable(session, trial_id)
                    self._write(session, trial, *writes)
                    for objective, value in enumerate(values or ()):
                        self._backend._set_trial_value_without_commit(session, trial, objective, value)
                    trial.state, trial.datetime_complete = state, now
            except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale by another launch
                self._reread(trial_id)
                raise
            except IntegrityError:  # as Optuna's: held again, then written one by one (``_through``)
                self._restore({trial_id: writes})
                return False

            def change(t: FrozenTrial) -> None:
                t.state, t.values, t.datetime_complete = state, None if values is None else list(values), now

            self._change(trial_id, change)
            with self._lock:
                study_id, number = self._trial_id_to_study_id_and_number[trial_id]
                study = self._studies[study_id]
                self._classify(study_id, study, study.trials[number])
            return True

        def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
            self._through(trial_id, lambda: super(DriverStorage, self).set_trial_intermediate_value(
                trial_id, step, intermediate_value))
            self.held_values(trial_id, {step: intermediate_value}, replace=True)

        def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
            if not self._hold(trial_id, True, key, value):
                self._through(trial_id, lambda: super(DriverStorage, self).set_trial_user_attr(trial_id, key, value))
            self._change(trial_id, lambda t: setattr(t, "user_attrs", {**t.user_attrs, key: value}))

        def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
            if not self._hold(trial_id, False, key, value):
                self._through(trial_id, lambda: super(DriverStorage, self).set_trial_system_attr(trial_id, key, value))
            self._change(trial_id, lambda t: setattr(t, "system_attrs", {**t.system_attrs, key: value}))

        def record_heartbeat(self, trial_id: int) -> None:
            """A trial's first heartbeat is held, written with its parameters and owner tag (so that
            a trial tagged as a driver's has a heartbeat: one transaction, one commit fewer); the
            others (``tuner.hooks.record_heartbeats`` writes them in batches) go to the database."""
            with self._lock:
                if trial_id in self._own and trial_id not in self._beaten:
                    self._beaten.add(trial_id)
                    self._beats.add(trial_id)
                    return
            super().record_heartbeat(trial_id)

        def _hold(self, trial_id: int, user: bool, key: str, value: Any) -> bool:
            """Hold an attribute of this driver's running trial, to be written with its others; False
            for another trial's (written at once)."""
            json.dumps(value)  # not JSON: raised here, as the database would
            with self._lock:
                if trial_id not in self._own:
                    return False
                self._attrs.setdefault(trial_id, {})[(user, key)] = value
                return True

        def hold_values(self, trial_id: int, values: Mapping[int, float]) -> bool:
            """Hold intermediate values of this driver's running trial, to be written with its next
            write (the search's next: the trial's end), each step's first value kept, and put them in
            its copy; False for another trial (nothing held)."""
            with self._lock:
                if trial_id not in self._own:
                    return False
                held = self._values.setdefault(trial_id, {})
                for step, value in values.items():
                    held.setdefault(step, value)  # a step the database holds is skipped when written
            self.held_values(trial_id, values)
            return True

        def held_values(self, trial_id: int, values: Mapping[int, float], replace: bool = False) -> None:
            """Intermediate values written to the database without this storage, or held by it, into
            the trial's copy: a step the copy has already keeps its value unless ``replace``."""
            def change(t: FrozenTrial) -> None:
                held = t.intermediate_values
                t.intermediate_values = {**held, **{s: v for s, v in values.items() if replace or s not in held}}

            self._change(trial_id, change)

        def dropped_values_from(self, trial_id: int, step: int) -> None:
            """Intermediate values from ``step`` on were deleted from the database without this storage
            (those held from ``step`` on are dropped too)."""
            with self._lock:
                held = self._values.get(trial_id)
                if held:
                    self._values[trial_id] = {s: v for s, v in held.items() if s < step}
            self._change(trial_id, lambda t: setattr(
                t, "intermediate_values", {s: v for s, v in t.intermediate_values.items() if s < step}))

    _driver_storage.append(DriverStorage)
    return DriverStorage
