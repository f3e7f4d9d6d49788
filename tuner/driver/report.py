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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuner import environ
from tuner.config import redact, storage_url
from tuner.driver import mlflow_runs, studyrecord, trialrecord
from tuner.driver.counts import Counts
from tuner.driver.evidence import MARGIN_FACTORS, Margin
from tuner.driver.plots import write_plots
from tuner.driver.progress import output_console
from tuner.driver.targets import check_sqlite_intact
from tuner.driver.trialrecord import TrialRecord, varying
from tuner.driver.views import trials_table
from tuner.errors import ConfigError, OutputError, TrackingError
from tuner.names import study_name_problem
from tuner.records import TrialState

if TYPE_CHECKING:
    import optuna

DEFAULT_TRACKING = "sqlite:///mlflow.db"


def run_report(args: argparse.Namespace) -> int:
    """Print the table of ``args.study`` and write its plots into ``args.out_dir``."""
    console = output_console()  # piped: whole lines, tables at 120 columns (tuner.driver.progress)
    args.study = args.study or study_name(getattr(args, "model", None) or "iterated_mlp")
    args.storage = storage_url(args.storage)  # --storage, else $TUNER_STORAGE, else launch's default
    uri = tracking_uri(args)
    check_stores(args.study, args.storage, uri)
    study = load_study(args.study, args.storage)
    if uri:
        mend_runs(uri, study, console.print)
    records = study_rows(study)
    causes = mlflow_causes(uri, args.study) if uri else {}
    console.print(trials_table(records, varying(records), causes))
    console.print(Counts.of(records).line(), highlight=False, soft_wrap=True)  # piped: one line each, unwrapped
    for line in selection_lines(study, records):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    try:
        paths = write_plots(records, args.out_dir, study=args.study, log_knobs=trialrecord.log_knobs(study))
    except OutputError as exc:
        raise OutputError(f"{exc}; the study is kept: free some space (or pass another --out-dir), then run the "
                          "same command again") from exc
    if uri:
        try:
            attach_plots(uri, args.study, paths)
        except TrackingError as exc:
            if args.tracking_uri:
                raise
            console.print(f"plots not attached: {exc}", highlight=False, markup=False)  # the default store
    console.print("plots: " + ", ".join(str(p) for p in paths), highlight=False)
    return 0


def check_stores(study: str, storage: str, uri: str | None) -> None:
    """The study's name is one the stores can hold, and SQLite stores are not damaged (read only).

    Raises:
        ConfigError: one line naming the flag, what is wrong and the fix.
    """
    problem = study_name_problem(study, tracking=uri is not None)
    if problem:
        raise ConfigError(f"--study {problem}")
    check_sqlite_intact(storage, "--storage")
    if uri:
        check_sqlite_intact(uri, "--tracking-uri")


def tracking_uri(args: argparse.Namespace) -> str | None:
    """``--tracking-uri``, else launch's default (``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``
    if that file exists); None with ``--no-tracking`` or no store to read."""
    if getattr(args, "no_tracking", False):
        return None
    uri = args.tracking_uri or environ.tracking_uri() or DEFAULT_TRACKING
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None
    return uri


def study_name(model: str) -> str:
    """The default study name of ``model``, as launch names it (tuner.config.LaunchConfig.study_name)."""
    from tuner.config import LaunchConfig

    return LaunchConfig.model_construct(model=model).study_name


def load_study(name: str, storage: str) -> optuna.Study:
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


def study_rows(study: optuna.Study) -> list[TrialRecord]:
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


def selection_lines(study: optuna.Study, records: Sequence[TrialRecord]) -> list[str]:
    """The incumbent (the exported trial) and the rule that picked it, why the lowest validation loss
    is another trial's (when it is), and the incumbent's learning-rate margin."""
    found = trialrecord.incumbent(records, studyrecord.choice(study), studyrecord.race_seeds(study))
    if found is None:
        return []
    top, rule = found
    lines = [f"exported (*): trial {top.number}, by the rule: {rule}"]
    lowest = min((r for r in records if r.value is not None and r.state is TrialState.SURVIVED),
                 key=lambda r: (r.value or 0.0, r.number), default=None)
    if lowest is not None and lowest.number != top.number:
        why = trialrecord.why_not(lowest, top, studyrecord.race_seeds(study))
        lines.append(f"lowest validation loss: trial {lowest.number}, not exported: {why}")
    margin = studyrecord.margins(study).get(top.number)
    if margin is not None:
        lines.append(margin_line(top.number, margin))
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


def mend_runs(uri: str, study: optuna.Study, say: Callable[..., None]) -> None:
    """Close the MLflow runs that stopped launches left RUNNING and log the trials the study holds and
    MLflow lacks (tuner.driver.orphans: a killed launch, a tracking store that failed); say what was
    done, or in one line why it could not be."""
    from tuner.driver import orphans
    from tuner.driver.liveness import live_drivers
    from tuner.driver.mlflow_sender import first_line

    try:
        client = mlflow_runs.client(uri)
        found = client.get_experiment_by_name(study.study_name)
        if found is None:
            return
        live = live_drivers(study)
        closed = orphans.close_orphans(client, found.experiment_id, study, live)
        logged = orphans.log_missing(client, found.experiment_id, study, live)
    except Exception as exc:  # the table and the plots come from the study alone: go on without
        say(f"MLflow at {redact(uri)}: stopped launches' runs not mended ({first_line(exc)})", highlight=False,
            markup=False)
        return
    if closed or logged:
        say(f"MLflow: closed {closed} run(s) that stopped launches left RUNNING; logged {logged} trial(s) it lacked",
            highlight=False, markup=False)


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
