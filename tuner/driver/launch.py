"""``tuner launch``: validate, start the workers, run the study, write best_config.yaml.

Order matters for "bad input loses nothing": the model and the search space are checked before
anything is created; the cluster's resources are checked before any trial starts; trials a dead
driver left RUNNING (no heartbeat for ``--grace-period``: ``tuner.driver.liveness``) are marked FAIL and
run again, before new trials are asked and while the search runs; a live driver's are left alone.
After the search, the best raced configs are verified on fresh seeds (``tuner.driver.verify``), and
best_config.yaml names the rule that chose the exported one.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from tuner import environ
from tuner.config import LaunchConfig, redact
from tuner.driver.capacity import Watched
from tuner.driver.liveness import Liveness, counted
from tuner.driver.progress import output_console
from tuner.driver.resume import check_owner, finished_study, warn_overwrite
from tuner.driver.targets import check_targets
from tuner.errors import ConfigError, Interrupted, OutputError
from tuner.masking import mask
from tuner.models import Model, load_model, runtime_env
from tuner.spaces import SearchSpace, default_space, load_space

if TYPE_CHECKING:
    import optuna
    from mlflow.tracking import MlflowClient

    from tuner.driver.executor import ClusterConfig
    from tuner.driver.outcome import Compute
    from tuner.driver.signals import Stopped
    from tuner.driver.tracking import Tracker
    from tuner.driver.verify import Plan
    from tuner.records import Skip

log = logging.getLogger(__name__)
console = output_console()  # piped or redirected: every line whole, no live view (tuner.driver.progress)
PROCESS_SLOTS = 64  # from this many slots, MLflow's writes go through a process of their own (mlflow_process)
METRIC = "val_loss"  # the objective's name in Optuna: a COMPLETE trial's validation loss, mean over seeds


def launch(config: LaunchConfig) -> dict[str, object]:
    """Run one launch end to end; return the best-config document that was written.

    Raises:
        Interrupted: a stop signal came (tuner.driver.signals); its exit code is 128 + the signal.
    """
    from tuner.driver import signals

    environ.prepare_process()
    quiet_third_party()
    restore_signals = signals.noted()  # SIGINT, SIGTERM, SIGHUP raise Stopped; a dropped one at the next poll
    try:
        return _launch(config)
    except (KeyboardInterrupt, SystemExit) as exc:  # before the study was opened: nothing to clean
        if not signals.is_stop(exc):
            raise
        stop = signals.stopped(exc)
        raise Interrupted(f"stopped by {stop.name} before the study was opened: nothing was trained",
                          stop.exit_code) from None
    finally:
        restore_signals()


def _launch(config: LaunchConfig) -> dict[str, object]:
    from tuner.driver import dashboard, signals, studyrecord, wrapup
    from tuner.driver.eta import Work
    from tuner.driver.executor import RayExecutor
    from tuner.driver.export import best_config
    from tuner.driver.progress import ProgressView
    from tuner.driver.pruning import prune_end, prune_start
    from tuner.driver.search import Budget, Search
    from tuner.driver.verify import Runner, verify_study

    model, space = prepare(config)
    liveness = Liveness(config.grace_period, say=_say, max_retries=config.max_retries)
    check_owner(config, space)  # a study continued with another model, space or --steps: refused
    skip, skipped = run_preflight(config, model, space)  # before anything is started or created
    done = finished_study(config)
    if done is not None:  # the same command again: nothing to train, no cluster, no MLflow run
        return show_finished(done, config)
    warn_overwrite(config, _say)
    with ThreadPoolExecutor(1, thread_name_prefix="tuner-mlflow-connect") as pool:
        connecting = pool.submit(connect_tracking, config)  # MLflow's import and store, while Ray starts
        executor = Watched(lambda: RayExecutor(cluster_config(config)), config.address, config.placement_timeout,
                           say=_say)  # on error, the pool waits for the connect
    tracker, closing, study = None, None, None
    try:
        signals.raise_if_dropped()  # tuner's handlers back in place of the ones ray.init set
        tracker = make_tracker(config, connecting.result(), liveness.driver, executor.slots)
        if tracker and skip:
            tracker.set_launch_tags(_skip_tags(skip, skipped))
        study = open_study(config, space, liveness)
        repair(study, tracker, liveness)
        todo, _ = liveness.open_trials(config.trials)
        console.print(
            f"study {study.study_name!r} on {redact(config.storage)}: {todo} trial(s) to run, "
            f"{executor.slots} slot(s), {config.seeds} seed(s) x {config.steps} steps", highlight=False,
        )
        stream = studyrecord.seed_stream(study, config.seed)
        budget = Budget(config.trials, config.steps, config.seeds, config.report_every, config.threads,
                        race_seeds=config.race_seeds, prune_from=prune_start(config.pruner, config.steps),
                        prune_to=prune_end(study.pruner))
        studyrecord.save_race_seeds(study, budget.race_seeds if budget.race_levels() else 0)  # the export's pool
        with ProgressView(todo, live=config.live, console=console, keys=shown_knobs(space), steps=config.steps,
                          work=Work.of_launch(config, todo, executor.slots),
                          race_seeds=budget.race_seeds if budget.race_levels() else 0) as view:
            callbacks = [c for c in (tracker, view, dashboard.Notes(study)) if c is not None]
            search = Search(study, space, config.model, executor, budget, callbacks, skip=skip, stream=stream,
                            liveness=liveness)
            liveness.say = executor.say = view.say
            search.run(todo)
            liveness.say = _say
            runner = Runner(executor, config.model, callbacks, config.report_every, config.threads, skip)
            if config.verify_seeds > 0:
                raced = budget.race_seeds if budget.race_levels() else 0
                verify_study(study, runner, verification_plan(config), stream, raced, say=view.say)
            dashboard.refresh(study)  # the trials' notes and the study's note name the exported trial
        # the cluster is not needed any more: it shuts down while the results are written
        closing = threading.Thread(target=executor.close, name="tuner-ray-shutdown")
        closing.start()
        search.compute.merge(runner.compute)
        studyrecord.add_compute(study, search.compute.by_phase())
        runs: dict[int, str] = {}  # trial number -> its MLflow run id
        if tracker:
            tracker.set_launch_metrics(_compute_metrics(search.compute))
            tracker.flush()
            runs = tracker.runs()  # asked once the search has ended: the search never asks the tracker
        wrapup.print_summary(console, study, {o.number for o in search.outcomes}, shown_knobs(space))
        doc = best_config(study, config.storage, config.steps, config.model, runs)
        write_answer(config, doc, study.study_name)
        _print_best(doc, config.out)
        plots = write_study_plots(study, config.out, config.storage)
        wrapup.print_where_to_look(console, doc, config, tracker.experiment_id if tracker else None)
        if tracker:
            tracker.mark_export(study)  # the exported trial's run: tag chosen, its name, the descriptions
            tracker.close("FINISHED", _study_summary(study), artifacts=(config.out, *plots))
        return doc
    except BaseException as exc:
        with signals.cleaning():  # a second signal now ends the process at once
            stopped = stop_launch(study, tracker, liveness, exc)
            if signals.is_stop(exc):
                stop = signals.stopped(exc)
                raise Interrupted(_interrupted_message(study, stopped, stop), stop.exit_code) from None
            raise
    finally:
        with signals.cleaning():
            liveness.stop()
            if closing is None:
                executor.close()
            else:
                closing.join()


def stop_launch(study: optuna.Study | None, tracker: Tracker | None, liveness: Liveness,
                exc: BaseException) -> list[int]:
    """Leave nothing RUNNING: this launch's trials in flight are told FAIL and queued again, their
    MLflow runs and the launch run are closed (KILLED on a stop signal, else FAILED). Optuna comes
    first: a second signal ends the process at once (tuner.driver.signals), and a trial left RUNNING
    waits out the grace period, while an MLflow run is closed by the next launch's repair anyway.

    Returns:
        The numbers of the trials stopped mid-run.
    """
    from tuner.driver import signals

    interrupted = signals.is_stop(exc)
    reason = signals.stopped(exc).reason if interrupted else f"the launch stopped: {type(exc).__name__}"
    stopped = liveness.abandon(reason) if study is not None else []
    if tracker is not None:
        tracker.flush()
        if study is not None:
            try:
                tracker.close_orphans(study, liveness.live_drivers() - {liveness.driver})
            except Exception as exc:  # MLflow down: the next launch closes them (its repair does the same)
                log.warning("could not close the stopped trials' MLflow runs: %s", mask(str(exc).splitlines()[0]))
        tracker.close("KILLED" if interrupted else "FAILED", wait=5.0)
    return stopped


def _interrupted_message(study: optuna.Study | None, stopped: list[int], stop: Stopped) -> str:
    said = "interrupted" if stop.name == "Ctrl-C" else f"stopped by {stop.name}"
    if study is None:
        return f"{said} before the study was opened: nothing was trained"
    kept = counted(study.get_trials(deepcopy=False))
    rerun = (f"trial(s) {', '.join(map(str, stopped))} stopped mid-run: marked FAIL and queued again; "
             if stopped else "")
    return (f"{said}: study {study.study_name!r} keeps its {kept} finished trial(s); {rerun}"
            "run the same command to continue the study")


def prepare(config: LaunchConfig) -> tuple[Model, SearchSpace]:
    """Every check of the launch's input that creates nothing: URLs and paths, model, search space.

    Raises:
        TunerError: one line naming the flag, file or key that is wrong.
    """
    from tuner.driver.search import make_sampler

    check_targets(config)  # storage, tracking URI, --out, --space
    model = load_model(config.model)
    space = resolve_space(config, model)
    make_sampler(config.sampler, config.seed, len(space.searched()))  # numpy takes the seed
    _derived = (cluster_config(config), verification_plan(config), config.threads)  # computed as launch will
    return model, space


def verification_plan(config: LaunchConfig) -> Plan:
    """How the end of the launch verifies (tuner.driver.verify.Plan) from the launch flags."""
    from tuner.driver.verify import Plan

    return Plan(seeds=config.verify_seeds, steps=config.verification_steps, min_survival=config.min_survival,
                candidates=config.verify_candidates, margin=config.margin, margin_steps=config.steps)


def _compute_metrics(compute: Compute) -> dict[str, float]:
    """Runs and steps trained per phase, as MLflow metrics of the launch run."""
    out = {}
    for phase, counts in compute.by_phase().items():
        out.update({f"{key}/{phase}": value for key, value in counts.items()})
    return out


def run_preflight(config: LaunchConfig, model: Model, space: SearchSpace) -> tuple[Skip, str]:
    """Check the model's data (tuner.preflight); the samples to skip, and what was said about them.

    Raises:
        DataError: the data has problems and --allow-bad-data was not given.
    """
    from tuner.preflight import data_knobs, preflight

    fixed = {name: p.value for name, p in space.params.items() if p.fixed}
    skip, text = preflight(model, data_knobs(model.knobs, fixed), config.model, config.allow_bad_data)
    if text:
        console.print(text, highlight=False)
    return skip, text


def _skip_tags(skip: Skip, text: str) -> dict[str, str]:
    return {"preflight_skipped_train": str(len(skip.train)), "preflight_skipped_val": str(len(skip.val)),
            "preflight": text}


def write_answer(config: LaunchConfig, doc: Mapping[str, object], study: str) -> None:
    """Write best_config.yaml (atomically: tuner.driver.export.write_best).

    Raises:
        OutputError: it could not be written (a full disk); the earlier file is unchanged, and the
            message says that the study is kept and that the same command writes it again.
    """
    from tuner.driver.export import write_best

    try:
        write_best(config.out, doc)
    except OutputError as exc:
        raise OutputError(f"{exc}; study {study!r} is kept: free some space (or pass another --out), then run "
                          "the same command again, which writes it without training") from exc


def write_study_plots(study: optuna.Study, out: str, storage: str) -> list[str]:
    """The stability map and survival curves beside best_config.yaml (tuner.driver.plots); [] if
    drawing them fails.

    Raises:
        OutputError: they could not be written (a full disk): the message says how to write them again.
    """
    from tuner.driver.plots import write_plots
    from tuner.driver.trialrecord import log_knobs, study_records

    folder = Path(out).resolve().parent
    try:
        paths = write_plots(study_records(study), folder, study=study.study_name, log_knobs=log_knobs(study))
    except OutputError as exc:
        again = (f"python -m tuner report --study {shlex.quote(study.study_name)} --storage "
                 f"{shlex.quote(redact(storage))} --out-dir {shlex.quote(str(folder))}")
        raise OutputError(f"{exc}; {out} was written and study {study.study_name!r} is kept: free some space, "
                          f"then `{again}` writes the plots") from exc
    except Exception as exc:  # plots are a convenience: never lose a finished launch to them
        log.warning("could not write the study plots: %s", exc)
        return []
    console.print("plots: " + ", ".join(str(p) for p in paths), highlight=False)
    return [str(p) for p in paths]


def resolve_space(config: LaunchConfig, model: Model) -> SearchSpace:
    """The launch's search space: the file given or shipped, else the model's knob ranges."""
    path = config.space_path
    if path is None:
        return default_space(config.model, model.knobs)
    return load_space(path, config.model, model.knobs)


def cluster_config(config: LaunchConfig) -> ClusterConfig:
    """The executor's settings; a model file travels to the workers in the runtime env."""
    from tuner.driver.executor import ClusterConfig

    return ClusterConfig(
        address=config.address, cpus_per_trial=config.cpus_per_trial,
        gpus_per_trial=config.gpus_per_trial, max_concurrent=config.max_concurrent,
        max_retries=config.max_retries, num_cpus=config.num_cpus, num_gpus=config.num_gpus,
        runtime_env=runtime_env(config.model), graph_reuse=config.graph_reuse, run_timeout=config.run_timeout,
    )


