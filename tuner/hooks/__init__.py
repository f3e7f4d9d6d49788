"""tuner's uses of other libraries' private APIs, each in one place (this package) and each failing open.

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
  :func:`hold_intermediate_values` hands a trial's last values to its :func:`driver_storage`, which
  writes them with the trial's end; without it they are written as above.
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

The hooks live in modules by library: :mod:`tuner.hooks.graph` (TensorFlow), :mod:`tuner.hooks.cluster`
(Ray), :mod:`tuner.hooks.trials` (single trials in Optuna and optuna-dashboard), :mod:`tuner.hooks.storage`
(the driver storage) and :mod:`tuner.hooks.tpe` (TPE's window); every hook is named here as well.

``tests/test_layout.py`` checks that no module of tuner/ outside this package touches another
library's private API. Imports neither TensorFlow nor Ray at module level: the driver imports this
package (the Ray hook) and must not pay for TensorFlow; each hook imports what it uses.
"""

from __future__ import annotations

from tuner.hooks.cluster import loopback_node, ray_processes_in_own_group, stop_ray_monitor
from tuner.hooks.graph import (
    CHECK_EVERY,
    CREATE_OP,
    SET_ATTR,
    BuildStopped,
    can_set_attrs,
    import_without,
    set_int_attr,
    set_tensor_attr,
    stop_checks,
    stoppable_graph,
)
from tuner.hooks.storage import FRESH_S, RESYNC_S, driver_storage, flush_held, hold_intermediate_values
from tuner.hooks.tpe import TPE_BEST, TPE_WINDOW, windowed_tpe
from tuner.hooks.trials import (
    batches_values,
    cached_trial,
    delete_intermediate_values_from,
    fail_trial,
    frozen_trial,
    insert_intermediate_values,
    is_enqueued,
    record_heartbeat,
    record_heartbeats,
    save_trial_note,
    tell_pruned_without_value,
    trial_id,
    write_intermediate_value,
)

__all__ = [
    "CHECK_EVERY", "CREATE_OP", "FRESH_S", "RESYNC_S", "SET_ATTR", "TPE_BEST", "TPE_WINDOW", "BuildStopped",
    "batches_values", "cached_trial", "can_set_attrs", "delete_intermediate_values_from", "driver_storage",
    "fail_trial", "flush_held", "frozen_trial", "hold_intermediate_values", "import_without",
    "insert_intermediate_values", "is_enqueued",
    "loopback_node",
    "ray_processes_in_own_group", "record_heartbeat", "record_heartbeats", "save_trial_note", "set_int_attr",
    "set_tensor_attr", "stop_checks", "stop_ray_monitor", "stoppable_graph", "tell_pruned_without_value",
    "trial_id", "windowed_tpe", "write_intermediate_value",
]
