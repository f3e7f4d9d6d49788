"""Typed data that crosses between the driver and the workers.

A :class:`RunSpec` goes from the driver to a worker: one trial config on one seed. The worker
streams :class:`RunRecord` s back: a progress record every ``report_every`` steps and one final
record. The driver folds the final records of a trial's seeds into a :class:`TrialOutcome`.
Everything here is plain data (picklable, no TensorFlow, no Ray).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.knobs import DEFAULTS, GRAPH_KNOBS, TABLE


class RunStatus(enum.StrEnum):
    """How one seed run ended (or that it is still going)."""

    RUNNING = "running"
    SURVIVED = "survived"
    DIVERGED = "diverged"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Phase(enum.StrEnum):
    """Why a seed run was trained (an MLflow tag of its run, and a column of the views).

    ``search``: a trial's first seeds; ``race``: more seeds for a trial that could become the
    best; ``verify``: fresh seeds for a config about to be exported (or ``tuner verify``);
    ``margin``: the exported config at a higher learning rate, on the verification seeds.
    """

    SEARCH = "search"
    RACE = "race"
    VERIFY = "verify"
    MARGIN = "margin"


class DivergedOn(enum.StrEnum):
    """What went non-finite first at the divergence step."""

    LOSS = "loss"
    GRADIENT = "gradient"
    WEIGHT = "weight"
    VALIDATION = "validation"


def cause_text(on: DivergedOn, loss: str | None = None) -> str:
    """``gradient``, or for a model with several losses ``gradient of loss "g_loss"``."""
    if loss is None:
        return on.value
    what = {DivergedOn.GRADIENT: "gradient of ", DivergedOn.WEIGHT: "update of "}.get(on, "")
    return f'{what}loss "{loss}"'


@dataclass(frozen=True)
class TrainConfig:
    """One point of the search space: tuner's knobs plus the model's own knobs.

    Tuner's knobs are defined once, in ``tuner.knobs.TABLE`` (their types, defaults, ranges and
    how each reaches the graph); the fields below are that table's names, typed for mypy, with the
    table's defaults (``tests/test_knobs.py`` checks that they match).

    Attributes:
        learning_rate: the optimizer's learning rate.
        clip_norm: clipping threshold (of ``clip_mode``); None means no clipping.
        l2_weight: weight of the L2 term over kernels (0 means none).
        lr_decay: learning-rate factor per 1000 steps (1.0 means constant).
        optimizer: one of :data:`tuner.knobs.OPTIMIZERS` (``tf.compat.v1.train``'s Adam, RMSProp, Momentum,
            GradientDescent, Adagrad).
        momentum: momentum of ``momentum`` and ``rmsprop``; None: TensorFlow's default (0.9 for
            ``momentum``, which has none in TF; 0.0 for ``rmsprop``).
        rho: RMSProp's decay; None: 0.9.
        optimizer_epsilon: epsilon of ``adam`` and ``rmsprop``; None: TF's (1e-8, 1e-10).
        clip_mode: one of :data:`tuner.knobs.CLIP_MODES`: the global norm of all gradients, each gradient's
            own norm, or each value.
        knobs: the model's knobs, one value each.
    """

    learning_rate: float
    clip_norm: float | None = DEFAULTS["clip_norm"]
    l2_weight: float = DEFAULTS["l2_weight"]
    lr_decay: float = DEFAULTS["lr_decay"]
    optimizer: str = DEFAULTS["optimizer"]
    momentum: float | None = DEFAULTS["momentum"]
    rho: float | None = DEFAULTS["rho"]
    optimizer_epsilon: float | None = DEFAULTS["optimizer_epsilon"]
    clip_mode: str = DEFAULTS["clip_mode"]
    knobs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k in TABLE:
            value = getattr(self, k.name)
            if k.knob.kind == "categorical" and value not in k.knob.choices:
                raise ValueError(f"{k.name} {value!r}: expected one of {list(k.knob.choices)}")

    @classmethod
    def from_flat(cls, values: Mapping[str, object]) -> TrainConfig:
        """A TrainConfig from one flat mapping of knob values (the inverse of :meth:`flat`).

        Tuner's knobs left out take their defaults; a null one takes its table's ``null`` (a null
        L2 weight is 0.0); every other name is a model knob.
        """
        merged = {**DEFAULTS, **values}
        tuner_part = {k.name: k.coerce(merged[k.name]) for k in TABLE}
        return cls(**tuner_part, knobs={k: v for k, v in values.items() if k not in DEFAULTS})

    def flat(self) -> dict[str, Any]:
        """Tuner knobs then model knobs, in one flat dict (the order of best_config.yaml)."""
        tuner_part = {k.name: getattr(self, k.name) for k in TABLE}
        return {**tuner_part, **dict(self.knobs)}

    def graph_key(self) -> str:
        """What a built graph depends on besides the model: its knobs and the tuner knobs built into
        the graph, the optimizer and the clip mode (the others are fed at run time, see
        tuner.worker.graph.Hyper)."""
        return repr((sorted(self.knobs.items()), *(getattr(self, name) for name in GRAPH_KNOBS)))


@dataclass(frozen=True)
class Skip:
    """Sample indices the data preflight flagged, left out of the data of every run.

    Attributes:
        train: indices into the training arrays.
        val: indices into the validation arrays.
    """

    train: tuple[int, ...] = ()
    val: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.train or self.val)


@dataclass(frozen=True)
class RunSpec:
    """One config on one seed, as sent to a worker; ``skip`` comes from the data preflight."""

    trial: int
    seed: int
    model: str
    config: TrainConfig
    steps: int
    report_every: int = 25
    threads: int = 1
    attempt: int = 0
    skip: Skip = field(default_factory=Skip)
    phase: Phase = Phase.SEARCH


class NonFiniteKind(enum.StrEnum):
    """Where the first non-finite value of a divergence step came from."""

    FORWARD = "forward"  # the forward pass (the loss and what feeds it)
    BACKWARD = "backward"  # the gradients, their global norm or clipping
    UPDATE = "update"  # the optimizer's update of a weight
    DATA = "data"  # the step's batch held a non-finite input or label


@dataclass(frozen=True)
class Forensics:
    """Where and after what a seed run diverged (see ``tuner.worker.forensics``).

    Attributes:
        step: the divergence step.
        kind: where the first non-finite value came from; None if the replay did not find it.
        op: name of the first op whose output was non-finite while its inputs were finite (for
            ``DATA``: the input placeholder fed the bad samples).
        op_type: that op's type (``Log``, ``SqrtGrad``, ``ResourceApplyAdam``, ...).
        layer: the name scope the op belongs to (``layer2``, ``recompute_input``), if any.
        iteration: the loop iteration (from an ``iter_<k>`` scope), if any.
        forward_op: for a gradient op, the forward op it differentiates.
        samples: for ``DATA``: dataset indices of the batch's non-finite samples.
        nonfinite_ops: the first few ops with a non-finite output, in graph order.
        replayed_from: the step whose weights the replay started from.
        note: what went wrong with the analysis, if anything.
        report_points: the last report points before the divergence (metric name -> value).
        last_steps: (step, loss, grad_norm) of the last steps before the divergence.
    """

    step: int
    kind: NonFiniteKind | None = None
    op: str | None = None
    op_type: str | None = None
    layer: str | None = None
    iteration: int | None = None
    forward_op: str | None = None
    samples: tuple[int, ...] = ()
    nonfinite_ops: tuple[str, ...] = ()
    replayed_from: int | None = None
    note: str = ""
    report_points: tuple[Mapping[str, float], ...] = ()
    last_steps: tuple[tuple[int, float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (the ``divergence.json`` artifact)."""
        doc = asdict(self)
        doc["kind"] = self.kind.value if self.kind else None
        doc["samples"], doc["nonfinite_ops"] = list(self.samples), list(self.nonfinite_ops)
        doc["report_points"] = [dict(p) for p in self.report_points]
        doc["last_steps"] = [list(s) for s in self.last_steps]
        return doc


