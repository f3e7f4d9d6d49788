"""What the end of a launch prints: its trials, the exported trial with its evidence, where to look.

The table is read back from the study (``tuner.driver.trialrecord.study_records``), so it marks the
incumbent (the exported trial, ``*``) and gives every other trial's reason, as ``tuner report`` does;
the counts are ``tuner.driver.counts.Counts``. The last lines are the commands, and the URLs,
that open the exported trial in the MLflow UI (only when the launch tracked) and optuna-dashboard,
with passwords masked.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tuner.config import redact
from tuner.driver.mlflow_ui import runs_url

if TYPE_CHECKING:
    import optuna

    from tuner.config import LaunchConfig


def print_summary(console: Console, study: optuna.Study, numbers: set[int], keys: list[str]) -> None:
    """The trials table of this launch's trials (read back from the study: with their verification,
    the incumbent's ``*`` and every other trial's reason), then the study's counts (a continued study's
    include its earlier launches' trials, and say so)."""
    from tuner.driver.counts import Counts
    from tuner.driver.trialrecord import study_records
    from tuner.driver.views import trials_table

    records = study_records(study)
    console.print(trials_table([r for r in records if r.number in numbers], keys))
    whole = "" if {r.number for r in records} <= numbers else "the study (earlier launches too): "
    console.print(whole + Counts.of(records).line(), highlight=False, markup=False, soft_wrap=True)


def print_best(console: Console, doc: Mapping[str, object], out: str) -> None:
    """The exported trial, its evidence, and where best_config.yaml was written, with its config."""
    from tuner.answer import BestConfig
    from tuner.driver.views import best_yaml

    answer = BestConfig.of(doc)
    lines = [f"best config: trial {answer.study.trial}, {answer.reason}"]
    margin = answer.stability.margin
    if margin:
        lines.append(f"  survives {margin.lr_factor:g}x its learning rate")
    for line in (*lines, f"written to {Path(out).resolve()}:"):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(best_yaml({"config": answer.config}), highlight=False, markup=False)


MLFLOW_UI = "http://127.0.0.1:5000"  # where ``mlflow ui`` serves by default
DASHBOARD = "http://127.0.0.1:8080"  # where ``optuna-dashboard`` serves by default (0.21)


def where_to_look(doc: Mapping[str, object], storage: str, tracking_uri: str | None, experiment_id: str | None,
                  study_id: int | None) -> list[str]:
    """The commands (and URLs) that open the exported trial in the MLflow UI (when the launch tracked)
    and in optuna-dashboard; passwords masked (tuner.config.redact)."""
    from tuner.answer import BestConfig

    study = BestConfig.of(doc).study
    trial, run = study.trial, study.mlflow_run_id
    lines = []
    if tracking_uri:
        served = tracking_uri.startswith(("http://", "https://"))  # an mlflow server: its own UI
        ui = re.sub(r"//[^/@]*@", "//", tracking_uri).rstrip("/") if served else MLFLOW_UI  # no login in a link
        lines.append("see it in MLflow:")
        if not served:
            lines.append(f"  mlflow ui --backend-store-uri {shlex.quote(redact(tracking_uri))}")
        if experiment_id is not None:
            where = f"runs/{run}" if run else "runs"
            lines.append(f"  {'then open' if not served else 'open'} {ui}/#/experiments/{experiment_id}/{where}"
                         "?workflowType=machine_learning")
            lines.append(f"  all trials: {runs_url(ui, experiment_id)}")
    lines += ["see it in optuna-dashboard:", f"  optuna-dashboard {shlex.quote(redact(storage))}"]
    if study_id is not None:
        lines.append(f"  then open {DASHBOARD}/dashboard/studies/{study_id}/trials?numbers={trial}")
    return lines


def print_where_to_look(console: Console, doc: Mapping[str, object], config: LaunchConfig,
                        experiment_id: str | None) -> None:
    """Print :func:`where_to_look` for this launch's stores."""
    uri = None if config.no_tracking else config.tracking_uri
    for line in where_to_look(doc, config.storage, uri, experiment_id, study_id(config.storage, config.study_name)):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def study_id(storage: str, name: str) -> int | None:
    """The study's id in its storage (optuna-dashboard's URLs name studies by id); None if unknown."""
    import optuna

    try:
        return int(optuna.storages.get_storage(storage).get_study_id_from_name(name))
    except Exception:  # a link is a convenience: never fail a finished launch for it
        return None


def stored_experiment(uri: str | None, study: str) -> str | None:
    """The id of the study's MLflow experiment in the store at ``uri``, read only; None if none."""
    if uri is None or (uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()):
        return None
    from tuner.driver import mlflow_runs

    try:
        found = mlflow_runs.client(uri).get_experiment_by_name(study)
    except Exception:  # a link is a convenience
        return None
    return None if found is None else str(found.experiment_id)
