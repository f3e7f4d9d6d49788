"""The model contract: what a TF1 model gives tuner, and what tuner does with it.

A model is any object with three members (see :class:`Model`):

``knobs``
    The model's own hyperparameters, each a :class:`Knob` with its type, its valid range and a
    default. ``max_iter``, a BatchNorm order or an input scaling are knobs like any other.
``build(knobs)``
    Called inside a fresh ``tf.Graph`` (graph mode, ``tf.compat.v1``) with one value per knob.
    It creates placeholders and variables with raw ops and returns a :class:`ModelGraph`: the
    placeholders in the order the data arrays come, the scalar training loss and, optionally, a
    validation loss and named tensors to watch. It must not create an optimizer, an L2 term,
    gradient clipping or numeric checks: tuner adds those, the same way for every model.
``data(knobs)``
    Returns a :class:`Dataset`: training and validation arrays (numpy), one per placeholder, and
    a batch size. The trial seed picks the batch order; the arrays themselves do not depend on it.
    By convention the **last** array of each split is the label and the others are inputs; one
    array alone is an input (unlabelled data, an autoencoder's). The
    data preflight (``tuner.preflight``) checks the data once, in the driver, as made with the
    space's fixed knobs (else the defaults), and the samples it flags are left out by index in
    every trial: so which samples there are, and their order, must not depend on the knobs.

What tuner adds on top of ``build`` (``tuner.worker.train``): the ``optimizer`` knob's
``tf.compat.v1.train`` optimizer (Adam by default) at the trial's learning rate (with an optional
exponential decay), an L2 term ``l2_weight * sum(l2_loss(w))`` over every trainable variable of
rank >= 2 (kernels, not biases or BatchNorm scales), gradient clipping (``clip_mode``),
and a check of the loss, the unclipped global gradient norm and the updated weights on every step.

A model trained by several optimizers (a GAN) returns named losses instead (``ModelGraph.losses``,
each a :class:`Loss` with the variables it trains, its optimizer and learning-rate factor) and the
order of their updates (``ModelGraph.update``): tuner adds all of the above to each loss, checks
every loss every step, and a divergence names the loss that went non-finite first.

Name scopes make telemetry and forensics readable: build a loop's iteration ``k`` under an
``iter_<k>`` scope and each layer under a scope of its own (``iter_3/layer2/MatMul``); the
forensics of a divergence reads the layer and loop iteration of the first non-finite op from them.

A model's module must not import TensorFlow at import time (import it inside ``build``): the
driver loads models to read their knobs and must stay free of TensorFlow. Every trainable variable
must get a gradient from the loss, and every knob should change the graph, the data or the loss.

``python -m tuner check-model SPEC`` checks a model against this contract; ``docs/models.md``
walks through porting a TF1 model to it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np

KnobKind = Literal["float", "int", "categorical", "bool"]

# TensorFlow's types as tuner's annotations name them. A model's module and the worker modules that import
# TensorFlow inside their functions cannot import it for annotations either (tests/test_layout.py), and mypy reads
# the package as untyped: so each name is Any to the type checker, and says which TensorFlow type is meant.
Tensor: TypeAlias = Any  # a tf.Tensor
Variable: TypeAlias = Any  # a tf.Variable (ops read it as a tensor)
Operation: TypeAlias = Any  # a tf.Operation
Graph: TypeAlias = Any  # a tf.Graph


@dataclass(frozen=True)
class Knob:
    """One hyperparameter: its type, its valid range and its default.

    Args:
        kind: ``float``, ``int``, ``categorical`` or ``bool``.
        default: the value used when a search space leaves the knob out.
        low: smallest valid value (``float``/``int``), inclusive.
        high: largest valid value (``float``/``int``), inclusive.
        choices: the valid values of a ``categorical`` knob.
        nullable: ``None`` is a valid value (for example "no clipping").
        help: one line on what the knob does, shown by ``check-model`` beside its check.
    """

    kind: KnobKind
    default: object
    low: float | None = None
    high: float | None = None
    choices: tuple[object, ...] = ()
    nullable: bool = False
    help: str = ""

    def __post_init__(self) -> None:
        if self.kind in ("float", "int") and (self.low is None or self.high is None):
            raise ValueError(f"a {self.kind} knob needs low and high")
        if self.kind == "categorical" and not self.choices:
            raise ValueError("a categorical knob needs choices")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"knob range low={self.low} is above high={self.high}")
        problem = self.problem(self.default)
        if problem:
            raise ValueError(f"knob default {self.default!r}: {problem}")

    def problem(self, value: object) -> str | None:
        """Say what is wrong with ``value`` for this knob, or return None if it is valid."""
        if value is None:
            return None if self.nullable else "null is not allowed"
        if self.kind == "bool":
            return None if isinstance(value, bool) else "expected true or false"
        if self.kind == "categorical":
            return None if value in self.choices else f"expected one of {list(self.choices)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a{'n' if self.kind == 'int' else ''} {self.kind}"
        if self.kind == "int" and not (isinstance(value, int) or float(value).is_integer()):
            return "expected an int"
        if isinstance(value, float) and not math.isfinite(value):  # an int is finite (and may not fit a float)
            return "expected a finite number"
        assert self.low is not None and self.high is not None  # checked in __post_init__
        if not self.low <= value <= self.high:
            return f"outside the valid range [{self.low}, {self.high}]"
        return None

    def describe(self) -> str:
        """A short human description of the valid values."""
        if self.kind in ("float", "int"):
            text = f"{self.kind} in [{self.low}, {self.high}]"
        elif self.kind == "categorical":
            text = f"one of {list(self.choices)}"
        else:
            text = "true or false"
        return text + (" or null" if self.nullable else "")

    def alternatives(self) -> list[object]:
        """Valid values other than the default (bounds, choices, null), to see whether the knob changes
        anything (``tuner check-model``)."""
        if self.kind == "bool":
            values: list[object] = [not self.default]
        elif self.kind == "categorical":
            values = list(self.choices)
        else:
            bounds = [b for b in (self.high, self.low) if b is not None]  # a number knob has both
            values = [int(b) if self.kind == "int" else float(b) for b in bounds]
        if self.nullable:
            values.append(None)
        unique: list[object] = []
        for value in values:
            if value != self.default and value not in unique and self.problem(value) is None:
                unique.append(value)
        return unique


UPDATES = ("simultaneous", "alternating")  # how the updates of several losses are ordered in a step
_LOSS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# tuner's own name scopes: a loss named like one would read, in forensics, as tuner's part of the graph
_RESERVED = frozenset({"gradients", "global_norm", "clip_by_global_norm", "updated", "hyper", "telemetry",
                       "learning_rate", "l2", "snapshot", "snapshot_read"})


@dataclass(frozen=True)
class Loss:
    """One of several named losses of a model (``ModelGraph.losses``): what it trains, and how.

    Each loss gets an optimizer of its own over its own weights, with tuner's knobs: the learning
    rate times ``lr_factor``, the L2 term over the kernels it trains, clipping by its own gradients'
    norm. Its value, its gradient norm and its weights after the update are checked every step.

    Attributes:
        tensor: the scalar loss.
        trains: the trainable variables it trains: a scope (``"discriminator"``: those whose name
            starts with it, as ``tf.compat.v1.get_collection(TRAINABLE_VARIABLES, scope=...)``),
            a filter ``callable(variable) -> bool``, or a list of variables (a TF1 ``var_list``).
            None: every trainable variable.
        optimizer: one of tuner's optimizers (``adam``, ``rmsprop``, ``momentum``, ``sgd``,
            ``adagrad``), run with TensorFlow's own momentum, rho and epsilon; None: the trial's
            ``optimizer`` with the trial's knobs.
        lr_factor: its learning rate is the trial's ``learning_rate`` times this factor.
    """

    tensor: Tensor
    trains: str | Callable[[Variable], bool] | Sequence[Variable] | None = None
    optimizer: str | None = None
    lr_factor: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.lr_factor, (int, float)) and math.isfinite(self.lr_factor) and self.lr_factor > 0):
            raise ValueError(f"Loss lr_factor {self.lr_factor!r}: expected a finite number above 0")

    def variables(self, trainable: Sequence[Variable]) -> list[Variable]:
        """The variables of ``trainable`` this loss trains, in their order."""
        if self.trains is None:
            return list(trainable)
        if isinstance(self.trains, str):
            return [v for v in trainable if re.match(self.trains, v.name)]
        if callable(self.trains):
            return [v for v in trainable if self.trains(v)]
        chosen = {id(v) for v in self.trains}
        return [v for v in trainable if id(v) in chosen]

    def describe_trains(self) -> str:
        """What ``trains`` selects, in words (for messages)."""
        if self.trains is None:
            return "every trainable variable"
        if isinstance(self.trains, str):
            return f"scope {self.trains!r}"
        if callable(self.trains):
            return f"filter {getattr(self.trains, '__name__', repr(self.trains))}"
        return f"a list of {len(self.trains)} variable(s)"


@dataclass(frozen=True)
class ModelGraph:
    """What ``Model.build`` returns.

    Attributes:
        inputs: placeholders, fed with the dataset's arrays in the same order.
        loss: scalar training loss (before tuner's L2 term); None when ``losses`` are given.
        val_loss: scalar validation loss; None means ``loss`` (or the sum of ``losses``) evaluated
            on the validation arrays.
        watch: named tensors whose largest absolute value is reported as telemetry on every
            report step, under the given name (``iter_3/input_absmax``).
        losses: several named losses instead of ``loss`` (a GAN's ``d_loss`` and ``g_loss``), each
            trained by an optimizer of its own (see :class:`Loss`). The run's reported training
            loss is their sum.
        update: the order of the losses' updates within a step: ``simultaneous`` (one
            ``session.run``: every gradient from the same weights, then every update) or
            ``alternating`` (one ``session.run`` per loss, in the order of ``losses``: each loss
            sees the weights the previous ones updated, as TF1's ``sess.run(d_train)``,
            ``sess.run(g_train)``).
    """

    inputs: Sequence[Tensor]
    loss: Tensor | None = None
    val_loss: Tensor | None = None
    watch: Mapping[str, Tensor] = field(default_factory=dict)
    losses: Mapping[str, Loss] = field(default_factory=dict)
    update: str = "simultaneous"

    def __post_init__(self) -> None:
        if (self.loss is None) == (not self.losses):
            raise ValueError("ModelGraph needs a loss, or several named losses (losses={name: Loss(...)}), not both")
        if self.update not in UPDATES:
            raise ValueError(f"ModelGraph update {self.update!r}: expected one of {list(UPDATES)}")
        for name, loss in self.losses.items():
            if not isinstance(loss, Loss):
                raise ValueError(f"ModelGraph losses[{name!r}] must be a tuner.models.Loss, got {type(loss).__name__}")
            if not _LOSS_NAME.fullmatch(str(name)) or name in _RESERVED:
                raise ValueError(f"loss name {name!r}: use a name of letters, digits and _ (it names a scope), "
                                 f"not one of tuner's scopes {sorted(_RESERVED)}")

    def all_losses(self) -> dict[str, Loss]:
        """The losses tuner trains: ``losses``, or ``{"loss": Loss(loss)}`` for a model with one."""
        return dict(self.losses) if self.losses else {"loss": Loss(self.loss)}


@dataclass(frozen=True)
class Dataset:
    """Training and validation arrays, one per placeholder, and the batch size.

    One sample per row of each array's first axis. The last array of each split is the label, the
    others are inputs: the data preflight checks them that way. A split of one array is unlabelled
    (an autoencoder's inputs): that array is an input. ``label_range`` (inclusive) lets
    the preflight flag labels that cannot be right (a negative count). ``input_range`` (inclusive)
    is the range of the input arrays as the model expects them to be fed, so values beyond it are
    unscaled input (16-bit pixels where 0..255 is expected; 0..255 where [0, 1] is expected).
    """

    train: tuple[np.ndarray, ...]
    val: tuple[np.ndarray, ...]
    batch_size: int
    label_range: tuple[float, float] | None = None
    input_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        sizes = {len(a) for a in self.train}
        if len(sizes) != 1 or not self.val or len({len(a) for a in self.val}) != 1:
            raise ValueError("every train array (and every val array) needs the same length")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")

    @property
    def size(self) -> int:
        """Number of training samples."""
        return len(self.train[0])

    def batch(self, step: int, seed: int) -> tuple[np.ndarray, ...]:
        """The training batch of ``step`` (1-based) for ``seed``: a reshuffle every epoch."""
        index = self.batch_indices(step, seed)
        return tuple(a[index] for a in self.train)

    def batch_indices(self, step: int, seed: int) -> np.ndarray:
        """Sample indices of the batch of ``step`` for ``seed``."""
        per_epoch = max(1, self.size // self.batch_size)
        epoch, pos = divmod(step - 1, per_epoch)
        order = _epoch_order(seed, epoch, self.size)
        return order[pos * self.batch_size : (pos + 1) * self.batch_size]


STEP_SEED = "tuner_step_seed"  # the placeholder step_seed() makes; tuner.worker.train feeds it when it exists


def step_seed() -> Tensor:
    """A seed for ``tf.random.stateless_*`` ops inside ``build``: ``[run seed, step]``, fed by tuner.

    Noise drawn with it (dropout masks, injected noise, a GAN's latent vector) is a function of the
    run's seed and the step alone, so the forensics replay of a divergence step draws exactly the
    noise that training drew, and can name the op that went non-finite first; noise from stateful
    ops (``tf.random.uniform``, ``tf.nn.dropout`` without a seed tensor) is drawn anew by the replay.
    Validation passes get step 0. Every call in one graph returns the same int32 ``[2]`` placeholder::

        noise = tf.random.stateless_normal(tf.shape(x), seed=step_seed(), stddev=0.1)
    """
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    try:
        return graph.get_tensor_by_name(STEP_SEED + ":0")
    except KeyError:
        with graph.name_scope(None):  # None: the top-level scope
            return tf.compat.v1.placeholder(tf.int32, [2], name=STEP_SEED)


def has_label(arrays: int) -> bool:
    """Whether a split of ``arrays`` arrays ends with a label: one array alone is unlabelled input."""
    return arrays > 1


@functools.lru_cache(maxsize=8)
def _epoch_order(seed: int, epoch: int, size: int) -> np.ndarray:
    """The sample order of one epoch of ``seed`` (made once per epoch: ~0.2 ms, a tenth of a step)."""
    order = np.random.default_rng([seed, epoch]).permutation(size)
    order.flags.writeable = False
    return order


@runtime_checkable
class Model(Protocol):
    """The contract every model fulfils, built-in or a user's (see the module docs)."""

    knobs: Mapping[str, Knob]

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        """Create the forward pass and loss in the current default graph."""
        ...

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        """Return the training and validation data (independent of the trial seed)."""
        ...
