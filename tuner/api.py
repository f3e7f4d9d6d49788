"""tuner from Python: :func:`launch`, :func:`load`, :func:`verify` and the :class:`Result` they give.

The command line is a thin layer over these functions: ``python -m tuner launch --trials 8`` is
``tuner.launch(trials=8)``, with the same defaults, checks and guarantees (an option's name is its
flag's, dashes as underscores; both are the fields of ``tuner.config.LaunchConfig``, the one
definition the launch YAML is read with too). Bad input raises a :class:`tuner.TunerError` whose
message is the one line the command prints; a stop (Ctrl-C, a notebook's interrupt, SIGTERM)
raises :class:`tuner.Interrupted` once the study is left as the terminal's Ctrl-C leaves it:
trials in flight FAIL and are queued again, their MLflow runs KILLED, and the same call continues.

A model is a name (``"iterated_mlp"``), a spec (``"pkg.module:Name"``, ``"path/file.py:Name"``) or
the model class or instance itself, a class defined in a notebook cell included: it is shipped to
the workers pickled by value (``tuner.models.object_spec``).

>>> import tuner
>>> tuner.launch(trials=0)
Traceback (most recent call last):
...
tuner.errors.ConfigError: tuner.launch(): trials: Input should be greater than or equal to 1
>>> tuner.launch(trails=3)
Traceback (most recent call last):
...
tuner.errors.ConfigError: tuner.launch(): trails: Extra inputs are not permitted
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.answer import BestConfig
from tuner.errors import Interrupted, TunerError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from rich.console import Console

    from tuner.driver.evidence import Verification
    from tuner.driver.trialrecord import TrialRecord

__all__ = ["Result", "launch", "load", "verify"]


@dataclass(frozen=True)
class Result:
    """A study's answer and everything behind it, as objects.

    Attributes:
        answer: the exported config and its evidence: best_config.yaml's content, typed (None when
            no trial has finished yet).
        trials: every finished trial's record, in trial order (``TrialRecord``: state, config,
            each seed's result, verification, why it is not the answer).
        study: the Optuna study's name.
        storage: the Optuna storage URL (password masked).
        tracking_uri: the MLflow tracking URI (password masked), None when untracked.
        experiment_id: the study's MLflow experiment, None when untracked.
        out: where best_config.yaml was written (None for :func:`load`).
        log_knobs: knobs searched on a log scale (the plots draw them on log axes).
    """

    answer: BestConfig | None
    trials: list[TrialRecord]
    study: str
    storage: str
    tracking_uri: str | None = None
    experiment_id: str | None = None
    out: Path | None = None
    log_knobs: frozenset[str] = field(default_factory=frozenset)

    @property
    def config(self) -> dict[str, Any]:
        """The knob values to train with ({} when no trial has finished)."""
        return dict(self.answer.config) if self.answer else {}

    @property
    def trusted(self) -> bool:
        """Whether the evidence shows the config stable (the CLI's exit 0; else 3)."""
        return bool(self.answer and self.answer.trusted)

    @property
    def reason(self) -> str:
        """What the evidence says, in one phrase (or why there is no answer)."""
        return self.answer.reason if self.answer else "no trial has finished yet: nothing to export"

    @property
    def best(self) -> TrialRecord | None:
        """The exported trial's record (the one every view marks as chosen)."""
        number = self.answer.study.trial if self.answer else None
        return next((t for t in self.trials if t.number == number), None)

    @property
    def mlflow_run_id(self) -> str | None:
        """The exported trial's MLflow run."""
        return self.answer.study.mlflow_run_id if self.answer else None

    def trials_dataframe(self, seeds: bool = False) -> pd.DataFrame:
        """One row per trial (``seeds=True``: per seed run), as ``optuna.Study.trials_dataframe``:
        ``number``, ``state`` (survived / diverged / stopped / failed), ``value`` (validation loss),
        ``params_<knob>`` for each knob, then the evidence columns."""
        import pandas as pd

        from tuner.driver.trialrecord import SeedStatus

        rows = []
        for t in self.trials:
            params = {f"params_{k}": v for k, v in t.config.items()}
            head = {"number": t.number, "state": t.state.value, "value": t.value, **params}
            if seeds:
                for s in t.seeds:
                    rows.append({**head, "seed": s.seed, "phase": s.phase, "seed_state": s.status.value,
                                 "step": s.step, "steps_survived": s.steps_survived,
                                 "seed_value": s.val_loss, "init_value": s.init_val_loss,
                                 "diverged_on": s.diverged_on, "op": s.op, "reason": s.reason, "node": s.node})
                continue
            v = t.verification
            rows.append({**head, "learned": t.learned, "init_value": t.init_val_loss, "steps": t.steps,
                         "seeds": len(t.seeds),
                         "diverged_seeds": sum(s.status is SeedStatus.DIVERGED for s in t.seeds),
                         "steps_survived": t.weakest, "divergence_step": t.divergence_step,
                         "diverged_on": t.diverged_on, "stopped_at": t.stopped_at, "reason": t.reason or None,
                         "verified": v.text() if v else None, "verified_rate_low": v.rate_low if v else None,
                         "verified_met": v.met if v else None, "chosen": t.chosen, "why_not": t.why or None})
        return pd.DataFrame(rows)

    def plot_stability_map(self) -> Figure:
        """Where in the knobs' space trials survived, diverged or were stopped (a matplotlib Figure,
        shown inline in a notebook; ``.savefig(path)`` to keep it)."""
        from tuner.driver.plots import STABILITY_MAP, figure

        _show_figures_inline()
        return figure(STABILITY_MAP, self.trials, self.log_knobs)

    def plot_survival(self) -> Figure:
        """The share of seed runs still finite at each step, per learning-rate band (a Figure)."""
        from tuner.driver.plots import SURVIVAL, figure

        _show_figures_inline()
        return figure(SURVIVAL, self.trials, self.log_knobs)

    def __repr__(self) -> str:
        answer = f"trial {self.answer.study.trial}, {self.reason}" if self.answer else self.reason
        return f"<tuner.Result study={self.study!r} trials={len(self.trials)}: {answer}>"


def _show_figures_inline() -> None:
    """In IPython/Jupyter, register the PNG formatter for matplotlib Figures, so that a returned
    Figure shows inline without ``%matplotlib inline`` (IPython registers it only once pyplot is
    imported, and tuner never imports pyplot). Anywhere else, nothing."""
    import sys

    if "IPython" not in sys.modules:
        return
    with contextlib.suppress(Exception):  # an IPython without these hooks: the Figure is still returned
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats

        shell = get_ipython()
        if shell is not None:
            select_figure_formats(shell, {"png"})


def launch(model: object = None, *, config_file: str | Path | None = None, progress: bool = True,
           **options: object) -> Result:
    """Run a stability search, as ``python -m tuner launch`` does; return its :class:`Result`.

    Args:
        model: a built-in name, a spec, or a model class or instance (default ``iterated_mlp``).
        config_file: a launch YAML whose keys are the options' names (the options given here win).
        progress: print the launch's progress and summary (on a terminal: the live view; in a
            notebook: a line per trial); False: print nothing.
        **options: the command's flags as keywords (``trials=8``, ``steps=300``, ``storage=...``,
            ``verify_seeds=0``, ...): the fields of ``tuner.config.LaunchConfig``.

    Raises:
        TunerError: bad input (a ``ConfigError``, ``ModelError``, ...), an unreachable cluster or
            tracking server, or every trial failed (``NoTrialFinished``); the message is the CLI's line.
        Interrupted: a stop came; the study is kept and the same call continues it.
    """
    from tuner.config import load_launch
    from tuner.environ import prepare_process

    prepare_process()  # before anything imports Ray: token auth on, TF quiet
    with _one_line_errors():
        flags = {**options, "model": _model_spec(model) if model is not None else None}
        config = load_launch(flags, str(config_file) if config_file else None, where="tuner.launch()")
        _register(config.storage, config.tracking_uri)
        from tuner.driver import launch as driver

        with _quiet(driver.console, not progress):
            doc = driver.launch(config)
        uri = None if config.no_tracking else config.tracking_uri
        return _result(config.study_name, config.storage, uri, BestConfig.of(doc), Path(config.out).resolve())


def load(study: str, storage: str | None = None, tracking_uri: str | None = None) -> Result:
    """The :class:`Result` of a study in ``storage``, finished or still running, without training
    (what ``python -m tuner report`` shows).

    Args:
        study: its name.
        storage: its Optuna storage (default ``$TUNER_STORAGE``, else ``sqlite:///tuner.db``, as launch).
        tracking_uri: the MLflow store to read its run ids from (default ``$MLFLOW_TRACKING_URI``,
            else ``sqlite:///mlflow.db`` when that file exists; nothing is created).

    Raises:
        ConfigError: no such storage or study.
    """
    from tuner import environ
    from tuner.config import storage_url

    with _one_line_errors():
        storage = storage_url(storage)
        _register(storage, tracking_uri)
        uri: str | None = tracking_uri or environ.tracking_uri() or "sqlite:///mlflow.db"
        if uri and uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            uri = None
        return _result(study, storage, uri)


def verify(config: str | Path | Mapping[str, object] | BestConfig | Result, *, model: object = None,
           progress: bool = True, **options: object) -> Verification:
    """Retrain a config on fresh seeds, as ``python -m tuner verify`` does; return the evidence.

    Args:
        config: a best_config.yaml path, its mapping, a :class:`BestConfig` or a :class:`Result`.
        model: as :func:`launch`'s (default: the document's ``study.model`` when it is a built-in
            name, or the object this process gave ``tuner.launch``; else ``iterated_mlp``).
        progress: print the runs as they end and the result.
        **options: the command's flags: ``seeds`` (16), ``steps`` (2x the document's),
            ``min_survival`` (0.8), ``seed``, ``fail_fast``, ``address``, ``num_cpus``,
            ``cpus_per_trial``, ``gpus_per_trial``, ``trust_file_model`` (``tuner.config.VerifyOptions``).

    Returns:
        The ``Verification``: ``survived``/``runs``, ``rate_low`` (95% Wilson lower bound), ``met``
        (the bar reached and the config learned), ``divergences``, ``val_loss``.

    Raises:
        TunerError: bad input; Interrupted: a stop came (the runs and the embedded cluster are stopped).
    """
    from tuner.config import VerifyOptions, load_options
    from tuner.driver.progress import output_console
    from tuner.driver.verify import check_bar, read_config_file, verify_doc
    from tuner.environ import prepare_process

    prepare_process()
    with _one_line_errors():
        if isinstance(config, Result):
            if config.answer is None:
                raise TunerError(f"study {config.study!r} has no answer to verify yet")
            config = config.answer
        doc: Mapping[str, object]
        if isinstance(config, str | Path):
            where, doc = str(config), read_config_file(str(config))
        else:
            doc = config.to_dict() if isinstance(config, BestConfig) else config
            study = doc.get("study") if isinstance(doc, dict) else None
            where = (f"trial {study['trial']} of {study['name']}"
                     if isinstance(study, dict) and "trial" in study and "name" in study else "config")
            if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
                raise TunerError("tuner.verify(): expected a best_config.yaml path, its mapping (with a 'config:' "
                                 "mapping of knob values), a BestConfig or a Result")
        spec = _model_spec(model) if model is not None else _object_of(doc)
        opts = load_options(VerifyOptions, {**options, "config": where, "model": spec})
        check_bar(opts.min_survival, opts.seeds)
        console = output_console(highlight=False, quiet=not progress)
        with _stop_as_interrupted("tuner.verify"):
            return verify_doc(opts, doc, console)


def _model_spec(model: object) -> str:
    from tuner.models import object_spec

    return model if isinstance(model, str) else object_spec(model)


def _object_of(doc: Mapping[str, object]) -> str | None:
    """The document's model when it is an object this process was given (``object:Name``)."""
    from tuner.models import OBJECT_PREFIX

    study = doc.get("study")
    named = study.get("model") if isinstance(study, dict) else None
    return named if isinstance(named, str) and named.startswith(OBJECT_PREFIX) else None


def _result(study_name: str, storage: str, uri: str | None, answer: BestConfig | None = None,
            out: Path | None = None) -> Result:
    """Read the study back: its records, and (for :func:`load`) its answer as the exporter builds it."""
    from tuner.config import redact
    from tuner.driver import studyrecord, trialrecord, wrapup
    from tuner.driver.export import best_config
    from tuner.driver.mlflow_runs import stored_runs
    from tuner.driver.report import load_study

    study = load_study(study_name, storage)
    records = trialrecord.study_records(study)
    if answer is None and records:
        owner = studyrecord.owner(study) or {}
        steps = (owner.get("steps") or [0])[-1]
        with contextlib.suppress(TunerError):  # every trial failed: no answer, the records say why
            answer = BestConfig.of(best_config(study, storage, steps, owner.get("model"), stored_runs(uri, study_name)))
    return Result(answer=answer, trials=records, study=study_name, storage=redact(storage),
                  tracking_uri=redact(uri) if uri else None,
                  experiment_id=wrapup.stored_experiment(uri, study_name), out=out,
                  log_knobs=frozenset(trialrecord.log_knobs(study)))


def _register(*urls: str | None) -> None:
    """Passwords in these URLs and the environment's are masked in every message (tuner.masking)."""
    from tuner import masking
    from tuner.config import environment_secrets

    masking.register(*urls)
    masking.register_secrets(*environment_secrets())


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """A TunerError's message as the CLI prints it: one line, passwords masked, capped; a stop's
    advice in this API's words."""
    from tuner.cli import one_line

    try:
        yield
    except TunerError as exc:
        text = one_line(str(exc))
        if isinstance(exc, Interrupted):
            text = text.replace("run the same command", "call tuner.launch with the same arguments")
        exc.args = (text,)
        raise


@contextlib.contextmanager
def _stop_as_interrupted(what: str) -> Iterator[None]:
    """A stop signal outside a launch's own handling (``tuner verify``'s) as :class:`Interrupted`."""
    from tuner.driver.signals import is_stop, stopped

    try:
        yield
    except (KeyboardInterrupt, SystemExit) as exc:
        if not is_stop(exc):
            raise
        stop = stopped(exc)
        said = "interrupted" if stop.name == "Ctrl-C" else f"stopped by {stop.name}"
        raise Interrupted(f"{what}: {said}; its runs and embedded cluster were stopped", stop.exit_code) from None


@contextlib.contextmanager
def _quiet(console: Console, quiet: bool) -> Iterator[None]:
    before = console.quiet
    console.quiet = quiet or before
    try:
        yield
    finally:
        console.quiet = before

