"""tuner's uses of other libraries' private APIs, each in one place and each failing open.

A private API can change in any release. Each hook here checks that what it reaches for is
there; if it is not, the hook does nothing (or falls back to the public behaviour), logs why at
debug level, and tuner goes on as if the hook did not exist, only slower:

- :func:`stoppable_graph`: TensorFlow's ``Graph._create_op_internal``, through which every op a
  Python TF API makes passes, asks a run's cancel flag while a graph is built. Without it a build
  is not stopped early: a cancelled run holds its slot until its build ends.
- :func:`set_int_attr`, :func:`set_tensor_attr` / :func:`can_set_attrs`: TensorFlow's
  ``Operation._set_attr``, to give a kept graph's random ops (and the constants seeding Keras'
  initializers) another run's seeds (``tuner.worker.seeding``). Without it a worker builds every
  run's graph afresh (``tuner.worker.graph.Graphs`` keeps none): the same results, paying each build.
- :func:`is_enqueued`: Optuna's ``Study._storage`` and ``Trial._trial_id``, to read whether a trial
  was enqueued (its ``fixed_params`` system attribute; ``Trial.system_attrs`` is gone from the
  public API). Without it every trial counts as enqueued: a resumed study trains a repeated config
  again instead of skipping it (``tuner.driver.search``).
- :func:`save_trial_note`: optuna-dashboard's note format (``optuna_dashboard._note``), to write a
  trial's note without reading every other note back first (its ``save_note`` does, per note).
  Without it, or without optuna-dashboard, trials have no note (``tuner.driver.dashboard``).
- :func:`stop_ray_monitor`: Ray's ``ray._private.worker._global_node`` and its processes, to kill
  the embedded cluster's autoscaler monitor before ``ray.shutdown``. Without it the shutdown
  takes a second longer.
- :func:`loopback_node`: Ray's ``ray._private.services.resolve_ip_for_localhost``, which
  ``ray.init`` applies to ``_node_ip_address`` and which turns 127.0.0.1 into the machine's
  external address. Kept from doing so while an embedded cluster starts, the node's address is
  127.0.0.1, and Ray's servers, agents and metrics endpoints then listen on the loopback only
  (each checks ``node_ip_address == 127.0.0.1``). Without it the embedded cluster listens on all
  interfaces, as Ray's default does (``tests/test_ports.py`` fails).
- :func:`tell_pruned_without_value`: Optuna's ``Study._storage``, ``_study_id`` and ``_trial_id``,
  to end a trial the pruner stopped as PRUNED with no value (``study.tell`` gives it its last
  intermediate value, a *training* loss, which optuna-dashboard then plots on the ``val_loss``
  axis). Without it the trial is told through ``study.tell`` and keeps that value.
- :func:`ray_processes_in_own_group`: Ray's ``ray._private.services.ConsolePopen``, to start an
  embedded cluster's processes in a process group of their own, so that SIGTERM or SIGHUP to the
  launch's process group reaches the driver alone, which cleans up. Without it the raylet dies
  at once and the driver with it (exit 134); the next launch reruns the trials after its grace period.
- :func:`insert_intermediate_values`: Optuna's RDB models and session (``optuna.storages._rdb``,
  ``_CachedStorage._backend``, ``Trial._trial_id``) to write many trials' intermediate values in one
  transaction, and ``Trial._cached_frozen_trial`` (:func:`cached_trial`, the trial's own copy, which
  ``should_prune`` hands the pruner) to put them there as ``Trial.report`` does
  (``tuner.driver.intermediate``). Without it each value is written by ``Trial.report``, one
  transaction each: the same values, slower asks and reports. (:func:`write_intermediate_value`
  writes one where ``report`` would skip it: a value the pruner was shown before a batch failed.)
- :func:`driver_storage`: Optuna's ``_CachedStorage`` (subclassed: its ``_studies``, ``_lock``, trial
  maps and ``_read_trials_from_remote_storage``) and ``RDBStorage._get_trials``, to keep the trials a
  driver runs in memory, so that an ask does not read every trial in flight back from the
  database. Without it Optuna's own cache serves them: the same trials, an ask costing
  O(trials in flight) (``bench/ask_cost.py``).
- :func:`delete_intermediate_values_from`: the same RDB models, or ``InMemoryStorage``'s ``_lock``,
  ``_get_trial`` and ``_set_trial``, to take back a diverged trial's values past its divergence step
  (Optuna has no call that removes one). Without it they stay, and the trial's NaN is reported
  after the last step held instead of at its divergence step.
- :func:`trial_id`, :func:`record_heartbeat`: ``Trial._trial_id`` and ``Study._storage.record_heartbeat``,
  the heartbeat Optuna records only inside ``Study.optimize`` (``tuner.driver.liveness``). Without it
  trials have no heartbeat: a live launch's trials are never failed, but a killed launch's stay
  RUNNING until a user fails them.
- :func:`record_heartbeats`: Optuna's RDB models (``TrialHeartbeatModel``) and session, to record
  every running trial's heartbeat in one transaction. Without them, one transaction per trial.
- :func:`frozen_trial`: ``Study._storage``, ``_study_id``, to read one trial by number without reading
  them all (optuna-dashboard's note of each told trial, the trials a stopping launch gives up).
  Without it the trial is picked from ``study.get_trials``: O(n) per trial, O(n^2) over a study.
- :func:`fail_trial`: ``Study._storage`` and ``FrozenTrial._trial_id``, to fail a trial with a reason
  without its sampler hearing of it, as Optuna fails a stale trial (``tuner.driver.liveness``).
  Without it the trial is told FAIL through ``study.tell``, with no reason kept.
- :func:`windowed_tpe`: Optuna's ``Study._get_trials`` (served to TPE through a view of the study)
  and ``optuna.samplers._tpe.sampler._split_trials``, to show TPE a long study's best trials and its
  most recent ones only, so that an ask costs O(window), not O(history). Without them TPE reads
  every trial, as Optuna's: the same search, an ask growing with the study (``bench/ask_cost.py``).
- :func:`import_without`: writes ``None`` into ``sys.modules`` for Keras' optimizers while a worker
  imports TensorFlow, whose ``__init__`` imports them eagerly and ignores their ImportError
  (``tuner.worker.actor.import_tensorflow``), so that a worker loads Keras only if a model uses it.
  Without it (a TensorFlow that no longer tolerates it) TensorFlow is imported with Keras, as it
  is by default.

``tests/test_layout.py`` checks that no other module of tuner/ touches another library's private
API. Imports neither TensorFlow nor Ray at module level: the driver imports this module (the Ray hook)
and must not pay for TensorFlow; each hook imports what it uses.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage, RDBStorage

log = logging.getLogger(__name__)

CREATE_OP = "_create_op_internal"  # the tf.Graph method every Python op creation goes through
SET_ATTR = "_set_attr"  # the tf.Operation method that sets an attribute of an op already in a graph
CHECK_EVERY = 64  # ops between two calls of a build's should_stop (~10 ms of building)


class BuildStopped(BaseException):
    """The run was cancelled while its graph was being built.

    A BaseException, like asyncio's CancelledError: model code that catches ``Exception`` around
    a layer does not swallow it.
    """


def _never() -> bool:
    return False


_stoppable: list[type] = []  # the StoppableGraph class, made once TensorFlow is imported


def _stoppable_class(graph_class: type) -> type:
    """``StoppableGraph``: a ``graph_class`` whose op creation raises :class:`BuildStopped` once
    ``should_stop()`` turns true, asked every ``CHECK_EVERY`` ops."""
    if _stoppable and _stoppable[0].__mro__[1] is graph_class:
        return _stoppable[0]

    class StoppableGraph(graph_class):
        def __init__(self, should_stop: Callable[[], bool]) -> None:
            super().__init__()
            self._should_stop = should_stop
            self._made = 0

        def stop_checks(self) -> None:
            """Stop asking ``should_stop`` (the build is over; the graph may serve later runs)."""
            self._should_stop = _never

        def _create_op_internal(self, *args: Any, **kwargs: Any) -> Any:
            self._made += 1
            if self._made % CHECK_EVERY == 0 and self._should_stop():
                raise BuildStopped(f"cancelled after {self._made} ops of the graph were built")
            return super()._create_op_internal(*args, **kwargs)

    _stoppable[:] = [StoppableGraph]
    return StoppableGraph


def stoppable_graph(should_stop: Callable[[], bool]) -> Any:
    """A new ``tf.Graph`` whose op creation raises :class:`BuildStopped` once ``should_stop()`` turns true.

    Building a graph takes 1-3 s (gradients of an unrolled model are thousands of ops), longer
    than many runs train before a sibling seed diverges: without this, a cancelled run would hold
    its slot until its build ends. Fails open: a TensorFlow without ``Graph._create_op_internal``
    gets a plain ``tf.Graph`` (a build that does not stop early), said at debug level.
    """
    import tensorflow as tf

    if not callable(getattr(tf.Graph, CREATE_OP, None)):
        log.debug("tf.Graph has no %s: graph builds will not stop early when a run is cancelled", CREATE_OP)
        return tf.Graph()
    return _stoppable_class(tf.Graph)(should_stop)


def stop_checks(graph: object) -> None:
    """Stop asking a :func:`stoppable_graph`'s ``should_stop`` (its build is over); nothing for another graph."""
    stop = getattr(graph, "stop_checks", None)
    if stop is not None:
        stop()