@dataclass(frozen=True)
class RunRecord:
    """A progress or final record of one seed run.

    ``step`` is 1-based: step k is the k-th training step. For a diverged run, ``step`` is the
    divergence step (the first step with a non-finite value) and ``steps_survived`` is
    ``step - 1``. A progress record's ``metrics`` are the telemetry of its step; a final record's
    are the run's summary, and a diverged run's final record carries its ``forensics``.
    ``init_val_loss`` is the validation loss at initialisation, measured once per run before the
    first step (final records only): a run whose ``val_loss`` is not below it did not learn.
    """

    trial: int
    seed: int
    step: int
    status: RunStatus
    loss: float | None = None
    grad_norm: float | None = None
    final: bool = False
    steps_survived: int = 0
    last_finite_loss: float | None = None
    val_loss: float | None = None
    diverged_on: DivergedOn | None = None
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)
    forensics: Forensics | None = None
    phase: Phase = Phase.SEARCH
    init_val_loss: float | None = None
    diverged_loss: str | None = None  # a model with several losses: the one that went non-finite first

    @property
    def cause(self) -> str | None:
        """What went non-finite first, in words (:func:`cause_text`); None if nothing did."""
        return cause_text(self.diverged_on, self.diverged_loss) if self.diverged_on else None


class TrialState(enum.StrEnum):
    """How a trial ended: the MLflow ``status`` tag (the value) and, through it, the Optuna state.

    ``SURVIVED``: every seed trained to the end (Optuna COMPLETE, with its value); ``DIVERGED``: a
    seed hit a NaN/Inf (Optuna PRUNED, at the divergence step); ``STOPPED``: finite, but the pruner
    stopped it because its loss was behind (Optuna PRUNED too, and never counted as a divergence);
    ``FAILED``: a run crashed or was lost (Optuna FAIL).
    """

    SURVIVED = "survived"
    DIVERGED = "diverged"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class TrialOutcome:
    """What became of one trial: its config, its state and each seed's final record."""

    number: int
    config: TrainConfig
    state: TrialState
    seeds: tuple[RunRecord, ...]
    value: float | None = None
    reason: str = ""
    phase: Phase = Phase.SEARCH

    @property
    def learned(self) -> bool | None:
        """Whether it learned on every seed: each survivor's validation loss below its own loss at
        initialisation (and so the mean below the mean).

        A config that ends above its starting loss on some seeds (0.2 on four, 19 on four, from
        4.85 at initialisation: a mean of 4.848 that looked "learned") is not one to race or export;
        counted as learned, its spread made every better trial "within one standard error" of it,
        and no other trial was raced. None when unknown (a trial that did not survive, or a run from
        a worker that did not measure it).
        """
        init = self.init_val_loss
        if self.value is None or init is None or any(r.init_val_loss is None for r in self.seeds):
            return None
        every_seed = all(r.val_loss < r.init_val_loss for r in self.seeds
                         if r.val_loss is not None and r.init_val_loss is not None)
        return every_seed and self.value < init

    @property
    def init_val_loss(self) -> float | None:
        """The validation loss at initialisation, mean over seeds (None if not measured)."""
        inits = [r.init_val_loss for r in self.seeds if r.init_val_loss is not None]
        return sum(inits) / len(inits) if inits else None

    @property
    def steps_survived(self) -> tuple[int, ...]:
        """Steps survived per seed, in seed order."""
        return tuple(r.steps_survived for r in self.seeds)

    @property
    def divergence(self) -> RunRecord | None:
        """The seed run that diverged first (lowest step), if any."""
        diverged = [r for r in self.seeds if r.status is RunStatus.DIVERGED]
        return min(diverged, key=lambda r: r.step) if diverged else None
