"""``tuner report``: a study's trials and stability plots, from its stores alone (no training).

The Optuna storage holds every trial's config, status, steps survived per seed, divergence step
and validation loss (the user attrs ``tuner.search`` sets), how many of its seeds were raced and
whether it learned; the study's own attrs (``tuner.studyrecord``) add the verifications on fresh
seeds, the chosen trial with its selection rule, and its learning-rate margin. With
``--tracking-uri``, the MLflow store adds each divergence's cause (the first non-finite op the
forensics named), and the plots are attached to the study's latest launch run.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner import studyrecord
from tuner.config import redact
from tuner.errors import ConfigError, TrackingError
from tuner.evidence import MARGIN_FACTORS, Margin, Verification
from tuner.plots import TrialRow, write_plots


def run_report(args: argparse.Namespace) -> int:
    """Print the table of ``args.study`` and write its plots into ``args.out_dir``."""
    console = Console(width=None if Console().is_terminal else 200)
    study = load_study(args.study, args.storage)
    rows = study_rows(study)
    causes = mlflow_causes(args.tracking_uri, args.study) if args.tracking_uri else {}
    console.print(trials_table(rows, causes))
    console.print(diverged_line(rows), highlight=False)
    for line in selection_lines(study):
        console.print(line, highlight=False, markup=False)
    paths = write_plots(rows, args.out_dir, prefix=f"{args.study}_")
    if args.tracking_uri:
        attach_plots(args.tracking_uri, args.study, paths)
    console.print("plots: " + ", ".join(str(p) for p in paths), highlight=False)
    return 0


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


def study_rows(study: Any) -> list[TrialRow]:
    """The study's finished trials (those tuner recorded), in trial order, with their verifications."""
    verified = studyrecord.verifications(study)
    chosen = studyrecord.choice(study)
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        if not t.state.is_finished() or "config" not in attrs:
            continue
        rows.append(TrialRow(
            number=t.number, status=str(attrs.get("status", t.state.name.lower())), config=attrs["config"],
            steps_survived=tuple(attrs.get("steps_survived", ())), steps=int(attrs.get("steps", 0)),
            divergence_step=attrs.get("divergence_step"), diverged_on=attrs.get("diverged_on"),
            val_loss=attrs.get("val_loss"), run_id=attrs.get("mlflow_run_id"),
            raced=sum(phase == "race" for phase in attrs.get("phases", ())), learned=attrs.get("learned"),
            verification=verified.get(t.number), chosen=chosen is not None and chosen.trial == t.number,
        ))
    return rows


def mlflow_causes(uri: str, experiment: str) -> dict[str, str]:
    """Run id, and ``trial:<number>``, -> the divergence cause the run's tags name."""
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return {}
    causes = {}
    for run in client.search_runs([found.experiment_id], max_results=5000):
        cause = cause_text(run.data.tags)
        if cause:
            causes[run.info.run_id] = cause
            causes[f"trial:{run.data.tags.get('trial')}"] = cause
    return causes


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


def trials_table(rows: Sequence[TrialRow], causes: Mapping[str, str]) -> Table:
    """Config, status, seeds, steps survived, divergence cause, validation loss and verification of each trial.

    The verified column reads ``16/16 (>= 0.81)``: survived of the fresh-seed runs and the 95% lower
    bound of the survival rate; ``*`` marks the chosen (exported) trial.
    """
    table = Table(title="trials")
    for column in ("trial", "status", "seeds", "steps survived", "divergence", "val loss", "verified", "config"):
        table.add_column(column)
    shown = _varying(rows)
    for r in rows:
        divergence = ""
        if r.divergence_step is not None:
            divergence = f"step {r.divergence_step}: {r.diverged_on}"
            cause = causes.get(r.run_id or "") or causes.get(f"trial:{r.number}")
            divergence += f"; {cause}" if cause else ""
        val = "" if r.val_loss is None or not math.isfinite(r.val_loss) else f"{r.val_loss:.4g}"
        config = " ".join(f"{k}={_short(r.config.get(k))}" for k in shown)
        steps = ",".join(map(str, r.steps_survived)) + (f" / {r.steps}" if r.steps else "")
        table.add_row(str(r.number), status_text(r), seeds_text(r), steps, divergence, val, verified_text(r), config)
    return table


def status_text(row: TrialRow) -> str:
    """The trial's status; a survivor whose validation loss stayed at or above its loss at
    initialisation reads ``survived, did not learn``."""
    return "survived, did not learn" if row.status == "survived" and row.learned is False else row.status


def seeds_text(row: TrialRow) -> str:
    """How many seeds the trial ran (``8 (6 raced)`` when some were race seeds)."""
    count = str(len(row.steps_survived))
    return f"{count} ({row.raced} raced)" if row.raced else count


def verified_text(row: TrialRow) -> str:
    """``16/16 (>= 0.81)`` for a verified trial, ``*`` appended for the chosen one; "" otherwise."""
    v: Verification | None = row.verification
    text = "" if v is None else f"{v.survived}/{v.runs} (>= {v.rate_low:.2f})"
    return f"{text} *".strip() if row.chosen else text


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


def diverged_line(rows: Sequence[TrialRow]) -> str:
    """The fraction of finished trials that diverged."""
    done = [r for r in rows if r.status in ("survived", "diverged")]
    diverged = sum(r.status == "diverged" for r in done)
    stopped = sum(r.status == "stopped" for r in rows)
    share = f" ({diverged / len(done):.0%})" if done else ""
    failed = len(rows) - len(done) - stopped
    text = f"{diverged} of {len(done)} finished trials diverged{share}; {failed} failed"
    return text + (f"; {stopped} stopped early for a loss behind the median" if stopped else "")


def attach_plots(uri: str, experiment: str, paths: Sequence[Path]) -> None:
    """Log the plots on the study's latest launch run."""
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    parents = [] if found is None else client.search_runs(
        [found.experiment_id], filter_string="tags.`tuner.role` = 'study'",
        order_by=["attributes.start_time DESC"], max_results=1,
    )
    if not parents:
        raise TrackingError(f"no launch run of study {experiment!r} in {redact(uri)} to attach the plots to")
    for path in paths:
        client.log_artifact(parents[0].info.run_id, str(path))


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _varying(rows: Sequence[TrialRow]) -> list[str]:
    """learning_rate, then the knobs whose value differs between trials."""
    keys = list(rows[0].config) if rows else []
    varying = [k for k in keys if k != "learning_rate" and len({repr(r.config.get(k)) for r in rows}) > 1]
    return ["learning_rate", *varying] if "learning_rate" in keys else varying


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