def can_set_attrs() -> bool:
    """Whether :func:`set_int_attr` can set an op's attributes (TensorFlow's ``Operation._set_attr``)."""
    import tensorflow as tf

    if callable(getattr(tf.Operation, SET_ATTR, None)):
        return True
    log.debug("tf.Operation has no %s: a kept graph cannot be reseeded, each run builds its own", SET_ATTR)
    return False


def set_int_attr(op: Any, name: str, value: int) -> None:
    """Set the int attribute ``name`` of graph op ``op`` (check :func:`can_set_attrs` first)."""
    from tensorflow.core.framework import attr_value_pb2

    getattr(op, SET_ATTR)(name, attr_value_pb2.AttrValue(i=value))


def set_tensor_attr(op: Any, name: str, value: object) -> None:
    """Set the tensor attribute ``name`` of graph op ``op`` (a Const's ``value``) to array ``value``
    (check :func:`can_set_attrs` first)."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2

    getattr(op, SET_ATTR)(name, attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(value)))


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


def stop_ray_monitor() -> None:
    """Kill the embedded cluster's autoscaler monitor before ``ray.shutdown``.

    ``ray.shutdown`` stops the GCS first and then sends the monitor SIGTERM, on which it tries to
    report its own end to the GCS that is gone: it takes 1 s to give up, a second added to the end
    of every launch. A local cluster has nothing to autoscale, so the monitor is killed outright.
    Ray's node internals are private: if they change, this does nothing (said at debug level) and
    the shutdown just takes that second.
    """
    import ray

    try:
        node = ray._private.worker._global_node
        kind = ray._private.ray_constants.PROCESS_TYPE_MONITOR
        monitors: list[Any] = node.all_processes.get(kind, []) if node else []
        for info in monitors:
            info.process.kill()
            info.process.wait(timeout=5)
    except Exception as exc:  # the shutdown goes on without it
        log.debug("could not stop the autoscaler monitor first: %s", exc)


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """While in this block, ``ray.init(_node_ip_address="127.0.0.1")`` keeps 127.0.0.1 as the node's address.

    ``ray.init`` passes ``_node_ip_address`` through ``services.resolve_ip_for_localhost``, which
    replaces a loopback address with the machine's external one (a node must be reachable from
    others); an embedded cluster has no other node, and on the loopback address Ray binds its
    GCS, raylet, workers, agents and metrics endpoints to 127.0.0.1. Fails open: if Ray has no
    such function, nothing is changed (said at debug level) and the cluster listens as Ray's
    default does.
    """
    import ray._private.services as services

    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if not callable(resolve):
        log.debug("ray has no services.resolve_ip_for_localhost: the embedded cluster listens on all interfaces")
        yield
        return
    setattr(services, "resolve_ip_for_localhost", _keep_loopback(resolve))  # noqa: B010 (typed as Ray's function)
    try:
        yield
    finally:
        setattr(services, "resolve_ip_for_localhost", resolve)  # noqa: B010


def _keep_loopback(resolve: Callable[[str], str]) -> Callable[[str], str]:
    def keep(host: str) -> str:
        return host if host in ("127.0.0.1", "::1", "localhost") else resolve(host)

    return keep


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


def ray_processes_in_own_group() -> None:
    """Start the processes of an embedded Ray cluster (GCS, raylet, and through it the workers and
    agents) in a process group of their own, so that a signal sent to the launch's process group
    (SIGTERM from ``kill -- -PGID``, SIGHUP from a closed terminal) reaches only the driver, which
    cleans up and then stops them. Ray blocks SIGINT in them already (a terminal's Ctrl-C); for
    SIGTERM and SIGHUP it does not, so the raylet died at once, the driver's core worker aborted
    (exit 134) and the trials stayed RUNNING. They still die with the driver (Ray's fate sharing,
    ``PR_SET_PDEATHSIG``, does not depend on the group).

    Wraps Ray's private ``ray._private.services.ConsolePopen`` (through which
    ``start_ray_process`` starts every process) to add ``process_group=0``. Fails open: without it
    a signal to the whole process group stops the launch as before this hook (exit 134, trials
    left to the next launch's grace period).
    """
    try:
        from ray._private import services

        popen = services.ConsolePopen
    except (ImportError, AttributeError) as exc:
        log.debug("Ray's processes stay in the launch's process group: %s", exc)
        return
    if getattr(popen, "_tuner_own_group", False):
        return

    class OwnGroupPopen(popen):  # type: ignore[misc, valid-type]
        _tuner_own_group = True

        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    setattr(services, "ConsolePopen", OwnGroupPopen)  # noqa: B010  (a module attribute Ray reads at call time)


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


RESYNC_S = 30.0  # seconds between two full reads of a driver's running trials (:func:`driver_storage`)
_driver_storage: list[type] = []  # the DriverStorage class, made once Optuna is imported


def driver_storage(backend: RDBStorage, resync: float = RESYNC_S) -> BaseStorage:
    """Optuna's cache over ``backend`` (``_CachedStorage``), keeping the running trials this storage
    created (or started from WAITING) in memory, for the one driver that writes them.

    Optuna's cache reads every unfinished trial back from the database at each ``get_all_trials``,
    and TPE with the constant liar calls it several times per ask (uncached, to see the trials in
    flight): an ask costs O(trials in flight) queries' worth of rows (``bench/ask_cost.py``). Here a
    trial of this driver is written through to the database and its copy in memory is updated by the
    same call, so a read fetches only the other drivers' unfinished trials and the trials created
    since the last read (its own included, once). Every ``resync`` seconds a read is a full one, as
    Optuna's (this driver's trials too: it repairs any drift, such as a trial another launch failed
    as stale). A trial this driver creates is read back once, by the next read. A state this storage
    writes is read back from the database (one trial). A parameter whose distribution the study
    holds already is checked at once and written with the trial's others in one transaction
    (:func:`flush_params`, or the storage's next read or write). Batched and deleted intermediate
    values (:func:`insert_intermediate_values`, :func:`delete_intermediate_values_from`) update the
    copies too.

    Fails open: when Optuna's cache or its RDB internals are not where this looks
    (``optuna.storages._cached_storage``, ``RDBStorage._get_trials``), ``backend`` is returned, which
    Optuna wraps in its own cache: the same trials, each ask reading every trial in flight.
    """
    try:
        cls = _driver_storage_class()
        for name in ("_get_trials", "_create_new_trial", "_set_trial_param_without_commit"):
            if not callable(getattr(backend, name, None)):
                raise AttributeError(f"RDBStorage has no {name}")
    except (ImportError, AttributeError) as exc:
        log.debug("Optuna's own cache serves the driver's trials (each ask reads every trial in flight): %s", exc)
        return backend
    storage: BaseStorage = cls(backend, resync)
    return storage


def flush_params(study: optuna.Study) -> None:
    """Write the parameters a :func:`driver_storage` holds for ``study``'s trials (it writes a trial's
    parameters in one transaction, at its next read or write, or here: after a trial's suggestions).
    Does nothing on another storage."""
    flush = getattr(getattr(study, "_storage", None), "flush_params", None)
    if flush is not None:
        flush()


def _driver_storage_class() -> type:
    """``DriverStorage``, a ``_CachedStorage`` that keeps its own running trials (see :func:`driver_storage`)."""
    if _driver_storage:
        return _driver_storage[0]
    import time

    import optuna
    from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
    from optuna.storages._rdb.storage import _create_scoped_session

    running = optuna.trial.TrialState.RUNNING
    from optuna.trial import FrozenTrial

    class DriverStorage(_CachedStorage):
        def __init__(self, backend: RDBStorage, resync: float) -> None:
            super().__init__(backend)
            self._own: set[int] = set()  # ids of this driver's running trials: their copies here are current
            self._seen: dict[int, int] = {}  # study id -> the largest trial id read
            self._resync = resync
            self._synced: dict[int, float] = {}  # study id -> time.monotonic() of its last full read
            # trial id -> parameters not written yet: (name, internal value, distribution, the study's)
            self._params: dict[int, list[tuple[str, float, Any, Any]]] = {}

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
            if full:
                self.flush_params()  # a full read replaces this driver's copies with the database's
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

        def flush_params(self) -> None:
            """Write the parameters :meth:`set_trial_param` holds, all trials' in one transaction (a
            trial finished meanwhile, failed as stale by another launch, is read back instead)."""
            with self._lock:
                held, self._params = self._params, {}
            if not held:
                return

            def write(session: Any, trial_id: int) -> None:
                for name, value, distribution, known in held[trial_id]:
                    self._backend._set_trial_param_without_commit(session, trial_id, name, value, distribution,
                                                                  known)

            try:
                with _create_scoped_session(self._backend.scoped_session, True) as session:
                    for trial_id in held:
                        write(session, trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:  # one trial failed by another launch
                for trial_id in held:
                    try:
                        with _create_scoped_session(self._backend.scoped_session, True) as session:
                            write(session, trial_id)
                    except optuna.exceptions.UpdateFinishedTrialError:
                        self._reread(trial_id)

        def _through(self, trial_id: int, write: Callable[[], Any]) -> Any:
            """``write()`` to the database, after the parameters held; where the trial has finished
            already (another launch failed it as stale), read it back, then raise as the database did."""
            self.flush_params()
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
                    self._params.setdefault(trial_id, []).append(
                        (param_name, param_value_internal, distribution, known))
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
            changed: bool = self._through(
                trial_id, lambda: super(DriverStorage, self).set_trial_state_values(trial_id, state, values))
            if changed:
                self._reread(trial_id, started=state == running)
            return changed

        def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
            self._through(trial_id, lambda: super(DriverStorage, self).set_trial_intermediate_value(
                trial_id, step, intermediate_value))
            self.held_values(trial_id, {step: intermediate_value}, replace=True)

        def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
            self._through(trial_id, lambda: super(DriverStorage, self).set_trial_user_attr(trial_id, key, value))
            self._change(trial_id, lambda t: setattr(t, "user_attrs", {**t.user_attrs, key: value}))

        def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
            self._through(trial_id, lambda: super(DriverStorage, self).set_trial_system_attr(trial_id, key, value))
            self._change(trial_id, lambda t: setattr(t, "system_attrs", {**t.system_attrs, key: value}))

        def held_values(self, trial_id: int, values: Mapping[int, float], replace: bool = False) -> None:
            """Intermediate values written to the database without this storage: a step held already
            keeps its value unless ``replace``."""
            def change(t: FrozenTrial) -> None:
                held = t.intermediate_values
                t.intermediate_values = {**held, **{s: v for s, v in values.items() if replace or s not in held}}

            self._change(trial_id, change)

        def dropped_values_from(self, trial_id: int, step: int) -> None:
            """Intermediate values from ``step`` on were deleted from the database without this storage."""
            self._change(trial_id, lambda t: setattr(
                t, "intermediate_values", {s: v for s, v in t.intermediate_values.items() if s < step}))

    _driver_storage.append(DriverStorage)
    return DriverStorage


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

    value_model = models.TrialIntermediateValueModel
    with _create_scoped_session(backend.scoped_session, True) as session:
        ids = list(pending)
        running = {tid for tid, state in session.query(models.TrialModel.trial_id, models.TrialModel.state)
                   .filter(models.TrialModel.trial_id.in_(ids)) if state == optuna.trial.TrialState.RUNNING}
        first = min(min(values) for values in pending.values())
        held = set(session.query(value_model.trial_id, value_model.step)
                   .filter(value_model.trial_id.in_(ids), value_model.step >= first))
        rows, written = [], {}
        for tid in running:
            written[tid] = {step: value for step, value in pending[tid].items() if (tid, step) not in held}
            for step, value in written[tid].items():
                stored, kind = value_model.intermediate_value_to_stored_repr(value)
                rows.append(value_model(trial_id=tid, step=step, intermediate_value=stored,
                                        intermediate_value_type=kind))
        session.add_all(rows)
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


TPE_WINDOW = 1000  # finished trials TPE reads past its best (:func:`windowed_tpe`)
TPE_BEST = 25  # the best finished trials TPE always reads: its largest "good" group (Optuna's default gamma)
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

        def __reduce__(self) -> tuple[Any, ...]:
            return _windowed_tpe_from, (dict(self.__dict__),)

        def visible(self, study: optuna.Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
            """``trials`` as this sampler reads them: every one up to ``window`` finished, else the
            ``best`` best finished, the ``window`` most recent finished and every other one."""
            done = [t for t in trials if t.state in finished]
            if len(done) <= self.window or split is None:
                return trials
            done.sort(key=lambda t: t.number)
            key = (len(done), done[-1].number, any(t.state is TrialState.PRUNED for t in done))
            best = self._best_of.get(key)
            if best is None:
                best = frozenset(t.number for t in split(study, done, self.best)[0])
                if len(self._best_of) > 8:
                    self._best_of.clear()
                self._best_of[key] = best
            keep = best | {t.number for t in done[-self.window:]}
            return [t for t in trials if t.state not in finished or t.number in keep]

        def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> Any:
            return super().infer_relative_search_space(StudyWindow(study, self), trial)  # type: ignore[arg-type]

        def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: Any) -> dict[str, Any]:
            return super().sample_relative(StudyWindow(study, self), trial, search_space)  # type: ignore[arg-type]

        def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                               param_distribution: Any) -> Any:
            return super().sample_independent(StudyWindow(study, self), trial, param_name,  # type: ignore[arg-type]
                                              param_distribution)

    return WindowedTPE


def import_without(module: str, skipped: Sequence[str], unless: str = "tensorflow") -> None:
    """Import ``module`` with the modules ``skipped`` kept from loading: while it is imported, an
    import of one of them fails at once (``None`` in ``sys.modules``), and a package that imports
    them eagerly but tolerates their absence goes on without them. Nothing is skipped once
    ``unless`` was imported (its eager imports are done).

    For :func:`tuner.worker.actor.import_tensorflow`: ``import tensorflow`` imports Keras'
    optimizers (for SavedModel registrations) and ignores their ImportError (TensorFlow's
    ``__init__``); skipped, Keras loads only when a model uses it.

    Fails open: if ``module`` raises the ImportError of a skipped module (a TensorFlow that no
    longer tolerates it), it is imported again with nothing skipped, said at debug level.
    """
    blocked = [] if unless in sys.modules else [name for name in skipped if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # makes its import fail at once
    try:
        importlib.import_module(module)
        return
    except ImportError as exc:
        if exc.name not in blocked:
            raise
        log.debug("%s needs %s: imported with nothing skipped", module, exc.name)
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    importlib.import_module(module)
