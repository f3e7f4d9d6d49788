"""The training loop of one seed run: TF1 graph mode, a fresh graph per run.

Only workers import this module (it imports TensorFlow). Every step runs the train op and fetches
the loss, the unclipped global gradient norm and a finiteness flag of the updated weights in the
same ``session.run``, so the first non-finite value is caught at its exact step at no extra cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from tuner.models.base import Dataset, Model, ModelGraph
from tuner.records import DivergedOn, RunRecord, RunSpec, RunStatus, TrainConfig

tf1 = tf.compat.v1

DECAY_STEPS = 1000  # lr_decay is the learning-rate factor per this many steps
NO_GATE = tf1.train.Optimizer.GATE_NONE  # gating adds ~300 group ops per graph and ~0.5 s of build


@dataclass
class Built:
    """A model graph with tuner's optimizer, L2 term, clipping and checks added."""

    graph: tf.Graph
    model: ModelGraph
    train_fetches: tuple[Any, ...]  # (weights_finite, loss, grad_norm) after the train op
    val_loss: Any


def build(model: Model, config: TrainConfig, seed: int) -> Built:
    """Build the model into a fresh graph and add what tuner owns (see tuner.models.base)."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        mg = model.build(config.knobs)
        _check_scalar(mg.loss, "loss")
        variables = tf1.trainable_variables()
        total = mg.loss + _l2_term(variables, config.l2_weight)
        step = tf1.train.get_or_create_global_step()
        optimizer = tf1.train.AdamOptimizer(_learning_rate(config, step))
        grads_and_vars = optimizer.compute_gradients(total, variables, gate_gradients=NO_GATE)
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        grads = [g for g, _ in pairs]
        grad_norm = tf.linalg.global_norm(grads)
        if config.clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, config.clip_norm, use_norm=grad_norm)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = optimizer.apply_gradients(zip(grads, [v for _, v in pairs], strict=True), step)
        with tf.control_dependencies([train_op]):
            finite = [tf.reduce_all(tf.math.is_finite(v.read_value())) for _, v in pairs]
            weights_ok = tf.reduce_all(tf.stack(finite))
        val_loss = mg.val_loss if mg.val_loss is not None else mg.loss
    return Built(graph, mg, (weights_ok, mg.loss, grad_norm), val_loss)


def _check_scalar(tensor: Any, what: str) -> None:
    shape = getattr(tensor, "shape", None)
    if shape is None or shape.rank != 0:
        raise ValueError(f"the model's {what} must be a scalar tensor, got shape {shape}")


def _l2_term(variables: list[Any], weight: float) -> Any:
    kernels = [v for v in variables if v.shape.rank is not None and v.shape.rank >= 2]
    if weight <= 0 or not kernels:
        return tf.constant(0.0)
    return weight * tf.add_n([tf.nn.l2_loss(k) for k in kernels])


def _learning_rate(config: TrainConfig, step: Any) -> Any:
    if config.lr_decay == 1.0:
        return config.learning_rate
    return tf1.train.exponential_decay(config.learning_rate, step, DECAY_STEPS, config.lr_decay)


def session_config(threads: int, gpu: bool) -> Any:
    """Session settings for one slot: its CPU count as threads; GPU memory grown as needed."""
    proto = tf1.ConfigProto(
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads,
        allow_soft_placement=True,
    )
    proto.gpu_options.allow_growth = gpu
    # Grappler's graph rewrites cost ~0.8 s on the first step of every run and do not pay that
    # back over a few hundred ~3 ms steps (bench/step_cost.py); runs here are short.
    proto.graph_options.rewrite_options.disable_meta_optimizer = True
    return proto


def train_run(
    model: Model,
    data: Dataset,
    spec: RunSpec,
    should_stop: Callable[[], bool] = lambda: False,
    info: Mapping[str, Any] | None = None,
) -> Iterator[RunRecord]:
    """Train one seed run; yield a progress record every ``spec.report_every`` steps, then a final one.

    Stops at the first step whose loss, gradient norm or updated weights are non-finite. Stops
    early (final status CANCELLED) when ``should_stop()`` turns true; it is checked at each report.
    """
    built = build(model, spec.config, spec.seed)
    inputs = list(built.model.inputs)
    stats = _Stats(spec.config.clip_norm)
    info = dict(info or {})
    with tf1.Session(graph=built.graph, config=session_config(spec.threads, gpu=True)) as sess:
        sess.run(tf1.global_variables_initializer())
        started = time.perf_counter()
        for step in range(1, spec.steps + 1):
            batch = data.batch(step, spec.seed)
            weights_ok, loss, gnorm = sess.run(built.train_fetches, dict(zip(inputs, batch, strict=True)))
            cause = _non_finite(float(loss), float(gnorm), bool(weights_ok))
            if cause is not None:
                yield stats.final(spec, step, RunStatus.DIVERGED, cause, None, info)
                return
            stats.add(float(loss), float(gnorm))
            if step % spec.report_every == 0 or step == spec.steps:
                yield stats.progress(spec, step)
                if should_stop():
                    yield stats.final(spec, step, RunStatus.CANCELLED, None, None, info)
                    return
        info["train_seconds"] = time.perf_counter() - started
        val = float(sess.run(built.val_loss, dict(zip(inputs, data.val, strict=True))))
    if not math.isfinite(val):
        yield stats.final(spec, spec.steps, RunStatus.DIVERGED, DivergedOn.VALIDATION, None, info)
        return
    yield stats.final(spec, spec.steps, RunStatus.SURVIVED, None, val, info)


def _non_finite(loss: float, gnorm: float, weights_ok: bool) -> DivergedOn | None:
    if not math.isfinite(loss):
        return DivergedOn.LOSS
    if not math.isfinite(gnorm):
        return DivergedOn.GRADIENT
    if not weights_ok:
        return DivergedOn.WEIGHT
    return None


class _Stats:
    """Running per-step numbers of one run, summarised into records."""

    def __init__(self, clip_norm: float | None) -> None:
        self.clip_norm = clip_norm
        self.losses: list[float] = []
        self.gnorms: list[float] = []

    def add(self, loss: float, gnorm: float) -> None:
        self.losses.append(loss)
        self.gnorms.append(gnorm)

    def clip_fraction(self) -> float:
        if self.clip_norm is None or not self.gnorms:
            return 0.0
        return float(np.mean(np.asarray(self.gnorms) > self.clip_norm))

    def progress(self, spec: RunSpec, step: int) -> RunRecord:
        metrics = {"clip_fraction": self.clip_fraction()}
        return RunRecord(
            spec.trial, spec.seed, step, RunStatus.RUNNING, self.losses[-1], self.gnorms[-1],
            steps_survived=step, last_finite_loss=self.losses[-1], metrics=metrics,
        )

    def final(
        self,
        spec: RunSpec,
        step: int,
        status: RunStatus,
        cause: DivergedOn | None,
        val: float | None,
        info: Mapping[str, Any],
    ) -> RunRecord:
        survived = len(self.losses)
        return RunRecord(
            spec.trial, spec.seed, step, status,
            loss=self.losses[-1] if self.losses else None,
            grad_norm=self.gnorms[-1] if self.gnorms else None,
            final=True, steps_survived=survived,
            last_finite_loss=self.losses[-1] if self.losses else None,
            val_loss=val, diverged_on=cause, metrics=self.summary(), info=dict(info),
        )

    def summary(self) -> dict[str, float]:
        if not self.gnorms:
            return {}
        g = np.asarray(self.gnorms)
        p50, p90, p99 = np.percentile(g, [50, 90, 99])
        return {
            "grad_norm_max": float(g.max()), "grad_norm_p50": float(p50),
            "grad_norm_p90": float(p90), "grad_norm_p99": float(p99),
            "clip_fraction": self.clip_fraction(),
        }
