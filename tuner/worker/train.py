"""The training loop of one seed run: TF1 graph mode, one graph per model config, reused across runs.

Only workers import this module (it imports TensorFlow). Every step runs the train op of a graph
that ``tuner.worker.graph`` built and fetches the loss, the unclipped global gradient norm and a
finiteness flag of the updated weights in the same ``session.run``, so the first non-finite value
is caught at its exact step at no extra cost. A report step (every ``report_every``) fetches more
in that same run: the gradient norm of each weight, the largest |value| of each watched tensor and
a snapshot of every variable after the update, so a divergence can be replayed from there
(``tuner.worker.forensics``, given the graph, the session and the snapshot). Everything else the
telemetry reports is Python on the numbers already fetched (``tuner.worker.telemetry``). A model with
several losses updated alternately runs one ``session.run`` per loss, in order, and the first
non-finite value names its loss (:class:`Cause`).

The graph-building names (:func:`~tuner.worker.graph.build`, :class:`~tuner.worker.graph.Graphs`, ...) live in
``tuner.worker.graph`` and are importable from here too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import SupportsFloat

import numpy as np
import tensorflow as tf

from tuner.models.base import Dataset, Model
from tuner.records import DivergedOn, Forensics, RunRecord, RunSpec, RunStatus, cause_text
from tuner.worker.forensics import investigate
from tuner.worker.graph import (
    DECAY_STEPS,
    OPTIMIZER_DEFAULTS,
    UPDATED_SCOPE,
    BuildStopped,
    Built,
    Graphs,
    Hyper,
    Snapshot,
    StateReader,
    TrainRun,
    build,
    make_optimizer,
    metric_name,
    reseed,
    session_config,
)
from tuner.worker.telemetry import Telemetry

__all__ = [  # the training loop, and the graph-building names tests, benches and workers import from here
    "DECAY_STEPS", "OPTIMIZER_DEFAULTS", "UPDATED_SCOPE", "BuildStopped", "Built", "Cause", "Graphs", "Hyper",
    "Snapshot", "StateReader", "Stepper", "TrainRun", "build", "make_optimizer", "metric_name", "non_finite",
    "reseed", "session_config", "train_run",
]

tf1 = tf.compat.v1


def train_run(
    model: Model,
    data: Dataset,
    spec: RunSpec,
    should_stop: Callable[[], bool] = lambda: False,
    info: Mapping[str, object] | None = None,
    sample_ids: Sequence[int] | np.ndarray | None = None,
    graphs: Graphs | None = None,
) -> Iterator[RunRecord]:
    """Train one seed run; yield a progress record every ``spec.report_every`` steps, then a final one.

    Stops at the first step whose loss, gradient norm or updated weights are non-finite, and
    replays that step to find the op that went non-finite first (the final record's
    ``forensics``). Stops early (final status CANCELLED) when ``should_stop()`` turns true; it is
    checked while the graph is built (``tuner.hooks.stoppable_graph``), once it is built and at each
    report. ``sample_ids`` maps a training sample of ``data`` to its index in the model's data
    (when the preflight left samples out). With ``graphs``, a graph kept there for the same model
    config is reseeded and reused instead of built (``info["graph"]`` says which).
    """
    info = dict(info or {})
    started = time.perf_counter()
    try:
        if graphs is None:
            built, reused = build(model, spec.config, spec.seed, should_stop), False
        else:
            built, reused = graphs.get(model, spec.config, spec.seed, should_stop)
    except BuildStopped:
        yield _final(spec, Telemetry(spec.config.clip_norm), 0, RunStatus.CANCELLED, None, None, info)
        return
    info["graph"] = "reused" if reused else "built"
    info["graph_seconds"] = time.perf_counter() - started
    with tf1.Session(graph=built.graph, config=session_config(spec.threads, gpu=True)) as sess:
        built.start(sess, spec.config)
        stepper = Stepper(sess, built, data, spec)
        telemetry = stepper.telemetry
        if should_stop():  # cancelled between the build's last check and here
            yield _final(spec, telemetry, 0, RunStatus.CANCELLED, None, None, info)
            return
        # the bar a run must get under to have learned anything (one forward pass of the val set)
        telemetry.init_val_loss = _finite_or_none(sess.run(built.val_loss, stepper.feed_arrays(data.val)))
        started = time.perf_counter()
        for step in range(1, spec.steps + 1):
            cause = stepper.step(step)
            if cause is not None:
                # tell the driver at once, so it cancels the sibling seeds while the replay runs
                yield RunRecord(spec.trial, spec.seed, step, RunStatus.DIVERGED, steps_survived=step - 1,
                                diverged_on=cause.on, phase=spec.phase, diverged_loss=cause.loss)
                found = cause.noted(_investigate(model, stepper, step, sample_ids, info))
                yield _final(spec, telemetry, step, RunStatus.DIVERGED, cause, None, info, found)
                return
            if stepper.is_report(step):
                yield _progress(spec, step, stepper)
                if should_stop():
                    yield _final(spec, telemetry, step, RunStatus.CANCELLED, None, None, info)
                    return
        info["train_seconds"] = time.perf_counter() - started
        val = float(sess.run(built.val_loss, stepper.feed_arrays(data.val)))
    if not math.isfinite(val):
        note = "the validation loss was non-finite after training; every training step was finite"
        found = Forensics(spec.steps, note=note, report_points=tuple(telemetry.points),
                          last_steps=telemetry.last_steps())
        yield _final(spec, telemetry, spec.steps, RunStatus.DIVERGED, Cause(DivergedOn.VALIDATION), None, info, found)
        return
    yield _final(spec, telemetry, spec.steps, RunStatus.SURVIVED, None, val, info)



class Stepper:
    """Runs the train steps of one run in a session, with telemetry (see the module docs).

    Attributes:
        telemetry: the run's running numbers.
        snapshot: the variables after the latest report step (after init before the first).
        metrics: the metrics of the latest report step.
    """

    def __init__(self, sess: tf.compat.v1.Session, built: Built, data: Dataset, spec: RunSpec) -> None:
        self.sess, self.built, self.data, self.spec = sess, built, data, spec
        self.telemetry = Telemetry(spec.config.clip_norm)
        names = [v.name for v in built.state]
        initial = tuple(np.array(x, copy=True) for x in sess.run(built.state))
        self.snapshot = Snapshot(0, initial, lambda raw: dict(zip(names, raw, strict=True)))
        self.metrics: dict[str, float] = {}

    def feed_arrays(self, arrays: Sequence[np.ndarray], step: int = 0) -> dict[tf.Tensor, np.ndarray]:
        """A feed dict of the model's placeholders (and its step seed at ``step``): :meth:`Built.feed`."""
        return self.built.feed(arrays, self.spec.seed, step)

    def is_report(self, step: int) -> bool:
        """Whether ``step`` is a report step."""
        return step % self.spec.report_every == 0 or step == self.spec.steps

    def step(self, step: int) -> Cause | None:
        """Run train step ``step`` (one ``session.run``, or one per loss when alternating); return
        what went non-finite first, or None."""
        feed = self.feed_arrays(self.data.batch(step, self.spec.seed), step)
        report = self.is_report(step)
        losses: dict[str, tuple[float, float]] = {}  # loss name -> (value, unclipped gradient norm)
        clipped: list[bool] = []
        reported: dict[str, float] = {}
        raw: Sequence[np.ndarray] = ()  # the state after the step, fetched with the last run of a report step
        for i, run in enumerate(self.built.runs):
            extra = () if run.clipped is None else (run.clipped,)
            if report:
                reads = self.built.state_reader.fetches if i == len(self.built.runs) - 1 else []
                fetched, values, raw = self.sess.run((run.fetches + extra, run.report_values, reads), feed)
                reported.update(zip(run.report_names, values, strict=True))
            else:
                fetched = self.sess.run(run.fetches + extra, feed)
            clipped.extend(bool(flag) for flag in fetched[len(run.fetches):])
            triples = [fetched[k : k + 3] for k in range(0, len(run.fetches), 3)]
            causes = [(on, k) for k, (ok, loss, gnorm) in enumerate(triples)
                      if (on := non_finite(float(loss), float(gnorm), bool(ok))) is not None]
            if causes:
                on, k = min(causes, key=lambda c: (_ORDER.index(c[0]), c[1]))  # a loss before a gradient
                return Cause(on, run.losses[k] if len(self.built.losses) > 1 else None)
            losses.update((name, (float(t[1]), float(t[2]))) for name, t in zip(run.losses, triples, strict=True))
        self._add(step, losses, clipped)
        if report:
            if len(losses) > 1:
                for name, (value, gnorm) in losses.items():
                    reported[f"loss/{name}"], reported[f"loss/{name}/grad_norm"] = value, gnorm
            self.metrics = self.telemetry.report(step, reported)
            self.snapshot = Snapshot(step, tuple(raw), self.built.state_reader.unpack)
        return None

    def _add(self, step: int, losses: Mapping[str, tuple[float, float]], clipped: list[bool]) -> None:
        """Count a finite step: one loss as fetched; several as their sum and the norm of all their gradients."""
        if len(losses) == 1:
            ((loss, gnorm),) = losses.values()
            self.telemetry.add(step, loss, gnorm, clipped[0] if clipped else None)
            return
        clip = self.spec.config.clip_norm
        if not clipped and clip is not None:  # global mode: each loss clipped by its own gradients' norm
            clipped = [gnorm > clip for _, gnorm in losses.values()]
        self.telemetry.add(step, sum(v for v, _ in losses.values()), math.hypot(*(g for _, g in losses.values())),
                           any(clipped))