def connect_tracking(config: LaunchConfig) -> MlflowClient | None:
    """An MLflow client whose store answered (tuner.driver.tracking.connect); None with --no-tracking."""
    if config.no_tracking or config.tracking_uri is None:
        return None
    from tuner.driver.tracking import connect

    return connect(config.tracking_uri)


def make_tracker(config: LaunchConfig, client: MlflowClient | None, driver: str | None = None,
                 slots: int = 1) -> Tracker | None:
    """The MLflow tracker on ``client`` (from :func:`connect_tracking`; None: no tracking); its runs
    are tagged with the ``driver`` id (tuner.driver.liveness). On a cluster of ``PROCESS_SLOTS`` slots
    or more its writes go through a client in a process of its own (tuner.driver.mlflow_process)."""
    if client is None or config.tracking_uri is None:
        return None
    from tuner.driver.mlflow_process import ClientProcess
    from tuner.driver.tracking import Tracker

    params = {k: v for k, v in config.model_dump().items() if k not in ("storage", "tracking_uri")}
    params["storage"] = redact(config.storage)
    writer = ClientProcess(config.tracking_uri) if slots >= PROCESS_SLOTS else client
    return Tracker(config.tracking_uri, config.study_name, params, writer, driver=driver)


def open_study(config: LaunchConfig, space: SearchSpace, liveness: Liveness | None = None) -> optuna.Study:
    """Create the study, or load it to continue (same name and storage), on a storage with heartbeats.

    A continued study's sampler (or that of a second launch on a study another one created) is
    seeded from ``--seed`` and the number of trials the study holds, so that it does not replay
    the random start-up sequence of the launches before it.
    """
    import optuna

    from tuner.driver.pruning import make_pruner
    from tuner.driver.search import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    searched = len(space.searched())
    try:
        storage = (liveness or Liveness(config.grace_period)).storage(config.storage)
        existed = config.study_name in optuna.study.get_all_study_names(storage)
        study = optuna.create_study(
            study_name=config.study_name, storage=storage, sampler=make_sampler(config.sampler, config.seed, searched),
            pruner=make_pruner(config.pruner, config.steps), direction="minimize", load_if_exists=True,
        )
    except (ValueError, ImportError, optuna.exceptions.StorageInternalError) as exc:
        raise ConfigError(
            f"--storage {redact(config.storage)}: cannot open the Optuna storage: {str(exc).splitlines()[0]}"
        ) from exc
    name_metric(study)
    from tuner.driver import dashboard, studyrecord

    if not existed:
        dashboard.hold_place(study)  # the first row of optuna-dashboard's "Study User Attributes" table
    studyrecord.claim(study, config.model, studyrecord.space_signature(space), config.steps)
    if existed and config.seed is not None:  # a continued study, or one another launch is running
        held = len(study.get_trials(deepcopy=False))
        study.sampler = make_sampler(config.sampler, resumed_seed(config.seed, held), searched)
    return study


