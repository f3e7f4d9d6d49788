"""MLflow tracking from the driver: a parent run per launch, a child run per trial, in batches.

The :class:`Tracker` is a Callback of the search that only listens: it maps the events it hears
to MLflow runs, params, metrics, tags and artifacts, and hands every write to its sender
(``tuner.driver.mlflow_sender``: an ordered queue a background thread sends, in batches, retried
while the tracking server does not answer), so the search loop never waits for MLflow. A trial's
run is created ahead of that queue (it shows in the MLflow UI while its points wait). While more
than 10,000 points wait to be sent, a progress record's values other than ``loss`` go to its run's
``telemetry.json`` (one row per seed and step, in a table per seed named as its metrics' prefix:
``s0``, ``s1``, ...) instead of metric points. Nothing is dropped: every record's loss is a metric
point, each of its other values a metric point or in a row of telemetry.json.

A child run gets, per seed, the telemetry of each report step (``s0/loss``, ``s0/grad_norm``,
``s0/clip_fraction``, ``s0/grad_norm/layer0/kernel``, ``s0/iter_3/input_absmax``, ...) and the
summary at the end (``s0/steps_survived``, ``s0/val_loss``, the tag ``s0.node_id``, ...). A seed is
named by its position in the run (``s0`` its first seed, ``s1`` its second: ``mlflow_ui.seed_key``),
not by its value, which the study's seed stream draws anew for every trial: so every run has the
same few metric columns. The values, in position order, are the run's ``seeds`` param (the seeds it
started with) and ``seeds`` tag (every seed of its outcome: in a trial's own run, its race seeds
follow its search seeds). A diverged trial also gets the
forensics of its first divergence as tags (``first_nonfinite_op``, ``first_nonfinite_kind``,
``divergence_cause``, ...) and as the ``divergence.json`` artifact. A trial's race levels and a
config's verification and margin runs get runs of their own, nested under the trial's run and
tagged ``phase`` (``race``, ``verify``, ``margin``; the trial's own run is ``search``); the
trial's run holds its final status, race seeds included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard, cast

from tuner.driver import mlflow_runs, mlflow_ui, orphans
from tuner.driver.mlflow_process import ClientProcess
from tuner.driver.mlflow_sender import TELEMETRY_FILE, Sender, Target, first_line
from tuner.errors import TrackingError
from tuner.records import (
    Forensics,
    NonFiniteKind,
    Phase,
    RunRecord,
    RunStatus,
    TrainConfig,
    TrialOutcome,
    TrialState,
)

if TYPE_CHECKING:
    import optuna
    from mlflow.entities import Experiment, Run
    from mlflow.tracking import MlflowClient

    from tuner.driver.trialrecord import TrialRecord

log = logging.getLogger(__name__)

_RUN_STATUS = {TrialState.SURVIVED: "FINISHED", TrialState.DIVERGED: "FINISHED", TrialState.STOPPED: "FINISHED",
               TrialState.FAILED: "FAILED"}
DIVERGENCE_FILE = "divergence.json"
DRIVER_TAG = orphans.DRIVER_TAG  # the id of the launch that created a run (tuner.driver.liveness)
__all__ = ["DIVERGENCE_FILE", "DRIVER_TAG", "TELEMETRY_FILE", "Tracker", "artifact_location", "connect"]


def connect(uri: str) -> MlflowClient:
    """An MLflow client of ``uri`` whose store answered: the slow part of a launch's tracking.

    Importing MLflow and opening its store (schema checks of a database) take seconds of CPU, so
    ``tuner.driver.launch`` calls it while Ray starts.

    Raises:
        TrackingError: the store does not answer.
    """
    try:
        client = mlflow_runs.client(uri)
        client.search_experiments(max_results=1)
    except Exception as exc:  # any failure here means the store is unusable
        raise _unreachable(uri, exc) from exc
    return client


def artifact_location(uri: str) -> str | None:
    """Where a new experiment's artifacts go: ``mlartifacts/`` beside a SQLite tracking database
    (not ``./mlruns`` of whatever folder the launch ran in); None (the server's choice) otherwise."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()


def _unreachable(uri: str, exc: BaseException) -> TrackingError:
    return TrackingError(
        f"cannot reach the MLflow tracking store at {_redact(uri)}: {first_line(exc)}. "
        "Start it (mlflow server --host 127.0.0.1 --port 5000), fix --tracking-uri / "
        "MLFLOW_TRACKING_URI, or pass --no-tracking to run without MLflow"
    )


class Tracker:
    """Logs a launch to MLflow (see the module docs); a Callback of ``tuner.driver.search``, which
    only hears events: the search never asks it anything (the launch asks :meth:`runs` once it has ended)."""

    def __init__(self, uri: str, experiment: str, launch_params: Mapping[str, object],
                 client: MlflowClient | ClientProcess | None = None, driver: str | None = None) -> None:
        """Create the parent run; ``client`` is one :func:`connect` made beforehand (else made here), or
        a :class:`~tuner.driver.mlflow_process.ClientProcess` (a large cluster's: closed with the tracker).

        Every run it creates is tagged ``tuner.driver`` with ``driver`` (its launch's id, see
        tuner.driver.liveness), so that another launch on the study closes it only once that driver is dead.
        """
        from mlflow.entities import Metric, Param, RunTag

        self._Metric, self._Param, self._Tag = Metric, Param, RunTag
        self.uri = uri
        self._driver = {DRIVER_TAG: driver} if driver else {}
        self._process = client if isinstance(client, ClientProcess) else None
        # a ClientProcess answers every MlflowClient method the tracker calls, with the same results
        self.client = cast("MlflowClient", client) if client is not None else connect(uri)
        try:
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(
                experiment, artifact_location=artifact_location(uri))
            self._mark_experiment(found, experiment)
            tags = {"tuner.role": "study", "study": experiment, **self._driver}
            parent = self.client.create_run(self.experiment_id, tags=tags, run_name=f"{experiment}-launch")
            self.parent_id = parent.info.run_id
            self.client.log_batch(self.parent_id, params=[Param(k, str(v)) for k, v in launch_params.items()])
        except Exception as exc:  # any failure here means the store is unusable
            raise _unreachable(uri, exc) from exc
        self._runs: dict[int, str] = {}  # trial number -> child run id
        self._create_tried: set[int] = set()  # trials whose child run creation was sent at least once
        self._children: dict[int, dict[str, object]] = {}  # trial number -> params of its run, not yet created
        self._phase_runs: dict[tuple[int, str], int] = {}  # (trial, phase) -> phase runs made so far
        self._current: dict[tuple[int, str], str] = {}  # (trial, phase) -> name of its open phase run
        self._named: dict[str, str] = {}  # phase run name -> its run id
        self._seeds: dict[Target, dict[int, int]] = {}  # open run -> seed -> its position (see the module docs)
        self._sender = Sender(self.client, _redact(uri), self._run_of, before=self._create_children)

    def _mark_experiment(self, found: Experiment | None, study: str) -> None:
        """Tag the experiment to open in the MLflow UI's training views with tuner's columns
        (tuner.driver.mlflow_ui); a description the user wrote is kept."""
        tags = mlflow_ui.experiment_tags(self.experiment_id, study)
        if found is not None and not mlflow_ui.is_tuner_note(found.tags.get(mlflow_ui.NOTE_TAG)):
            del tags[mlflow_ui.NOTE_TAG]
        for key, value in tags.items():
            self.client.set_experiment_tag(self.experiment_id, key, value)

    def runs(self) -> dict[int, str]:
        """Trial number -> the id of its own run: this launch's runs created so far, and the study's
        earlier ones found in the store (tuner.driver.mlflow_runs).

        For the launch to ask once its search has ended (the search never asks a callback
        anything); best after :meth:`flush`. While MLflow does not answer, this launch's runs alone, at once.
        """
        made = dict(self._runs)
        if self._sender.down:
            return made
        try:
            found = mlflow_runs.trial_runs(self.client, self.experiment_id)
        except Exception as exc:  # MLflow went away since the last send: this launch's runs are known
            log.debug("the study's earlier runs were not looked up: %s", first_line(exc))
            return made
        return {**found, **made}

    def mark_export(self, study: optuna.Study) -> None:
        """Queue the marks of the study's exported trial (the incumbent: tuner.driver.export.best_trial),
        for the end of a launch, once it chose: its run tagged ``chosen`` = ``true``, renamed
        (``trial-4 survived, exported``) and described by what the export rests on; every other
        trial's run tagged ``why_not_chosen``; an earlier launch's mark moved; the launch run's and
        the experiment's descriptions name the exported trial (tuner.driver.mlflow_ui)."""
        from tuner.driver.export import best_trial
        from tuner.driver.trialrecord import study_records

        found = best_trial(study)
        if found is None:
            return
        top, rule = found
        records = study_records(study)
        self._sender.append(lambda: self._mark_export(top, rule, records, study.study_name))

    def _mark_export(self, top: TrialRecord, rule: str, records: Sequence[TrialRecord], study: str) -> None:
        runs = self.runs()
        sentence = mlflow_ui.export_sentence(top, rule)
        for run in self.client.search_runs([self.experiment_id], filter_string=f"tags.{mlflow_ui.CHOSEN_TAG} = 'true'"):
            if run.info.run_id != runs.get(top.number):  # an earlier launch exported another trial
                self._unmark(run)
        for record in records:
            if record.number in runs and record.number != top.number and record.why:
                self.client.set_tag(runs[record.number], mlflow_ui.WHY_TAG, record.why[:5000])
        if top.number in runs:
            run = self.client.get_run(runs[top.number])
            note = mlflow_ui.unexported_note(run.data.tags.get(mlflow_ui.NOTE_TAG, ""))
            tags = {mlflow_ui.CHOSEN_TAG: "true", mlflow_ui.NAME_TAG: mlflow_ui.exported_name(run.info.run_name),
                    mlflow_ui.NOTE_TAG: mlflow_ui.exported_note(sentence, note)}
            self.client.log_batch(run.info.run_id, tags=[self._Tag(k, v) for k, v in tags.items()])
            if mlflow_ui.WHY_TAG in run.data.tags:
                self.client.delete_tag(run.info.run_id, mlflow_ui.WHY_TAG)
        self.client.set_tag(self.parent_id, mlflow_ui.NOTE_TAG, sentence)
        experiment = self.client.get_experiment(self.experiment_id)
        if mlflow_ui.is_tuner_note(experiment.tags.get(mlflow_ui.NOTE_TAG)):
            note = mlflow_ui.experiment_note(self.experiment_id, study, mlflow_ui.exported_phrase(top))
            self.client.set_experiment_tag(self.experiment_id, mlflow_ui.NOTE_TAG, note)

    def _unmark(self, run: Run) -> None:
        """Take an earlier launch's export mark off ``run``."""
        self.client.delete_tag(run.info.run_id, mlflow_ui.CHOSEN_TAG)
        tags = {mlflow_ui.NAME_TAG: run.info.run_name.removesuffix(mlflow_ui.EXPORTED),
                mlflow_ui.NOTE_TAG: mlflow_ui.unexported_note(run.data.tags.get(mlflow_ui.NOTE_TAG, ""))}
        self.client.log_batch(run.info.run_id, tags=[self._Tag(k, v) for k, v in tags.items()])

    def backlog(self) -> int:
        """Metric points buffered or queued and not yet sent."""
        return self._sender.backlog()

    def behind(self) -> int:
        """Metric points queued for the sender and not yet sent (how far the store is behind)."""
        return self._sender.behind()

    def on_trial_start(self, number: int, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Note the child run to create (ahead of the queue) with its params, and its seeds' positions."""
        self._children[number] = {**config.flat(), "trial": number, "seeds": ",".join(map(str, seeds))}
        self._seeds[number] = {seed: i for i, seed in enumerate(seeds)}

    def on_phase_start(self, number: int, phase: Phase, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Queue a run for a config's race level, verification or margin runs, nested under the trial's run."""
        key = (number, phase.value)
        self._phase_runs[key] = self._phase_runs.get(key, 0) + 1
        name = f"trial-{number}-{phase.value}-{self._phase_runs[key]}"
        params = {**config.flat(), "trial": number, "seeds": ",".join(map(str, seeds))}
        self._current[key] = name
        self._seeds[name] = {seed: i for i, seed in enumerate(seeds)}
        self._sender.append(lambda: self._create_phase_run(number, phase, name, params))

    def on_phase_end(self, outcome: TrialOutcome) -> None:
        """Queue the phase run's summary, tags and end status."""
        name = self._current.pop((outcome.number, outcome.phase.value))
        self._sender.queue_target(name)
        positions = self._end_positions(name, outcome)
        tags = {**outcome_tags(outcome, positions), **mlflow_ui.run_labels(name, outcome)}
        metrics = outcome_metrics(outcome, positions)
        now = int(time.time() * 1000)
        points = [self._Metric(k, v, now, step) for k, v, step in mlflow_ui.divergence_points(outcome, positions)]

        def summary() -> None:
            run_id = self._named[name]
            self.client.log_batch(run_id, metrics=[self._Metric(k, v, now, 0) for k, v in metrics.items()] + points,
                                  tags=[self._Tag(k, v) for k, v in tags.items()])
            self.client.set_terminated(run_id, _RUN_STATUS[outcome.state])

        self._sender.append(summary)
        self._sender.queue_due()

    def set_launch_metrics(self, metrics: Mapping[str, float]) -> None:
        """Queue metrics of the launch run (what each phase trained, say)."""
        now = int(time.time() * 1000)
        items = [self._Metric(k, float(v), now, 0) for k, v in metrics.items()]
        self._sender.append(lambda: self.client.log_batch(self.parent_id, metrics=items))

    def on_trial_result(self, record: RunRecord) -> None:
        """Buffer the record's metrics (per seed) at its step, on the run of its phase; its telemetry
        goes to the run's telemetry.json instead while the queue is long (see the module docs)."""
        target: Target = record.trial
        if record.phase is not Phase.SEARCH:
            target = self._current.get((record.trial, record.phase.value), record.trial)
        positions = self._seeds.setdefault(target, {})
        name = mlflow_ui.seed_key(positions.setdefault(record.seed, len(positions)))  # a seed not announced: next
        # a diverged run's final record holds its last finite loss and gradient norm, from the step before
        # it diverged: charted there, the loss line ends at the last finite step (the run's name says the next)
        diverged = record.final and record.status is RunStatus.DIVERGED
        now, seed, step = int(time.time() * 1000), name + "/", record.steps_survived if diverged else record.step
        values = {"grad_norm": record.grad_norm, **({} if record.final else record.metrics)}
        points = [(seed + "loss", float(record.loss), now, step)] if _finite(record.loss) else []
        if not record.final and self._sender.spilling():
            row = {k: float(v) for k, v in values.items() if _finite(v)}
            self._sender.add_row(target, name, {"step": step, **row})
        else:
            points.extend((seed + k, float(v), now, step) for k, v in values.items() if _finite(v))
        self._sender.add(target, points)

    def on_trial_complete(self, outcome: TrialOutcome, record: TrialRecord | None = None) -> None:
        """Queue the trial's summary, tags and end status, then flush (all from ``outcome``'s runs;
        ``record`` is not needed here)."""
        number = outcome.number
        self._sender.queue_target(number)
        positions = self._end_positions(number, outcome)
        tags = {**outcome_tags(outcome, positions), **mlflow_ui.run_labels(f"trial-{number}", outcome)}
        metrics = outcome_metrics(outcome, positions)
        now = int(time.time() * 1000)
        status = _RUN_STATUS[outcome.state]  # a diverged run ends FINISHED: see tuner.driver.mlflow_ui
        points = [self._Metric(k, v, now, step) for k, v, step in mlflow_ui.divergence_points(outcome, positions)]

        def summary() -> None:
            self.client.log_batch(
                self._runs[number], metrics=[self._Metric(k, v, now, 0) for k, v in metrics.items()] + points,
                tags=[self._Tag(k, v) for k, v in tags.items()],
            )

        self._sender.append(summary)
        doc = divergence_doc(outcome)
        if doc is not None:
            self._sender.append(lambda: self.client.log_dict(self._runs[number], doc, DIVERGENCE_FILE))
        self._sender.append(lambda: self.client.set_terminated(self._runs[number], status))
        self._sender.queue_due()

    def _end_positions(self, target: Target, outcome: TrialOutcome) -> dict[int, int]:
        """Seed -> position in the ending run: its seeds as its start announced them (and any other seed
        a record brought), then the outcome's other seeds in the outcome's order (in a trial's own run,
        its race seeds after its search seeds)."""
        positions = self._seeds.pop(target, {})
        for r in outcome.seeds:
            positions.setdefault(r.seed, len(positions))
        return positions

    def set_launch_tags(self, tags: Mapping[str, str]) -> None:
        """Queue tags on the parent run (what the data preflight skipped, say)."""
        items = [self._Tag(k, str(v)[:5000]) for k, v in tags.items()]
        self._sender.append(lambda: self.client.log_batch(self.parent_id, tags=items))

    def flush(self) -> bool:
        """Send every queued operation now, in order (waiting for the background sender); True if all went."""
        return self._sender.flush()

    def _create_children(self) -> None:
        """Create the trials' runs noted by on_trial_start, oldest first (under the lock)."""
        while self._children:
            number, params = next(iter(self._children.items()))
            self._create_child(number, params)
            del self._children[number]

    def close(self, status: str = "FINISHED", summary: Mapping[str, float] | None = None,
              artifacts: tuple[str, ...] = (), wait: float = 30.0) -> None:
        """Flush (retrying for up to ``wait`` seconds), log the summary and end the parent run."""
        summary = dict(summary or {})

        def end() -> None:
            now = int(time.time() * 1000)
            self.client.log_batch(self.parent_id, metrics=[self._Metric(k, v, now, 0) for k, v in summary.items()])
            for path in artifacts:
                self.client.log_artifact(self.parent_id, path)
            self.client.set_terminated(self.parent_id, status)

        self._sender.close(end, wait)
        if self._process is not None:
            self._process.close()

    def close_orphans(self, study: optuna.Study, live: Collection[str] = ()) -> int:
        """Close the runs dead drivers left RUNNING and log the trials they could not log
        (tuner.driver.orphans); a live driver's runs (``live``) are left alone.

        Returns:
            How many runs were closed or logged.
        """
        with self._sender.lock:
            return (orphans.close_orphans(self.client, self.experiment_id, study, live, keep=self.parent_id)
                    + orphans.log_missing(self.client, self.experiment_id, study, live, parent=self.parent_id))

    def _create_child(self, number: int, params: Mapping[str, object]) -> None:
        """Create the trial's child run and log its params; safe to retry after a failure.

        A server that dies mid-request may have created the run without answering, so a retry
        first looks for that run instead of creating a second one for the same trial.
        """
        if number not in self._runs:
            found = self._find_child(number) if number in self._create_tried else None
            self._create_tried.add(number)
            self._runs[number] = found if found is not None else self._new_child(number, status="running")
        self._log_params(self._runs[number], params)

    def _new_child(self, number: int, **tags: str) -> str:
        """Create a child run of trial ``number`` under this launch's parent run; its id."""
        tags = {"mlflow.parentRunId": self.parent_id, "trial": str(number), "phase": "search", **self._driver,
                **tags}
        return self.client.create_run(self.experiment_id, tags=tags, run_name=f"trial-{number}").info.run_id

    def _log_params(self, run_id: str, params: Mapping[str, object]) -> None:
        self.client.log_batch(run_id, params=[self._Param(k, str(v)) for k, v in params.items()])

    def _find_child(self, number: int) -> str | None:
        """The id of this launch's child run of trial ``number``, if the store has one."""
        query = f"tags.trial = '{number}' and tags.`mlflow.parentRunId` = '{self.parent_id}'"
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def _run_of(self, target: Target) -> str:
        return self._named[target] if isinstance(target, str) else self._runs[target]

    def _create_phase_run(self, number: int, phase: Phase, name: str, params: Mapping[str, object]) -> None:
        """Create a phase run, nested under the trial's run (or under the launch run if the trial
        was logged by an earlier launch)."""
        if name in self._named:
            return
        parent = self._runs.get(number) or self.parent_id
        tags = {"mlflow.parentRunId": parent, "trial": str(number), "phase": phase.value, **self._driver}
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=name)
        self._named[name] = run.info.run_id
        self._log_params(run.info.run_id, params)


def outcome_tags(outcome: TrialOutcome, positions: Mapping[int, int]) -> dict[str, str]:
    """The tags of a finished trial's run: status, divergence step and cause, reason, each seed's node.

    ``positions`` (seed -> position in the run, holding every seed of ``outcome``, in position order)
    names the per-seed tags (``s0.node_id``) and is the ``seeds`` tag: its seed values in position order.
    """
    first = outcome.divergence
    tags = {"status": outcome.state.value, "steps_survived": ",".join(map(str, outcome.steps_survived)),
            "seeds": ",".join(map(str, positions))}
    if outcome.learned is not None:
        tags["learned"] = str(outcome.learned).lower()
    raced = sum(r.phase is Phase.RACE for r in outcome.seeds)
    if outcome.phase is Phase.SEARCH and raced:
        tags["race_seeds"] = str(raced)
    if first is not None:
        tags["divergence_step"] = str(first.step)
        tags["diverged_on"] = first.diverged_on.value if first.diverged_on else "unknown"
        tags["diverged_seed"] = str(first.seed)
        if first.diverged_loss is not None:  # a model with several losses: the one that went first
            tags["diverged_loss"] = first.diverged_loss
    if first is not None and first.forensics is not None:
        tags.update(forensics_tags(first.forensics))
    if outcome.reason:
        tags["reason"] = outcome.reason[:5000]
    nodes = {r.seed: str(r.info["node_id"]) for r in outcome.seeds if r.info.get("node_id")}
    tags.update({f"{mlflow_ui.seed_key(positions[seed])}.node_id": node for seed, node in nodes.items()})
    if nodes:
        tags["node_ids"] = ",".join(sorted(set(nodes.values())))
    return tags


def forensics_tags(found: Forensics) -> dict[str, str]:
    """Tags naming the first non-finite op (``first_nonfinite_op``, ``first_nonfinite_kind``, ...)."""
    tags = {"divergence_cause": "data" if found.kind is NonFiniteKind.DATA else "model"}
    values = {
        "first_nonfinite_op": found.op, "first_nonfinite_kind": found.kind.value if found.kind else None,
        "first_nonfinite_type": found.op_type, "first_nonfinite_layer": found.layer,
        "first_nonfinite_iteration": found.iteration, "first_nonfinite_forward_op": found.forward_op,
    }
    tags.update({k: str(v) for k, v in values.items() if v is not None})
    if found.samples:
        tags["bad_samples"] = ",".join(map(str, found.samples[:100]))
    if found.note:
        tags["forensics_note"] = found.note[:5000]
    if found.kind is None:
        tags["divergence_cause"] = "unknown"
    return tags


def divergence_doc(outcome: TrialOutcome) -> dict[str, object] | None:
    """The ``divergence.json`` artifact of a diverged trial: its first divergence's forensics."""
    first = outcome.divergence
    if first is None or first.forensics is None:
        return None
    cause = first.diverged_on.value if first.diverged_on else None
    return {"trial": outcome.number, "seed": first.seed, "diverged_on": cause, "diverged_loss": first.diverged_loss,
            **first.forensics.to_dict()}


def outcome_metrics(outcome: TrialOutcome, positions: Mapping[int, int]) -> dict[str, float]:
    """Summary metrics of a finished trial, per seed (``s0/steps_survived``, ``s0/val_loss``, ...: the
    seed's position in ``positions``, which holds every seed of ``outcome``) and overall."""
    metrics: dict[str, float] = {"min_steps_survived": float(min(outcome.steps_survived, default=0)),
                                 "seeds_survived": float(sum(r.status.value == "survived" for r in outcome.seeds))}
    if outcome.value is not None:
        metrics["val_loss"] = outcome.value
    if outcome.init_val_loss is not None:
        metrics["init_val_loss"] = outcome.init_val_loss
    for r in outcome.seeds:
        seed = mlflow_ui.seed_key(positions[r.seed]) + "/"
        metrics[seed + "steps_survived"] = float(r.steps_survived)
        if r.val_loss is not None:
            metrics[seed + "val_loss"] = r.val_loss
        metrics.update({seed + k: v for k, v in r.metrics.items()})
    return metrics


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and value == value and abs(value) != float("inf")


def _redact(uri: str) -> str:
    from tuner.config import redact

    return redact(uri)
