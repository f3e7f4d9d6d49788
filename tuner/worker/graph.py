"""Graph building: a model's graph with tuner's optimizer, L2 term, clipping and checks added.

Only workers import this module (it imports TensorFlow). :func:`build` adds, to the graph a model
builds, what every step of ``tuner.worker.train`` fetches in the same ``session.run`` as the train op:
the loss, the unclipped global gradient norm and a finiteness flag of the updated weights, and on
report steps the gradient norm of each weight, the largest |value| of each watched tensor and a
snapshot of every variable after the update (:class:`StateReader`, :class:`Snapshot`), so a
divergence can be replayed from there (``tuner.worker.forensics``).

A model with several named losses (``ModelGraph.losses``) gets an optimizer, an L2 term and
clipping per loss, each under a name scope of the loss's name; a step is one ``session.run``
(simultaneous updates) or one per loss (alternating, :class:`TrainRun`), and each fetches its
losses' values, gradient norms and updated-weights flags, so the first non-finite one names its
loss. A model with one loss builds exactly as before, without such scopes.

Graph reuse: tuner's own knobs, but the optimizer and the clip mode, are fed at run time
(:class:`Hyper`, its inputs from ``tuner.knobs.TABLE``), so the graph depends only on the model's
knobs, the optimizer and the clip mode. A worker keeps the graphs of the last few model configs
(:class:`Graphs`) and, for a run on another seed, sets the seed attribute of every random op (and
the constant seeding each Keras initializer) to what a fresh build with that seed would give
(:func:`reseed`, ``tuner.worker.seeding``) and opens a new session: the variables start from the
same values as after a fresh build, so results do not change, and the build (about half of a
600-step run at ``max_iter`` 10) is paid once per config and worker.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from tuner.hooks import BuildStopped, stop_checks, stoppable_graph
from tuner.knobs import INPUTS, OPTIMIZER_DEFAULTS, run_inputs
from tuner.models.base import STEP_SEED, Loss, Model, ModelGraph
from tuner.records import TrainConfig
from tuner.worker.seeding import MAXINT32, python_seeded, random_ops, reseed_consts, reseed_ops

__all__ = [
    "DECAY_STEPS", "OPTIMIZER_DEFAULTS", "UPDATED_SCOPE", "BuildStopped", "Built", "Graphs", "Hyper", "Snapshot",
    "StateReader", "TrainRun", "build", "make_optimizer", "metric_name", "reseed", "session_config",
]

tf1 = tf.compat.v1

DECAY_STEPS = 1000  # lr_decay is the learning-rate factor per this many steps
NO_GATE = tf1.train.Optimizer.GATE_NONE  # gating adds ~300 group ops per graph and ~0.5 s of build
UPDATED_SCOPE = "updated"  # reads of the weights after the update (tuner.worker.forensics knows the name)


class Hyper:
    """Tuner's own knobs as one variable that each run sets (:meth:`set`) before its first step:
    the graph does not depend on them (the optimizer and the clip mode, which do, key the graph).

    A variable, not placeholders: feeding 8 scalars costs ~0.1 ms a step (a tenth of a small
    model's step), one assign per run costs nothing. It is in no collection, so neither the
    initializer nor the snapshot of the state touches it. Each knob is used so that its "off" value
    gives exactly the arithmetic of a graph without it: L2 weight 0 adds ``0 * sum`` (+0.0),
    clipping off scales the gradients by 1.0, decay 1.0 gives ``lr * 1.0``.
    """

    NAMES = INPUTS  # from tuner.knobs.TABLE: learning_rate, clip_norm, clip_on, l2_weight, ...

    def __init__(self) -> None:
        with tf.name_scope("hyper"):
            self._values = tf1.placeholder(tf.float32, [len(self.NAMES)], name="values")
            var = tf1.Variable(tf.zeros([len(self.NAMES)]), trainable=False, collections=[], name="tuner_hyper")
            self.assign = var.assign(self._values)
            self.inputs: dict[str, tf.Tensor] = dict(zip(self.NAMES, tf.unstack(var.value()), strict=True))
        read = self.inputs
        self.learning_rate, self.lr_decay, self.clip_norm = read["learning_rate"], read["lr_decay"], read["clip_norm"]
        self.clip_on = read["clip_on"] > 0.5
        self.l2_weight, self.momentum, self.rho, self.epsilon = (
            read["l2_weight"], read["momentum"], read["rho"], read["epsilon"])

    def values(self, config: TrainConfig) -> list[float]:
        """The values of ``config``, in the order of :attr:`NAMES` (null optimizer knobs: TF's defaults)."""
        return run_inputs(config.flat(), config.optimizer)

    def set(self, sess: tf.compat.v1.Session, config: TrainConfig) -> None:
        """Give the knobs ``config``'s values in ``sess``."""
        sess.run(self.assign, {self._values: np.asarray(self.values(config), np.float32)})


def make_optimizer(name: str, hyper: Hyper | _Fixed, learning_rate: tf.Tensor) -> tf.compat.v1.train.Optimizer:
    """The ``tf.compat.v1.train`` optimizer ``name``, its knobs fed from ``hyper`` (or fixed)."""
    if name == "adam":
        return tf1.train.AdamOptimizer(learning_rate, epsilon=hyper.epsilon)
    if name == "rmsprop":
        return tf1.train.RMSPropOptimizer(learning_rate, decay=hyper.rho, momentum=hyper.momentum,
                                          epsilon=hyper.epsilon)
    if name == "momentum":
        return tf1.train.MomentumOptimizer(learning_rate, momentum=hyper.momentum)
    if name == "sgd":
        return tf1.train.GradientDescentOptimizer(learning_rate)
    if name == "adagrad":
        return tf1.train.AdagradOptimizer(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}")


@dataclass(frozen=True)
class TrainRun:
    """One ``session.run`` of a train step: the updates of one or more losses, and their checks.

    A model with one loss, or several updated simultaneously, has one per step; several losses
    updated alternately have one each, in order (see ``tuner.models.Loss``).
    """

    losses: tuple[str, ...]  # the losses it updates, in order
    fetches: tuple[tf.Tensor, ...]  # per loss: (its weights finite after the update, the loss, its gradient norm)
    report_names: tuple[str, ...]  # the metrics of report steps, in the order of report_values
    report_values: tf.Tensor  # float32 vector fetched with the train op on report steps
    clipped: tf.Tensor | None  # bool: this step's clipping changed a gradient (None: the driver tells, global mode)


@dataclass
class Built:
    """A model graph with tuner's optimizer, L2 term, clipping and checks added."""

    graph: tf.Graph
    model: ModelGraph
    runs: tuple[TrainRun, ...]  # the session.runs of one train step, in order
    val_loss: tf.Tensor
    state: list[tf.Variable]  # every global variable (weights, Adam slots, global step): the snapshot
    state_reader: StateReader  # fetched with the last run of a step: the state after the step
    hyper: Hyper
    init: tf.Operation  # the initializer of every global variable
    seed: int  # the graph-level seed its random ops now carry (see reseed)
    random_ops: list[tuple[tf.Operation, int]] = field(default_factory=list)  # (op, its op seed): every random op
    seed_consts: list[tuple[tf.Operation, int]] = field(default_factory=list)  # (Const, its Python draw): Keras' seeds
    step_seed: tf.Tensor | None = None  # the model's step_seed() placeholder, if it made one
    reusable: bool = True  # its random ops' seeds follow TensorFlow's rule, so reseed gives a fresh build's
    # gradient tensor name -> the variable it is the gradient of (op name): what a norm over it names
    gradient_of: dict[str, str] = field(default_factory=dict)

    @property
    def losses(self) -> tuple[str, ...]:
        """The names of the losses it trains (``("loss",)`` for a model with one)."""
        return tuple(name for run in self.runs for name in run.losses)

    @property
    def train_fetches(self) -> tuple[tf.Tensor, ...]:
        """``(weights_ok, loss, grad_norm)`` of a one-loss model's step (see :attr:`runs` for several)."""
        if len(self.runs) != 1:
            raise ValueError("an alternating multi-loss step is several session.runs: use Built.runs")
        return self.runs[0].fetches

    @property
    def clipped(self) -> tf.Tensor | None:
        """The clip flag of a one-run step (None in global clip mode)."""
        self.train_fetches  # noqa: B018  (raises for several runs)
        return self.runs[0].clipped

    def start(self, sess: tf.compat.v1.Session, config: TrainConfig) -> None:
        """Initialise every variable in ``sess`` and set tuner's knobs to ``config``'s."""
        sess.run(self.init)
        self.hyper.set(sess, config)

    def feed(self, arrays: Sequence[np.ndarray], seed: int = 0, step: int = 0) -> dict[tf.Tensor, np.ndarray]:
        """A feed dict: the model's placeholders from ``arrays``, and the model's
        :func:`~tuner.models.base.step_seed` (if it made one) from ``seed`` and ``step``."""
        feed: dict[tf.Tensor, np.ndarray] = dict(zip(self.model.inputs, arrays, strict=True))
        if self.step_seed is not None:
            feed[self.step_seed] = np.array([seed % MAXINT32, step], np.int32)
        return feed


def build(model: Model, config: TrainConfig, seed: int, should_stop: Callable[[], bool] | None = None) -> Built:
    """Build the model into a fresh graph and add what tuner owns (see tuner.models.base).

    Raises:
        BuildStopped: ``should_stop()`` turned true during the build.
        ValueError: a loss is not a scalar, or trains no variable.
    """
    graph = tf.Graph() if should_stop is None else stoppable_graph(should_stop)
    with graph.as_default():
        tf1.set_random_seed(seed)
        with python_seeded(seed):
            mg = model.build(config.knobs)
        losses = mg.all_losses()
        for name, loss in losses.items():
            _check_scalar(loss.tensor, f'loss "{name}"' if mg.losses else "loss")
        hyper = Hyper()
        step = tf1.train.get_or_create_global_step()
        learning_rate = _learning_rate(hyper, step)
        trainable = tf1.trainable_variables()
        parts = [_LossPart(name, loss, trainable, config, hyper, learning_rate, bool(mg.losses))
                 for name, loss in losses.items()]
        runs, train_op = _train_runs(parts, mg, step)
        val_loss = mg.val_loss if mg.val_loss is not None else _reported_loss(mg)
        state = tf1.global_variables()
        with tf.control_dependencies([train_op]):
            reader = StateReader(state)  # read after the update, when fetched with the (last) train op
        init = tf1.global_variables_initializer()
    stop_checks(graph)  # the run's cancel flag is not asked again by ops made later in this graph
    seeded_ops, seed_consts, reusable = random_ops(graph, seed)
    try:
        step_seed = graph.get_tensor_by_name(STEP_SEED + ":0")
    except KeyError:
        step_seed = None
    gradient_of = {(g.values if isinstance(g, tf.IndexedSlices) else g).name: v.op.name
                   for part in parts for g, v in part.pairs}
    return Built(graph, mg, runs, val_loss, state, reader, hyper, init, seed,
                 random_ops=seeded_ops, seed_consts=seed_consts, reusable=reusable, step_seed=step_seed,
                 gradient_of=gradient_of)


class _Fixed:
    """TensorFlow's own momentum, rho and epsilon of optimizer ``name`` (a loss's own optimizer)."""

    def __init__(self, name: str) -> None:
        defaults = OPTIMIZER_DEFAULTS[name]
        self.momentum, self.rho, self.epsilon = (defaults.get(k, 0.0) for k in ("momentum", "rho", "epsilon"))


class _LossPart:
    """One loss's share of the graph: its optimizer, L2 term, gradients, clipping and telemetry.

    A model with several losses gets each under a name scope of the loss's name (``g_loss/gradients/...``,
    ``g_loss/Adam/...``), so forensics names the loss of a tuner op; a model with one loss gets none.
    """

    def __init__(self, name: str, loss: Loss, trainable: list[tf.Variable], config: TrainConfig, hyper: Hyper,
                 learning_rate: tf.Tensor, scoped: bool) -> None:
        self.name, self.loss, self.scoped = name, loss, scoped
        variables = loss.variables(trainable)
        if not variables:
            raise ValueError(f'loss "{name}" trains no variable: its trains= ({loss.describe_trains()}) matches none '
                             f"of the trainable variables {[v.op.name for v in trainable][:8]}")
        kind = loss.optimizer or config.optimizer
        with self.scope():
            total = loss.tensor + _l2_term(variables, hyper.l2_weight)
            rate = learning_rate if loss.lr_factor == 1.0 else learning_rate * loss.lr_factor
            self.optimizer = make_optimizer(kind, hyper if kind == config.optimizer else _Fixed(kind), rate)
            grads_and_vars = self.optimizer.compute_gradients(total, variables, gate_gradients=NO_GATE)
            self.pairs = [(g, v) for g, v in grads_and_vars if g is not None]
            grads = [g for g, _ in self.pairs]
            self.grad_norm = tf.linalg.global_norm(grads)
            self.grads, self.clipped = _clip(grads, self.grad_norm, hyper, config.clip_mode)

    def scope(self) -> contextlib.AbstractContextManager[str | None]:
        """The loss's name scope (re-entered exactly), or none for a model's only loss."""
        return tf.name_scope(self.name + "/") if self.scoped else contextlib.nullcontext()

    def apply(self, step: tf.Variable | None) -> tf.Operation:
        """The update of the loss's weights (incrementing ``step`` when given)."""
        with self.scope():
            return self.optimizer.apply_gradients(zip(self.grads, [v for _, v in self.pairs], strict=True), step)

    def fetches(self, train_op: tf.Operation) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(its weights finite after ``train_op``, the loss, its unclipped gradient norm)."""
        with tf.control_dependencies([train_op]), self.scope(), tf.name_scope(UPDATED_SCOPE):
            finite = [tf.reduce_all(tf.math.is_finite(v.read_value())) for _, v in self.pairs]
            weights_ok = tf.reduce_all(tf.stack(finite))
        return weights_ok, self.loss.tensor, self.grad_norm


def _train_runs(parts: list[_LossPart], mg: ModelGraph, step: tf.Variable) -> tuple[tuple[TrainRun, ...], tf.Operation]:
    """The session.runs of a train step (one, or one per loss when alternating) and the last train op.

    The last update of a step increments the global step. Simultaneous updates of several losses
    wait for every gradient, so no loss sees a weight another one already updated.
    """
    groups = [parts] if mg.update == "simultaneous" else [[p] for p in parts]
    runs, train_op = [], None
    for i, group in enumerate(groups):
        last = i == len(groups) - 1
        waits = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        if len(group) > 1:
            waits = waits + [g.op for p in group for g in p.grads]
        with tf.control_dependencies(waits):
            applies = [p.apply(step if last and j == len(group) - 1 else None) for j, p in enumerate(group)]
        train_op = applies[0] if len(applies) == 1 else tf.group(*applies, name="train_step")
        fetches = tuple(f for p in group for f in p.fetches(train_op))
        names, values = _joined_reports(group, mg.watch if i == 0 else {})
        flags = [p.clipped for p in group if p.clipped is not None]
        clipped = (flags[0] if len(flags) == 1 else tf.reduce_any(tf.stack(flags))) if flags else None
        runs.append(TrainRun(tuple(p.name for p in group), fetches, names, values, clipped))
    return tuple(runs), train_op


def _joined_reports(group: list[_LossPart], watch: Mapping[str, tf.Tensor]) -> tuple[tuple[str, ...], tf.Tensor]:
    """The report metrics of the losses of one run (per-weight gradient norms; ``grad_norm/g_loss/...``
    for a model with several losses) and of the watched tensors, as one vector."""
    return _report_tensors([(f"{p.name}/" if p.scoped else "", g, v) for p in group for g, v in p.pairs], watch)


def _reported_loss(mg: ModelGraph) -> tf.Tensor:
    """The training loss a run reports: the model's loss, or the sum of its losses."""
    if mg.loss is not None:
        return mg.loss
    return tf.add_n([loss.tensor for loss in mg.losses.values()], name="sum_of_losses")


def reseed(built: Built, seed: int) -> None:
    """Give every random op of ``built`` the seeds a fresh build with graph seed ``seed`` would give.

    Takes effect in sessions opened afterwards (a session reads the graph when it first runs).
    """
    if not built.reusable:
        raise ValueError("this graph's random ops do not follow the graph seed; build it afresh")
    reseed_ops(built.random_ops, seed)
    reseed_consts(built.seed_consts, seed)
    built.seed = seed


class Graphs:
    """The built graphs of the last ``size`` model configs of one worker, reseeded for each run.

    A graph is keyed by its model (the object) and the model's knob values; tuner's own knobs are
    fed (:class:`Hyper`). Graphs whose random ops cannot be reseeded exactly are not kept.
    """

    def __init__(self, size: int = 3) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[int, str], tuple[Model, Built]] = OrderedDict()

    def get(self, model: Model, config: TrainConfig, seed: int,
            should_stop: Callable[[], bool] | None = None) -> tuple[Built, bool]:
        """A graph of ``model`` at ``config.knobs`` seeded with ``seed``, and whether it was reused.

        Raises:
            BuildStopped: ``should_stop()`` turned true during a build.
        """
        key = (id(model), config.graph_key())
        kept = self._kept.get(key)
        if kept is not None and kept[0] is model:
            self._kept.move_to_end(key)
            built = kept[1]
            reseed(built, seed)
            return built, True
        built = build(model, config, seed, should_stop)
        if built.reusable and self.size > 0:
            self._kept[key] = (model, built)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return built, False

    def clear(self) -> None:
        """Forget every kept graph."""
        self._kept.clear()


def _report_tensors(pairs: list[tuple[str, tf.Tensor | tf.IndexedSlices, tf.Variable]],
                    watch: Mapping[str, tf.Tensor]) -> tuple[tuple[str, ...], tf.Tensor]:
    """Per-weight gradient norms (before clipping) and the largest |value| of each watched tensor.

    ``pairs``: (metric prefix, gradient, variable). Stacked into one vector: one fetch costs ~15 us,
    so 25 separate scalars would cost more than what they measure.
    """
    with tf.name_scope("telemetry"):
        report = {f"grad_norm/{prefix}{metric_name(v.name)}": tf.linalg.global_norm([g]) for prefix, g, v in pairs}
        report.update({metric_name(name): tf.reduce_max(tf.abs(t)) for name, t in watch.items()})
        values = [tf.cast(t, tf.float32) for t in report.values()]
        vector = tf.stack(values) if values else tf.zeros([0])
    return tuple(report), vector


class StateReader:
    """Reads every variable in one fetch per dtype (the variables concatenated, flat), and unpacks them.

    One fetch per variable would cost ~15 us each, every report step; the unpacking waits for a
    replay.
    """

    def __init__(self, variables: Sequence[tf.Variable]) -> None:
        # dtype (or a variable of unknown shape) -> variables
        groups: dict[tf.DType | tf.Variable, list[tf.Variable]] = {}
        for v in variables:
            key = v.dtype.base_dtype if v.shape.is_fully_defined() else v
            groups.setdefault(key, []).append(v)
        self.fetches: list[tf.Tensor] = []
        self.layout: list[tuple[str, int, int, tuple[int, ...] | None]] = []  # name, fetch, start, shape
        with tf.name_scope("snapshot_read"):
            for members in groups.values():
                if not members[0].shape.is_fully_defined():
                    self.layout.append((members[0].name, len(self.fetches), -1, None))
                    self.fetches.append(members[0].read_value())
                    continue
                start = 0
                for v in members:
                    self.layout.append((v.name, len(self.fetches), start, tuple(v.shape.as_list())))
                    start += v.shape.num_elements()
                self.fetches.append(tf.concat([tf.reshape(v, [-1]) for v in members], axis=0))

    def unpack(self, values: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Variable name -> value, from the fetched ``values`` of :attr:`fetches`."""
        out = {}
        for name, fetch, start, shape in self.layout:
            if shape is None:
                out[name] = values[fetch]
            else:
                out[name] = values[fetch][start : start + int(np.prod(shape))].reshape(shape)
        return out



@dataclass(frozen=True)
class Snapshot:
    """Every global variable (weights, Adam slots, global step) as it was after ``step``.

    Kept as fetched (one flat array per dtype, see :class:`StateReader`), unpacked only for a
    replay; the snapshot of step 0 (after init) is read variable by variable, once.
    """

    step: int
    raw: tuple[np.ndarray, ...]
    unpack: Callable[[Sequence[np.ndarray]], dict[str, np.ndarray]]

    def values(self) -> dict[str, np.ndarray]:
        """Variable name -> value."""
        return self.unpack(self.raw)


def metric_name(name: str) -> str:
    """A tensor or variable name as an MLflow metric key: ``layer0/kernel:0`` -> ``layer0/kernel``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name.removesuffix(":0"))


def _check_scalar(tensor: object, what: str) -> None:
    shape = getattr(tensor, "shape", None)
    if shape is None or shape.rank != 0:
        raise ValueError(f"the model's {what} must be a scalar tensor, got shape {shape}")


def _l2_term(variables: list[tf.Variable], weight: tf.Tensor) -> tf.Tensor:
    kernels = [v for v in variables if v.shape.rank is not None and v.shape.rank >= 2]
    if not kernels:
        return tf.constant(0.0)
    with tf.name_scope("l2"):
        return weight * tf.add_n([tf.nn.l2_loss(k) for k in kernels])


def _learning_rate(hyper: Hyper, step: tf.Variable) -> tf.Tensor:
    """``lr * decay ** (step / DECAY_STEPS)``, as ``exponential_decay`` (decay 1.0: exactly ``lr``)."""
    with tf.name_scope("learning_rate"):
        progress = tf.cast(step, tf.float32) / DECAY_STEPS
        return hyper.learning_rate * tf.pow(hyper.lr_decay, progress)


def _clip(grads: list[tf.Tensor | tf.IndexedSlices], norm: tf.Tensor, hyper: Hyper,
          mode: str) -> tuple[list[tf.Tensor | tf.IndexedSlices], tf.Tensor | None]:
    """Clip the gradients when ``hyper.clip_on``; else leave them exactly as they are.

    ``global``: all scaled by ``clip / global norm`` when above, as ``tf.clip_by_global_norm``;
    ``per_tensor``: each by its own norm, as ``tf.clip_by_norm``; ``value``: each value into
    ``[-clip, clip]``, as ``tf.clip_by_value``. Returns the gradients and, except in ``global``
    mode (the driver compares the global norm itself), a bool tensor: some gradient was clipped.
    """
    clip = hyper.clip_norm
    with tf.name_scope("clip_by_global_norm"):  # tuner.worker.forensics counts it as backward
        if mode == "global":
            scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)  # a NaN norm gives NaN, as TF
            return [_scaled(g, tf.where(hyper.clip_on, scale, 1.0)) for g in grads], None
        out, hit = [], []
        for g in grads:
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            if mode == "per_tensor":
                own = tf.norm(values)
                hit.append(own > clip)
                new = _scaled(g, tf.where(hyper.clip_on, clip * tf.minimum(1.0 / own, 1.0 / clip) + (own - own), 1.0))
            else:
                hit.append(tf.reduce_any(tf.abs(values) > clip))
                cut = tf.where(hyper.clip_on, tf.clip_by_value(values, -clip, clip), values)
                new = tf.IndexedSlices(cut, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices) else cut
            out.append(new)
        clipped = tf.logical_and(hyper.clip_on, tf.reduce_any(tf.stack(hit))) if hit else tf.constant(False)
        return out, clipped


def _scaled(g: tf.Tensor | tf.IndexedSlices, scale: tf.Tensor) -> tf.Tensor | tf.IndexedSlices:
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * tf.cast(scale, g.dtype), g.indices, g.dense_shape)
    return g * tf.cast(scale, g.dtype)


def session_config(threads: int, gpu: bool) -> tf.compat.v1.ConfigProto:
    """Session settings for one slot: its CPU count as threads; GPU memory grown as needed."""
    proto = tf1.ConfigProto(
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads,
        allow_soft_placement=True,
    )
    proto.gpu_options.allow_growth = gpu
    # Grappler's graph rewrites cost ~0.8 s on the first step of every run and do not pay that
    # back over a few hundred ~3 ms steps (measured when it was turned off, commit 6a04183); runs here are short.
    proto.graph_options.rewrite_options.disable_meta_optimizer = True
    return proto
