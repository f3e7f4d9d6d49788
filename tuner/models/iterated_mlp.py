"""``iterated_mlp``: the model of ``shared/seeds/000``, whose output is fed back as its input.

The task: from initial log-populations of a chaotic 4-species Lotka-Volterra system, predict the
log-populations at a fixed horizon. The MLP is a learned growth-rate field applied ``max_iter``
times (``dt = horizon / max_iter``): more iterations make each step easier to learn and the answer
more accurate, and make the unrolled graph deeper. The target never depends on ``max_iter``.

Each iteration: ``x -> 3 x (dense, ReLU, BatchNorm; order is a knob) -> linear -> rates`` (the
same weights in every iteration, as the seed's ``A1, b1, ...``), then
``recompute_input`` turns the rates into the next input the way a naive port does it: an explicit
Euler step on the populations ``n = exp(x)`` followed by ``x = log(n)``. Its hazards are the
seed's: ``exp`` overflows, an Euler step past zero makes ``log`` return NaN, a population near
zero makes the gradient of ``log`` explode. Its guards are knobs: ``epsilon`` (floor before the
log), ``input_clip`` (clip the recomputed input) and ``renorm_every`` (standardise the MLP's input
every few iterations).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuner.models.base import Dataset, Knob, ModelGraph
from tuner.models.data import lotka_volterra

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tuner.models.base import Tensor

HORIZON = 4.5
DATA_SEED = 1234


class IteratedMLP:
    """The iterated MLP of the seed, on a Lotka-Volterra task (see module docs)."""

    knobs: Mapping[str, Knob] = {
        "max_iter": Knob(
            "int", 10, 2, 30,
            help="times the MLP's output is fed back as input (at 1, one Euler step of 4.5 overshoots: NaN at init)",
        ),
        "bn_order": Knob(
            "categorical", "relu_bn", choices=("relu_bn", "bn_relu", "none"),
            help="ReLU then BatchNorm (the seed's), BatchNorm then ReLU, or no BatchNorm",
        ),
        "hidden": Knob("int", 32, 4, 256, help="units in each of the 3 hidden layers"),
        "epsilon": Knob(
            "float", None, 1e-12, 1e-1, nullable=True,
            help="floor of the populations before the log (null: no floor)",
        ),
        "input_clip": Knob(
            "float", None, 0.5, 1e3, nullable=True,
            help="clip the recomputed input to [-c, c] (null: no clip)",
        ),
        "renorm_every": Knob(
            "int", 0, 0, 30, help="standardise the MLP's input every k iterations (0: never)"
        ),
        "batch_size": Knob("int", 32, 4, 1024, help="samples per training step"),
    }

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        """4096 training and 512 validation samples of the Lotka-Volterra map."""
        x, y = lotka_volterra(4096 + 512, HORIZON, DATA_SEED)
        return Dataset(
            train=(x[:4096], y[:4096]), val=(x[4096:], y[4096:]),
            batch_size=int(knobs["batch_size"]),
        )

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        """Unroll ``max_iter`` iterations of the MLP and recompute_input; MSE at the end."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        x_in = tf1.placeholder(tf.float32, [None, 4], name="x0")
        target = tf1.placeholder(tf.float32, [None, 4], name="target")
        max_iter = int(knobs["max_iter"])
        dt = HORIZON / max_iter
        x = x_in
        watch = {}
        for t in range(max_iter):
            with tf1.variable_scope(f"iter_{t}"):
                every = int(knobs["renorm_every"])
                features = _standardise(x) if every and t % every == 0 else x
                rates = _mlp(features, int(knobs["hidden"]), str(knobs["bn_order"]))
                x = _recompute_input(rates, x, dt, knobs)
                watch[f"iter_{t}/input_absmax"] = tf.reduce_max(tf.abs(x))
        loss = tf.reduce_mean(tf.square(x - target), name="mse")
        return ModelGraph(inputs=(x_in, target), loss=loss, watch=watch)


def _mlp(x: Tensor, hidden: int, bn_order: str) -> Tensor:
    """3 hidden layers and a linear output; every iteration shares the same weights."""
    import tensorflow as tf

    h = x
    for layer in range(3):
        with tf.compat.v1.variable_scope(f"layer{layer}"):
            h = _dense(h, hidden, f"layer{layer}")
            if bn_order == "bn_relu":
                h = tf.nn.relu(_batch_norm(h, f"layer{layer}"))
            elif bn_order == "relu_bn":
                h = _batch_norm(tf.nn.relu(h), f"layer{layer}")
            else:
                h = tf.nn.relu(h)
    with tf.compat.v1.variable_scope("out"):
        return _dense(h, 4, "out", scale=0.1)


def _shared(name: str) -> AbstractContextManager[object]:
    """A variable scope outside the iteration's scope, so every iteration reuses its variables."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    return tf1.variable_scope(tf1.VariableScope(tf1.AUTO_REUSE, name=name), auxiliary_name_scope=False)


def _dense(x: Tensor, units: int, name: str, scale: float = 1.0) -> Tensor:
    """A dense layer (Glorot init, or a small normal init for the output layer)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    fan_in = int(x.shape[-1])
    init = tf1.glorot_uniform_initializer() if scale == 1.0 else tf1.random_normal_initializer(
        stddev=scale / fan_in**0.5
    )
    with _shared(name):
        kernel = tf1.get_variable("kernel", [fan_in, units], initializer=init)
        bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
    return tf.matmul(x, kernel) + bias


def _batch_norm(h: Tensor, name: str) -> Tensor:
    """BatchNorm on batch statistics, as the seed's Keras layer does in training."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    units = int(h.shape[-1])
    with _shared(name):
        gamma = tf1.get_variable("bn_gamma", [units], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("bn_beta", [units], initializer=tf1.zeros_initializer())
    mean, var = tf.nn.moments(h, axes=[0])
    return tf.nn.batch_normalization(h, mean, var, beta, gamma, variance_epsilon=1e-3)


def _standardise(x: Tensor) -> Tensor:
    """Re-normalise the MLP's input with the batch's statistics (held constant for gradients)."""
    import tensorflow as tf

    mean, var = tf.nn.moments(tf.stop_gradient(x), axes=[0])
    return (x - mean) / tf.sqrt(var + 1e-6)


def _recompute_input(rates: Tensor, x: Tensor, dt: float, knobs: Mapping[str, Any]) -> Tensor:
    """Next input from the rates: Euler step on n = exp(x), then log, with the knob guards."""
    import tensorflow as tf

    with tf.name_scope("recompute_input"):
        n = tf.exp(x)
        n_next = n + dt * n * rates
        if knobs["epsilon"] is not None:
            n_next = tf.maximum(n_next, float(knobs["epsilon"]))
        x_next = tf.math.log(n_next)
        if knobs["input_clip"] is not None:
            clip = float(knobs["input_clip"])
            x_next = tf.clip_by_value(x_next, -clip, clip)
        return x_next
