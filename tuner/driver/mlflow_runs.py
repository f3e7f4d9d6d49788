"""A study's trial runs in MLflow, found by their tags: how a view names a trial's MLflow run.

The search never asks the tracker anything (``tuner.driver.tracking`` only listens, as
optuna-integration's MLflowCallback does), so the record the search writes for a trial holds no
MLflow run id; records written before (``TrialRecord.run_id``) keep theirs, and it is preferred.
The experiment is named after the study, and a trial's own run is tagged with its number
(``trial``) and ``phase = search`` (no ``phase`` tag on runs from before phases existed); a race,
verification or margin run of its config carries the same ``trial`` tag and another phase. Where a
study deleted and created again under the same name left several runs of one trial number, the
latest started is the trial's.

Who asks: the launch once its search has ended (``Tracker.runs``, for best_config.yaml's
``mlflow_run_id``), a launch of a finished study (:func:`stored_runs`), and ``tuner report``
(divergence causes by trial).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner import environ

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

_PAGE = 1000
SEARCH_PHASES = (None, "search")  # the phase tag of a trial's own run (None: a run from before phases)


def client(uri: str) -> MlflowClient:
    """An MLflow client of ``uri`` that fails at once when the server does not answer (no retries,
    a 10 s timeout: MLflow's defaults retry for minutes)."""
    environ.mlflow_fail_fast()
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def all_runs(mlflow: MlflowClient, experiment_id: str) -> list[Run]:
    """Every run of the experiment, page by page."""
    runs: list[Run] = []
    token = None
    while True:
        page = mlflow.search_runs([experiment_id], max_results=_PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def own_runs(runs: Iterable[Run]) -> dict[int, Run]:
    """Trial number -> the trial's own run among ``runs`` (MLflow ``Run`` s; see the module docs)."""
    out: dict[int, Run] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        number, tags = run.data.tags.get("trial"), run.data.tags
        if number is not None and number.isdigit() and tags.get("phase") in SEARCH_PHASES:
            out[int(number)] = run
    return out


def trial_runs(mlflow: MlflowClient, experiment_id: str) -> dict[int, str]:
    """Trial number -> the id of its own run in the experiment."""
    return {number: run.info.run_id for number, run in own_runs(all_runs(mlflow, experiment_id)).items()}


def stored_runs(uri: str | None, study: str) -> dict[int, str]:
    """Trial number -> the id of its own run in the store at ``uri``, read only (a SQLite file that
    does not exist is not created); {} without a store, without the study's experiment, or when the
    store does not answer."""
    if uri is None or (uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()):
        return {}
    try:
        mlflow = client(uri)
        found = mlflow.get_experiment_by_name(study)
        return {} if found is None else trial_runs(mlflow, found.experiment_id)
    except Exception:  # a view never fails for want of a run id: best_config.yaml says null
        return {}