def name_metric(study: optuna.Study) -> None:
    """Name the study's objective (``val_loss``) for optuna-dashboard and ``study.trials_dataframe``."""
    import warnings

    if study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # set_metric_names is experimental in Optuna
            study.set_metric_names([METRIC])


def resumed_seed(seed: int, held: int) -> int:
    """The sampler seed of a launch that continues a study holding ``held`` trials."""
    import numpy as np

    return int(np.random.SeedSequence([seed, held]).generate_state(1)[0])


def repair(study: optuna.Study, tracker: Tracker | None, liveness: Liveness) -> int:
    """Fail the trials whose driver is dead (no heartbeat for the grace period), queue them again,
    and close the MLflow runs of dead drivers; a live driver's trials and runs are left alone.

    Returns:
        How many trials count as finished (tuner.driver.liveness.counted).
    """
    liveness.attach(study)
    liveness.reap()
    if tracker is not None:
        tracker.close_orphans(study, liveness.live_drivers())
        liveness.on_reap.append(lambda: tracker.close_orphans(study, liveness.live_drivers()))
    return counted(study.get_trials(deepcopy=False))


def _say(text: str) -> None:
    console.print(text, highlight=False)


def _study_summary(study: optuna.Study) -> dict[str, float]:
    """The launch run's closing metrics: the study's counts (``tuner.driver.counts.Counts``)."""
    from tuner.driver.counts import Counts
    from tuner.driver.trialrecord import study_records

    counts = Counts.of(study_records(study))
    return {
        "trials_finished": float(counts.finished), "trials_survived": float(counts.survived),
        "trials_diverged": float(counts.diverged), "trials_stopped": float(counts.stopped),
        "trials_failed": float(counts.failed), "diverged_fraction": counts.diverged_fraction,
        "finished_at": time.time(),
    }