def _investigate(
    model: Model, stepper: Stepper, step: int, sample_ids: Sequence[int] | np.ndarray | None, info: dict[str, object],
) -> Forensics:
    """The forensics of a divergence at ``step``, with the run's telemetry points (never raises)."""
    started = time.perf_counter()
    found = investigate(model, stepper.data, stepper.spec, step, stepper.built, stepper.sess, stepper.snapshot,
                        sample_ids)
    info["forensics_seconds"] = time.perf_counter() - started
    telemetry = stepper.telemetry
    return replace(found, report_points=tuple(telemetry.points), last_steps=telemetry.last_steps())


_ORDER = (DivergedOn.LOSS, DivergedOn.GRADIENT, DivergedOn.WEIGHT)  # the order a step computes them in


@dataclass(frozen=True)
class Cause:
    """What went non-finite first at a divergence step, and of which loss (models with several)."""

    on: DivergedOn
    loss: str | None = None

    def text(self) -> str:
        """``gradient``, or ``gradient of loss "g_loss"``."""
        return cause_text(self.on, self.loss)

    def noted(self, found: Forensics) -> Forensics:
        """``found`` with the loss named first in its note (models with several losses)."""
        if self.loss is None:
            return found
        named = f"{self.text()} went non-finite first"
        return replace(found, note=f"{named}; {found.note}" if found.note else named)


