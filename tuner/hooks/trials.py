"""Optuna's and optuna-dashboard's private API for single trials (see :mod:`tuner.hooks`): whether
one was enqueued, its note, PRUNED without a value, heartbeats, reading one by number, failing one
with a reason, and intermediate values written, batched and taken back."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage, RDBStorage

log = logging.getLogger(__name__)


def is_enqueued(trial: optuna.trial.Trial) -> bool:
    """Whether Optuna ``trial`` was enqueued (``study.enqueue_trial``): its params were fixed, not sampled.

    Fails open: when Optuna's storage internals cannot be read, True (the caller then treats the
    trial as one a user asked for and trains it), said at debug level.
    """
    try:
        attrs = trial.study._storage.get_trial_system_attrs(trial._trial_id)
    except AttributeError as exc:
        log.debug("cannot read trial %s's system attrs (%s): counted as enqueued", getattr(trial, "number", "?"), exc)
        return True
    return "fixed_params" in attrs




def save_trial_note(study: optuna.Study, number: int, body: str, version: int) -> bool:
    """Save ``body`` (Markdown, at most one chunk: 2045 characters) as optuna-dashboard's note of trial
    ``number`` of ``study``, at note ``version`` (1, 2, ...: the dashboard's editor refuses to save
    over a newer version); False if it could not.

    optuna-dashboard's public ``save_note`` reads every study system attr (all trials' notes) twice
    per note, so a study of n trials pays O(n^2). This writes the two system attrs its note format
    (``optuna_dashboard._note``: a version key and numbered chunks) uses for a note of one chunk,
    reading nothing. Fails open: without optuna-dashboard, or with another note format, no note
    (said at debug level).
    """
    try:
        from optuna_dashboard._note import SYSTEM_ATTR_MAX_LENGTH, note_ver_key, split_body
    except ImportError as exc:
        log.debug("no optuna-dashboard note for trial %d: %s", number, exc)
        return False
    if len(body) > SYSTEM_ATTR_MAX_LENGTH:
        log.debug("trial %d's note is longer than one chunk (%d > %d): not saved", number, len(body),
                  SYSTEM_ATTR_MAX_LENGTH)
        return False
    storage, study_id = study._storage, study._study_id
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    for key, chunk in split_body(body, trial_id).items():
        storage.set_study_system_attr(study_id, key, chunk)
    storage.set_study_system_attr(study_id, note_ver_key(trial_id), version)
    return True



def tell_pruned_without_value(study: optuna.Study, number: int) -> bool:
    """Tell trial ``number`` of ``study`` PRUNED with no value, as ``study.tell`` would but without
    copying its last intermediate value into its value; False (nothing told) if Optuna's private
    storage API is not there, so that the caller tells it through ``study.tell``.

    The sampler hears it as ``study.tell`` makes it hear (``after_trial``): TPE ranks pruned trials by
    their intermediate values alone (``_get_pruned_trial_score``), so it sees the same trial.

    Raises:
        optuna.exceptions.UpdateFinishedTrialError: the trial has finished already (failed as
            stale by another launch), as ``study.tell`` raises.
    """
    import optuna

    try:
        storage, study_id = study._storage, study._study_id
        frozen = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, number))
        trial_id = frozen._trial_id
    except AttributeError as exc:
        log.debug("trial %d told through study.tell (it keeps its last intermediate value): %s", number, exc)
        return False
    if frozen.state is not optuna.trial.TrialState.RUNNING:
        raise optuna.exceptions.UpdateFinishedTrialError(f"trial {number} has already finished")
    study.sampler.after_trial(study, frozen, optuna.trial.TrialState.PRUNED, None)
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.PRUNED, None)
    return True


def _storage_of(study: optuna.Study) -> tuple[BaseStorage, int]:
    """Optuna ``study``'s storage and its id in it (``Study._storage``, ``Study._study_id``); AttributeError
    when an Optuna keeps them elsewhere."""
    return study._storage, study._study_id


def trial_id(trial: optuna.trial.Trial | optuna.trial.FrozenTrial) -> int | None:
    """The storage's id of Optuna ``trial`` (a ``Trial`` or a ``FrozenTrial``: ``_trial_id``); None,
    said at debug level, when an Optuna keeps it elsewhere (:func:`record_heartbeat` then does nothing)."""
    try:
        return int(trial._trial_id)
    except AttributeError as exc:
        log.debug("trial %s has no storage id (%s): no heartbeat for it", getattr(trial, "number", "?"), exc)
        return None


def record_heartbeat(study: optuna.Study, trial_id: int | None) -> bool:
    """Record a heartbeat of the trial with storage id ``trial_id`` (``Study._storage.record_heartbeat``:
    Optuna records heartbeats itself only inside ``Study.optimize``); False if it could not.

    Fails open: without the storage's heartbeat (or a trial id), the trial has none, said at debug
    level. A trial without a heartbeat is never stale to ``optuna.storages.fail_stale_trials``, so a
    live launch's trials are never failed by another; a killed launch's trials stay RUNNING until a
    user fails them. An error of the storage itself (the database did not answer) is raised.
    """
    if trial_id is None:
        return False
    try:
        storage: Any = study._storage  # its heartbeat is no part of BaseStorage: RDBStorage's, under Optuna's cache
        beat = storage.record_heartbeat
    except AttributeError as exc:
        log.debug("no heartbeat for trial id %d (%s): a killed launch's trials stay RUNNING", trial_id, exc)
        return False
    beat(trial_id)
    return True


def record_heartbeats(study: optuna.Study, trial_ids: Sequence[int]) -> None:
    """Record a heartbeat of each trial in ``trial_ids``: on an RDB storage in one transaction
    (Optuna's RDB models: ``TrialHeartbeatModel``, and its session), as ``RDBStorage.record_heartbeat``
    does for one trial (a driver with 1000 trials in flight made 1000 transactions per beat).

    Fails open: elsewhere, or without those internals, one :func:`record_heartbeat` per trial. An
    error of the storage itself (the database did not answer) is raised.
    """
    import sqlalchemy.exc

    storage = getattr(study, "_storage", None)
    backend = _rdb_of(storage) if trial_ids and storage is not None else None
    if backend is not None:
        try:
            _beat_rows(backend, trial_ids)
            return
        except (ImportError, AttributeError, sqlalchemy.exc.IntegrityError) as exc:  # one bad row: each alone
            log.debug("heartbeats recorded one transaction per trial: %s", exc)
    for trial_id in trial_ids:
        record_heartbeat(study, trial_id)


def _beat_rows(backend: RDBStorage, trial_ids: Sequence[int]) -> None:
    import sqlalchemy
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    model = models.TrialHeartbeatModel
    with _create_scoped_session(backend.scoped_session, False) as session:  # an IntegrityError is raised
        now = session.execute(sqlalchemy.func.now()).scalar()
        held: dict[int, Any] = {int(row.trial_id): row for row in
                                session.query(model).filter(model.trial_id.in_(list(trial_ids))).with_for_update()}
        for trial_id in trial_ids:
            if trial_id in held:
                held[trial_id].heartbeat = now
            else:
                session.add(model(trial_id=trial_id))


def frozen_trial(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """Trial ``number`` of ``study`` (a ``FrozenTrial``), read alone from the storage.

    ``study.trials`` reads every trial of the study, so a caller that wants one trial per trial told
    pays O(n^2) over a study. Fails open: when Optuna's storage internals cannot be read, it is
    picked from ``study.get_trials`` (the same trial, read with all the others), said at debug level.
    """
    try:
        storage, study_id = _storage_of(study)
        read, find = storage.get_trial, storage.get_trial_id_from_study_id_trial_number
    except AttributeError as exc:
        log.debug("trial %d read with all the study's trials: %s", number, exc)
        return study.get_trials(deepcopy=False)[number]
    return read(find(study_id, number))


def fail_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial, attrs: Mapping[str, object] | None = None) -> bool:
    """Mark running trial ``trial`` (a ``FrozenTrial`` of ``study``) FAIL, with user ``attrs`` if
    given, straight in the storage: no sampler hears of it, as when Optuna fails a stale trial
    (``fail_stale_trials``). Returns whether the storage changed its state.

    Fails open: when Optuna's storage internals cannot be reached, it is told FAIL through
    ``study.tell`` (its sampler hears of it; no ``attrs`` are kept), said at debug level.

    Raises:
        optuna.exceptions.UpdateFinishedTrialError: the trial has finished already (told by another
            launch), as the storage raises.
    """
    import optuna

    fail = optuna.trial.TrialState.FAIL
    try:
        storage, tid = study._storage, trial._trial_id
        set_attr, set_state = storage.set_trial_user_attr, storage.set_trial_state_values
    except AttributeError as exc:
        log.debug("trial %d told FAIL through study.tell (no reason kept): %s", trial.number, exc)
        try:
            study.tell(trial.number, state=fail)
        except ValueError as finished:  # "Cannot tell a COMPLETE trial": as the storage says it
            raise optuna.exceptions.UpdateFinishedTrialError(str(finished)) from finished
        return True
    for key, value in (attrs or {}).items():
        set_attr(tid, key, value)
    return bool(set_state(tid, fail))


def cached_trial(trial: optuna.trial.Trial) -> optuna.trial.FrozenTrial | None:
    """Optuna ``trial``'s own copy of itself (``Trial._cached_frozen_trial``, a ``FrozenTrial``): what
    ``Trial.should_prune`` hands the pruner and ``Trial.report`` adds each value to; None, said at
    debug level, when an Optuna keeps none there."""
    cached = getattr(trial, "_cached_frozen_trial", None)
    if cached is None:
        log.debug("trial %s keeps no copy of itself where tuner looks for one", getattr(trial, "number", "?"))
    return cached



def _rdb_of(storage: BaseStorage) -> RDBStorage | None:
    """The ``RDBStorage`` behind Optuna ``storage`` (``_CachedStorage._backend`` wraps it), or None."""
    import optuna

    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, optuna.storages.RDBStorage) else None


def insert_intermediate_values(pending: Sequence[tuple[optuna.trial.Trial, Mapping[int, float]]]) -> bool:
    """Write the intermediate values of several running trials of one study in one transaction:
    ``pending`` holds (an Optuna ``Trial``, step -> value) pairs. False, with nothing written, where
    it cannot: the caller then reports them through ``Trial.report``, one transaction per value.

    On an ``RDBStorage`` (also under Optuna's cache) it inserts the rows ``Trial.report`` would
    (``optuna.storages._rdb.models``, Optuna 5.x), keeping a step already held (its first value
    wins, as with ``report``) and skipping a trial no longer RUNNING (failed as stale by another
    launch). Then it puts the values in each trial's own copy (:func:`cached_trial`), as ``report``
    does: ``Trial.should_prune`` hands the pruner that copy, and without the values every pruner
    sees no step and stops nothing (the case from the batching's start until 2026-12-05).

    Fails open: another storage, a trial without its own copy, or an insert that fails (a schema
    Optuna changed) gives False, the last two said at debug level.
    """
    if not pending:
        return True
    backend = _rdb_of(pending[0][0].study._storage)
    if backend is None:
        return False  # not an RDB: Trial.report is the way, nothing went wrong
    owns = [own for trial, _ in pending if (own := cached_trial(trial)) is not None]
    if len(owns) < len(pending):
        return False
    try:
        written = _insert_rows(backend, {trial._trial_id: values for trial, values in pending})
    except Exception as exc:  # a step reported twice, a schema Optuna changed: one value at a time
        log.debug("batched intermediate values failed (%s); reporting one by one", exc)
        return False
    held = getattr(pending[0][0].study._storage, "held_values", None)  # a driver_storage's copies
    if held is not None:
        for tid, inserted in written.items():
            held(tid, inserted)
    for own, (_, values) in zip(owns, pending, strict=True):
        for step, value in values.items():
            own.intermediate_values.setdefault(step, value)
    return True


def write_intermediate_value(trial: optuna.trial.Trial, step: int, value: float) -> None:
    """Write ``trial``'s value at ``step`` to its storage (``Trial._trial_id``), where ``Trial.report``
    would skip it because the trial's own copy holds the step already (put there by
    ``tuner.driver.intermediate.Reports.show`` before a batch that then failed). Fails open: without
    the id, the value is not written, said at debug level."""
    try:
        trial_id = trial._trial_id
    except AttributeError as exc:
        log.debug("trial %d's value at step %d is not written (%s)", trial.number, step, exc)
        return
    trial.storage.set_trial_intermediate_value(trial_id, step, value)


def batches_values(trial: optuna.trial.Trial) -> bool:
    """Whether :func:`insert_intermediate_values` writes ``trial``'s values (an RDB storage), so that
    values put in the trial's own copy first still reach the storage (``Trial.report`` skips a step
    its copy holds)."""
    return _rdb_of(trial.study._storage) is not None and cached_trial(trial) is not None


def _insert_rows(backend: RDBStorage, pending: Mapping[int, Mapping[int, float]]) -> dict[int, dict[int, float]]:
    """Insert the values of running trials (trial id -> step -> value) in one transaction (steps they
    already hold are kept); the values inserted, by trial id."""
    import optuna
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(backend.scoped_session, True) as session:
        running = {tid for tid, state in session.query(models.TrialModel.trial_id, models.TrialModel.state)
                   .filter(models.TrialModel.trial_id.in_(list(pending)))
                   if state == optuna.trial.TrialState.RUNNING}
        return add_value_rows(session, {tid: pending[tid] for tid in running})


def add_value_rows(session: Any, pending: Mapping[int, Mapping[int, float]]) -> dict[int, dict[int, float]]:
    """Add to an RDB ``session`` the rows of intermediate values (trial id -> step -> value) whose step
    the trial does not hold yet (its first value wins, as with ``report``); the values added, by trial id."""
    from optuna.storages._rdb import models

    value_model = models.TrialIntermediateValueModel
    pending = {tid: values for tid, values in pending.items() if values}
    if not pending:
        return {}
    first = min(min(values) for values in pending.values())
    held = set(session.query(value_model.trial_id, value_model.step)
               .filter(value_model.trial_id.in_(list(pending)), value_model.step >= first))
    written = {}
    for tid, values in pending.items():
        written[tid] = {step: value for step, value in values.items() if (tid, step) not in held}
        for step, value in written[tid].items():
            stored, kind = value_model.intermediate_value_to_stored_repr(value)
            session.add(value_model(trial_id=tid, step=step, intermediate_value=stored, intermediate_value_type=kind))
    return written


def delete_intermediate_values_from(trial: optuna.trial.Trial, step: int) -> bool:
    """Delete Optuna ``trial``'s intermediate values from ``step`` on, in its storage and in its own
    copy (:func:`cached_trial`); False, with nothing deleted, where it cannot (said at debug level).

    Optuna has no call that removes a value: on an ``RDBStorage`` the rows are deleted
    (``optuna.storages._rdb.models``, Optuna 5.x); on an ``InMemoryStorage`` its copy of the trial
    is replaced (``_lock``, ``_get_trial``, ``_set_trial``). Fails open: another storage, or an Optuna
    whose internals differ, keeps the values.
    """
    own = cached_trial(trial)
    try:
        _delete_stored(trial, step)
    except Exception as exc:  # a storage (or an Optuna) this does not know: the values stay
        log.debug("intermediate values from step %d could not be taken back (%s)", step, exc)
        return False
    if own is not None:
        for late in [s for s in own.intermediate_values if s >= step]:
            del own.intermediate_values[late]
    return True


def _delete_stored(trial: optuna.trial.Trial, step: int) -> None:
    """Delete ``trial``'s stored values from ``step`` on (RDB or in-memory storage; else raise)."""
    import optuna

    storage, tid = trial.study._storage, trial._trial_id
    backend = _rdb_of(storage)
    if backend is not None:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        value_model = models.TrialIntermediateValueModel
        with _create_scoped_session(backend.scoped_session, True) as session:
            session.query(value_model).filter(value_model.trial_id == tid,
                                              value_model.step >= step).delete(synchronize_session=False)
        dropped = getattr(storage, "dropped_values_from", None)  # a driver_storage's copies
        if dropped is not None:
            dropped(tid, step)
        return
    if isinstance(storage, optuna.storages.InMemoryStorage):
        with storage._lock:
            frozen = copy.copy(storage._get_trial(tid))
            frozen.intermediate_values = {s: v for s, v in frozen.intermediate_values.items() if s < step}
            storage._set_trial(tid, frozen)
        return
    raise TypeError(f"{type(storage).__name__} cannot take back intermediate values")