def _print_best(doc: Mapping[str, object], out: str) -> None:
    from tuner.driver.wrapup import print_best

    print_best(console, doc, out)


def quiet_third_party() -> None:
    """No lines from MLflow's own logging (and the alembic migrations it runs on a new database) in a
    launch: its INFO lines, and its ERROR records with their tracebacks when its store fails (51 of
    them for a full disk); tuner says in one line what could not be logged
    (tuner.driver.mlflow_sender). MLflow sets its loggers' level from ``MLFLOW_LOGGING_LEVEL`` when
    it is imported. Nor MLflow's "View run ..." lines: a pair for each run that ends over HTTP."""
    # MLflow 3.17 writes "View run ... at: URL" / "View experiment at: URL" to stdout itself (not through
    # a logger) whenever a run over HTTP ends (TrackingServiceClient._log_url); environ sets its own switch
    environ.quiet_mlflow()
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def shown_knobs(space: SearchSpace) -> list[str]:
    """The knobs a trial's line and the table show: the learning rate, then the searched ones."""
    return ["learning_rate", *(k for k in space.searched() if k != "learning_rate")]


def show_finished(study: optuna.Study, config: LaunchConfig) -> dict[str, object]:
    """Say that the study already has its trials, show and write its best config, say how to run more."""
    from tuner.driver.export import best_config

    held = counted(study.get_trials(deepcopy=False))
    console.print(f"study {study.study_name!r} on {redact(config.storage)} already has {held} finished trial(s) "
                  f"(--trials {config.trials} is the total it should reach): nothing to train.",
                  highlight=False, markup=False)
    from tuner.driver.mlflow_runs import stored_runs

    runs = {} if config.no_tracking else stored_runs(config.tracking_uri, config.study_name)  # read only
    doc = best_config(study, config.storage, config.steps, config.model, runs)
    write_answer(config, doc, study.study_name)
    _print_best(doc, config.out)
    from tuner.driver import wrapup

    wrapup.print_where_to_look(console, doc, config, wrapup.stored_experiment(
        None if config.no_tracking else config.tracking_uri, config.study_name))
    console.print(f"to run more trials, give a higher total: --trials {held + config.trials} runs "
                  f"{config.trials} more; `python -m tuner report --study {study.study_name}` shows them all",
                  highlight=False, markup=False)
    return doc
