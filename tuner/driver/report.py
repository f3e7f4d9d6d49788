"""``tuner report``: a study's trials and stability plots, from its stores alone (no training).

The Optuna storage holds every trial's :class:`~tuner.driver.trialrecord.TrialRecord` (config, status,
how each seed ended, the earliest divergence and the op the forensics named, validation loss,
race seeds, whether it learned); the study's own attrs (``tuner.driver.studyrecord``) add the
verifications on fresh seeds, the chosen trial with its selection rule, and its learning-rate
margin. The MLflow store (the same default as launch: ``$MLFLOW_TRACKING_URI``, else
``sqlite:///mlflow.db``, when that file exists) names the cause of divergences an older study's
record lacks, and the plots are attached to the study's latest launch run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from tuner.config import redact
from tuner.driver import mlflow_runs, studyrecord, trialrecord
from tuner.driver.evidence import MARGIN_FACTORS, Margin
from tuner.driver.plots import write_plots
from tuner.driver.trialrecord import TrialRecord, diverged_line, varying
from tuner.driver.views import trials_table
from tuner.errors import ConfigError, TrackingError

DEFAULT_TRACKING = "sqlite:///mlflow.db"


def run_report(args: argparse.Namespace) -> int:
    """Print the table of ``args.study`` and write its plots into ``args.out_dir``."""
    console = Console(width=None if Console().is_terminal else 120)
    args.study = args.study or study_name(getattr(args, "model", None) or "iterated_mlp")
    study = load_study(args.study, args.storage)
    records = study_rows(study)
    uri = tracking_uri(args)
    causes = mlflow_causes(uri, args.study) if uri else {}
    console.print(trials_table(records, varying(records), causes))
    console.print(diverged_line(records), highlight=False)
    for line in selection_lines(study):
        console.print(line, highlight=False, markup=False)
    paths = write_plots(records, args.out_dir, prefix=f"{args.study}_", log_knobs=trialrecord.log_knobs(study))
    if uri:
        try:
            attach_plots(uri, args.study, paths)
        except TrackingError as exc:
            if args.tracking_uri:
                raise
            console.print(f"plots not attached: {exc}", highlight=False, markup=False)  # the default store
    console.print("plots: " + ", ".join(str(p) for p in paths), highlight=False)
    return 0


def tracking_uri(args: argparse.Namespace) -> str | None:
    """``--tracking-uri``, else launch's default (``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``
    if that file exists); None with ``--no-tracking`` or no store to read."""
    if getattr(args, "no_tracking", False):
        return None
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None
    return uri


def study_name(model: str) -> str:
    """The default study name of ``model``, as launch names it (tuner.config.LaunchConfig.study_name)."""
    from tuner.config import LaunchConfig

    return LaunchConfig.model_construct(model=model).study_name


def load_study(name: str, storage: str) -> Any:
    """The study ``name`` in ``storage``, never creating either.

    Raises:
        ConfigError: the storage or the study does not exist.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"--storage {redact(storage)}: no such database file")
    try:
        names = optuna.study.get_all_study_names(storage=storage)
    except Exception as exc:  # a bad URL or an unreachable server
        raise ConfigError(f"--storage {redact(storage)}: cannot open the Optuna storage: {exc}") from exc
    if name not in names:
        raise ConfigError(f"--study {name!r}: no such study in {redact(storage)}; studies there: {sorted(names)}")
    return optuna.load_study(study_name=name, storage=storage)


def study_rows(study: Any) -> list[TrialRecord]:
    """The study's recorded trials in trial order, with their verifications and choice."""
    return trialrecord.study_records(study)


def mlflow_causes(uri: str, experiment: str) -> dict[int, str]:
    """Trial number -> the divergence cause its own run's tags name (the trial's run, found by its
    tags: tuner.driver.mlflow_runs; not a verification run of its config, which has a cause of its own)."""
    client = mlflow_runs.client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return {}
    runs = mlflow_runs.own_runs(mlflow_runs.all_runs(client, found.experiment_id))
    causes = {number: cause_text(run.data.tags) for number, run in runs.items()}
    return {number: cause for number, cause in causes.items() if cause}


def cause_text(tags: Mapping[str, str]) -> str:
    """One phrase from a trial run's forensics tags ("" without them)."""
    if tags.get("divergence_cause") == "data":
        return f"data: non-finite sample(s) {tags.get('bad_samples', '?')}"
    op = tags.get("first_nonfinite_op")
    if op is None:
        return tags.get("forensics_note", "")
    where = [tags.get("first_nonfinite_kind", "")]
    if "first_nonfinite_iteration" in tags:
        where.append(f"iteration {tags['first_nonfinite_iteration']}")
    return f"{op} ({', '.join(w for w in where if w)})"


def selection_lines(study: Any) -> list[str]:
    """The selection rule that chose the exported trial, and that trial's learning-rate margin."""
    chosen = studyrecord.choice(study)
    if chosen is None:
        return []
    lines = [f"chosen (*): trial {chosen.trial}, by the rule: {chosen.rule}"]
    margin = studyrecord.margins(study).get(chosen.trial)
    if margin is not None:
        lines.append(margin_line(chosen.trial, margin))
    return lines


def margin_line(trial: int, margin: Margin) -> str:
    """``trial 5 survives up to 3x its learning rate; LR sensitivity (Wortsman et al.) ...``."""
    if margin.lr_factor > 1.0:
        line = f"trial {trial} survives up to {margin.lr_factor:g}x its learning rate"
    else:
        line = f"trial {trial} does not survive {MARGIN_FACTORS[0]:g}x its learning rate"
    sensitivity = margin.lr_sensitivity
    if sensitivity is not None:
        factors = ", ".join(f"{f:g}" for f in sorted({1.0, *margin.losses}))
        line += (f"; LR sensitivity (Wortsman et al.) over lr x {factors}: {sensitivity:.3g}"
                 f" (loss at init {margin.init_val_loss:.3g})")
    return line


def attach_plots(uri: str, experiment: str, paths: Sequence[Path]) -> None:
    """Log the plots on the study's latest launch run."""
    client = mlflow_runs.client(uri)
    found = client.get_experiment_by_name(experiment)
    parents = [] if found is None else client.search_runs(
        [found.experiment_id], filter_string="tags.`tuner.role` = 'study'",
        order_by=["attributes.start_time DESC"], max_results=1,
    )
    if not parents:
        raise TrackingError(f"no launch run of study {experiment!r} in {redact(uri)} to attach the plots to")
    for path in paths:
        client.log_artifact(parents[0].info.run_id, str(path))
