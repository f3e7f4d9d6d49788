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

Imports neither TensorFlow nor Ray at module level: the driver imports this module (the Ray hook)
and must not pay for TensorFlow; each hook imports what it uses.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

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


def stop_checks(graph: Any) -> None:
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


def set_tensor_attr(op: Any, name: str, value: Any) -> None:
    """Set the tensor attribute ``name`` of graph op ``op`` (a Const's ``value``) to array ``value``
    (check :func:`can_set_attrs` first)."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2

    getattr(op, SET_ATTR)(name, attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(value)))


def is_enqueued(trial: Any) -> bool:
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


def save_trial_note(study: Any, number: int, body: str, version: int) -> bool:
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

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    setattr(services, "ConsolePopen", OwnGroupPopen)  # noqa: B010  (a module attribute Ray reads at call time)


def tell_pruned_without_value(study: Any, number: int) -> bool:
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