def non_finite(loss: float, gnorm: float, weights_ok: bool) -> DivergedOn | None:
    """What went non-finite first at a step (loss, then gradient norm, then weights), or None."""
    if not math.isfinite(loss):
        return DivergedOn.LOSS
    if not math.isfinite(gnorm):
        return DivergedOn.GRADIENT
    if not weights_ok:
        return DivergedOn.WEIGHT
    return None


def _progress(spec: RunSpec, step: int, stepper: Stepper) -> RunRecord:
    t = stepper.telemetry
    return RunRecord(
        spec.trial, spec.seed, step, RunStatus.RUNNING, t.losses[-1], t.gnorms[-1],
        steps_survived=step, last_finite_loss=t.losses[-1], metrics=dict(stepper.metrics), phase=spec.phase,
    )


def _final(
    spec: RunSpec,
    telemetry: Telemetry,
    step: int,
    status: RunStatus,
    cause: Cause | None,
    val: float | None,
    info: Mapping[str, object],
    forensics: Forensics | None = None,
) -> RunRecord:
    last = telemetry.losses[-1] if telemetry.losses else None
    return RunRecord(
        spec.trial, spec.seed, step, status, loss=last,
        grad_norm=telemetry.gnorms[-1] if telemetry.gnorms else None,
        final=True, steps_survived=telemetry.steps, last_finite_loss=last,
        val_loss=val, diverged_on=cause.on if cause else None, diverged_loss=cause.loss if cause else None,
        metrics=telemetry.summary(), info=dict(info), forensics=forensics,
        phase=spec.phase, init_val_loss=telemetry.init_val_loss,
    )


def _finite_or_none(value: SupportsFloat) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None
