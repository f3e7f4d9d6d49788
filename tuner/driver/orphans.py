"""MLflow runs a launch could not close, and trials it could not log: closed and logged afterwards.

A launch closes its own runs. One that was killed (``kill -9``, a lost machine) or whose MLflow store
failed (a full disk, a lost permission) leaves runs RUNNING, and trials the study holds but MLflow
lacks. Two callers mend that, neither waiting for the dead launch:

- the next launch on the study (``Tracker.close_orphans``: at its start, when a stale trial is
  reaped, and when a driver stops beating, tuner.driver.liveness);
- ``tuner report``, which also logs the trials MLflow lacks (:func:`log_missing`).

A run belongs to the driver that created it (tag ``tuner.driver``); only runs of dead drivers are
touched (a driver that exited records that it is gone, so its runs are closed at once). A trial's
own run gets its trial's outcome (FINISHED, status ``survived``/``diverged``/``stopped``) when the
trial was told, else KILLED with status ``failed``; a race, verification or margin run, or a launch
run, that is still RUNNING was cut short by its driver's death: KILLED.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna
    from mlflow.tracking import MlflowClient

    from tuner.driver.trialrecord import TrialRecord

DRIVER_TAG = "tuner.driver"  # the id of the launch that created a run (tuner.driver.liveness)
STOPPED = "the launch driving it stopped"


def close_orphans(client: MlflowClient, experiment_id: str, study: optuna.Study, live: Collection[str],
                  keep: str | None = None) -> int:
    """Close the RUNNING runs of dead drivers (see the module docs); how many were closed.

    Args:
        live: ids of the drivers still beating (their runs are left alone).
        keep: a run id never to close (the caller's own launch run).
    """
    import optuna

    from tuner.driver.trialrecord import read

    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    running = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=5000)
    closed = 0
    for run in running:
        tags = run.data.tags
        if run.info.run_id == keep or tags.get(DRIVER_TAG) in live:
            continue
        number = tags.get("trial")
        trial = trials.get(int(number)) if number is not None and number.isdigit() else None
        if trial is not None and trial.state == optuna.trial.TrialState.RUNNING:
            continue  # its driver may be alive and late: closed once the trial is failed as stale
        own = number is not None and tags.get("phase") in (None, "search")
        if own and trial is not None and trial.state in (optuna.trial.TrialState.COMPLETE,
                                                         optuna.trial.TrialState.PRUNED):
            record = read(trial)
            default = "survived" if trial.state == optuna.trial.TrialState.COMPLETE else "diverged"
            client.set_tag(run.info.run_id, "status", record.state.value if record is not None else default)
            client.set_terminated(run.info.run_id, "FINISHED")
        else:
            if number is not None:
                client.set_tag(run.info.run_id, "status", "failed")
                client.set_tag(run.info.run_id, "reason", STOPPED)
            client.set_terminated(run.info.run_id, "KILLED")
        closed += 1
    return closed


def log_missing(client: MlflowClient, experiment_id: str, study: optuna.Study, live: Collection[str],
                parent: str | None = None) -> int:
    """Log a closed run for every finished trial of ``study`` that a dead driver ran and that has no
    run of its own in MLflow (its launch's store failed, or it was killed first): its params, its
    outcome as tags and its validation loss. A duplicate (never trained) gets none; a live driver's
    trial is left to its driver, whose queue may still hold its run. Returns how many were logged."""
    from tuner.driver import mlflow_runs
    from tuner.driver.trialrecord import DRIVER, DUPLICATE_OF, read

    logged = mlflow_runs.own_runs(mlflow_runs.all_runs(client, experiment_id))
    made = 0
    for trial in study.get_trials(deepcopy=False):
        if (trial.number in logged or not trial.state.is_finished() or DUPLICATE_OF in trial.user_attrs
                or trial.user_attrs.get(DRIVER) in live):
            continue
        _log_trial(client, experiment_id, trial, read(trial), parent)
        made += 1
    return made


def _log_trial(client: MlflowClient, experiment_id: str, trial: optuna.trial.FrozenTrial, record: TrialRecord | None,
               parent: str | None) -> None:
    """One closed run for a finished trial from its record (None: a failed trial's params only)."""
    from mlflow.entities import Metric, Param

    told = record is not None and trial.state.name != "FAIL"
    status = record.state.value if record is not None and told else "failed"
    tags = {"trial": str(trial.number), "phase": "search", "status": status,
            "reason": (record.reason if record is not None else "") or "logged afterwards: its launch could not log it",
            "tuner.backfilled": "true", **({"mlflow.parentRunId": parent} if parent else {})}
    run_id = client.create_run(experiment_id, tags=tags, run_name=f"trial-{trial.number}").info.run_id
    params = {**(record.config if record is not None else trial.params), "trial": trial.number}
    when = trial.datetime_complete or trial.datetime_start
    metrics = ([Metric("val_loss", record.value, int(when.timestamp() * 1000) if when else 0, 0)]
               if record is not None and record.value is not None else [])
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()], metrics=metrics)
    client.set_terminated(run_id, "FINISHED" if told else "KILLED")
