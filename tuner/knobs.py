"""Tuner's own knobs, defined once: what tuner adds to the training of every model.

:data:`TABLE` holds one :class:`TunerKnob` per knob: its type, default, valid range and help (a
:class:`~tuner.models.base.Knob`, like a model's own knobs), what a null value becomes in a
:class:`~tuner.records.TrainConfig`, and how the knob reaches the graph. Either it is fed at run
time (``inputs``: the values it sets in ``tuner.worker.graph.Hyper``, one variable that each run
assigns, so a graph is reused across these knobs), or it changes the graph that is built (no
``inputs``: the optimizer and the clip mode, part of ``TrainConfig.graph_key``).

Everything else derives from the table: the search spaces' :data:`TUNER_KNOBS`, TrainConfig's
defaults, its flat form and ``from_flat``, its graph key, and the graph's run-time inputs
(:data:`INPUTS`, :func:`run_inputs`). TrainConfig's fields are typed by hand (mypy reads them);
``tests/test_knobs.py`` checks that they, the spaces and the graph's inputs name the same knobs.
Plain data: no TensorFlow here (the worker's graph module reads it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tuner.models.base import Knob

OPTIMIZERS = ("adam", "rmsprop", "momentum", "sgd", "adagrad")  # tf.compat.v1.train's, by tuner's names
CLIP_MODES = ("global", "per_tensor", "value")  # clip_by_global_norm, clip_by_norm per tensor, clip_by_value

# TensorFlow's defaults of the optimizer knobs a config leaves null (momentum has no TF default: 0.9)
OPTIMIZER_DEFAULTS: dict[str, dict[str, float]] = {
    "adam": {"epsilon": 1e-8}, "rmsprop": {"rho": 0.9, "momentum": 0.0, "epsilon": 1e-10},
    "momentum": {"momentum": 0.9}, "sgd": {}, "adagrad": {},
}

Feed = Callable[[Any, str], tuple[float, ...]]  # (the knob's value, the optimizer) -> its run-time inputs


def _as_is(value: Any, optimizer: str) -> tuple[float, ...]:
    return (float(value),)


def _switched(value: Any, optimizer: str) -> tuple[float, ...]:
    """The value and an "on" flag; off (null) feeds 1.0, so the graph's arithmetic stays finite."""
    return (1.0, 0.0) if value is None else (float(value), 1.0)


def _tf_default(key: str) -> Feed:
    """The value, or when null the optimizer's own TensorFlow default (:data:`OPTIMIZER_DEFAULTS`)."""

    def feed(value: Any, optimizer: str) -> tuple[float, ...]:
        return (OPTIMIZER_DEFAULTS[optimizer].get(key, 0.0) if value is None else float(value),)

    return feed


@dataclass(frozen=True)
class TunerKnob:
    """One of tuner's own knobs.

    Attributes:
        name: the knob's name in a search space, a TrainConfig and best_config.yaml.
        knob: its type, default, valid range and help.
        inputs: the graph's run-time inputs it sets (``tuner.worker.graph.Hyper``), in order;
            empty: the knob changes the graph built (it keys the graph, ``TrainConfig.graph_key``).
        feed: its value (and the optimizer) -> the values of ``inputs``.
        null: what a null value becomes in a TrainConfig (``l2_weight``: 0.0, no L2 term).
    """

    name: str
    knob: Knob
    inputs: tuple[str, ...] = ()
    feed: Feed = _as_is
    null: Any = None

    def coerce(self, value: Any) -> Any:
        """A value from a search space or a flat mapping, as its TrainConfig field holds it."""
        if value is None and self.knob.nullable:
            return self.null
        return str(value) if self.knob.kind == "categorical" else float(value)


TABLE: tuple[TunerKnob, ...] = (  # the order of TrainConfig's fields, of a space's params and best_config.yaml
    TunerKnob("learning_rate", Knob("float", 1e-3, 1e-8, 10.0, help="the optimizer's learning rate"),
              inputs=("learning_rate",)),
    TunerKnob("clip_norm", Knob("float", None, 1e-4, 1e4, nullable=True,
                                help="clip threshold, see clip_mode (null: no clipping)"),
              inputs=("clip_norm", "clip_on"), feed=_switched),
    TunerKnob("l2_weight", Knob("float", 0.0, 0.0, 1.0, nullable=True, help="L2 weight on kernels"),
              inputs=("l2_weight",), null=0.0),
    TunerKnob("lr_decay", Knob("float", 1.0, 1e-3, 1.0, help="learning-rate factor per 1000 steps"),
              inputs=("lr_decay",)),
    TunerKnob("optimizer", Knob("categorical", "adam", choices=OPTIMIZERS, help="tf.compat.v1.train optimizer")),
    TunerKnob("momentum", Knob("float", None, 0.0, 0.9999, nullable=True,
                               help="momentum of momentum (null: 0.9) and rmsprop (null: 0)"),
              inputs=("momentum",), feed=_tf_default("momentum")),
    TunerKnob("rho", Knob("float", None, 0.0, 0.9999, nullable=True, help="RMSProp's decay (null: 0.9)"),
              inputs=("rho",), feed=_tf_default("rho")),
    TunerKnob("optimizer_epsilon", Knob("float", None, 1e-12, 1.0, nullable=True,
                                        help="epsilon of adam (null: 1e-8) and rmsprop (null: 1e-10)"),
              inputs=("epsilon",), feed=_tf_default("epsilon")),
    TunerKnob("clip_mode", Knob("categorical", "global", choices=CLIP_MODES,
                                help="clip_norm applies to the global norm, each gradient's norm, or each value")),
)

BY_NAME: dict[str, TunerKnob] = {k.name: k for k in TABLE}
TUNER_KNOBS: dict[str, Knob] = {k.name: k.knob for k in TABLE}  # what a search space may name besides the model's
DEFAULTS: dict[str, Any] = {k.name: k.knob.default for k in TABLE}
GRAPH_KNOBS: tuple[str, ...] = tuple(k.name for k in TABLE if not k.inputs)  # built into the graph
INPUTS: tuple[str, ...] = tuple(name for k in TABLE for name in k.inputs)  # the graph's run-time inputs, in order


def run_inputs(values: Mapping[str, Any], optimizer: str) -> list[float]:
    """The graph's run-time inputs (in the order of :data:`INPUTS`) for one config's tuner knobs."""
    out: list[float] = []
    for k in TABLE:
        if k.inputs:
            fed = k.feed(values[k.name], optimizer)
            assert len(fed) == len(k.inputs), k.name  # a table entry's feed gives one value per input
            out.extend(fed)
    return out
