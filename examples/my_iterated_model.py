"""A user's TF1 model with a ``recompute_input`` loop, ported to tuner's model contract.

The worked example of ``docs/models.md``. The original (``shared/seeds/000``) fed a 3-layer MLP's
output back as its input ``max_iter`` times and diverged to NaN after a random number of steps.
Here the MLP learns the flow of a 2-D limit-cycle oscillator (the Hopf normal form
``dr/dt = r (1 - r^2)``, ``dtheta/dt = 1 + SHEAR r^2``): each iteration predicts a growth rate
and a turning rate, and ``recompute_input`` takes one Euler step in polar coordinates. The target
is the exact state at a fixed horizon, so it does not depend on ``max_iter``.

``recompute_input`` has the hazards of a naive port: ``sqrt`` of the squared radius (its gradient
is infinite at 0), a division by the radius, and a radius that grows geometrically when the
learned growth rate is large. Its guards are knobs: ``epsilon`` inside the ``sqrt`` and
``input_clip`` on the recomputed input.

Try it::

    python -m tuner check-model examples/my_iterated_model.py:MyIteratedModel
    python -m tuner launch --model examples/my_iterated_model.py:MyIteratedModel \\
        --space examples/my_iterated_model.yaml --trials 20 --steps 300
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tuner.models import Dataset, Knob, ModelGraph

HORIZON = 3.0  # time of the target state: fixed, whatever max_iter is
SHEAR = 0.5  # how much faster the oscillator turns far from the origin
DATA_SEED = 7  # the arrays never depend on the trial seed


class MyIteratedModel:
    """The seed's iterated MLP on a limit-cycle oscillator (see module docs)."""

    knobs: Mapping[str, Knob] = {
        "max_iter": Knob("int", 8, 1, 30, help="times the MLP's output is fed back as its input"),
        "bn_order": Knob(
            "categorical", "relu_bn", choices=("relu_bn", "bn_relu"),
            help="ReLU then BatchNorm (the original's) or BatchNorm then ReLU",
        ),
        "hidden": Knob("int", 32, 4, 128, help="units of each of the 3 hidden layers"),
        "epsilon": Knob(
            "float", None, 1e-12, 1e-2, nullable=True,
            help="added under the sqrt of the radius (null: none, as in the original)",
        ),
        "input_clip": Knob(
            "float", None, 0.5, 100.0, nullable=True,
            help="clip the recomputed input to [-c, c] (null: no clip)",
        ),
        "batch_size": Knob("int", 64, 8, 512, help="samples per training step"),
    }

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        """2048 training and 256 validation start points with their state at the horizon."""
        rng = np.random.default_rng(DATA_SEED)
        radius = rng.uniform(0.05, 2.0, 2048 + 256)
        angle = rng.uniform(-np.pi, np.pi, 2048 + 256)
        x0 = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).astype(np.float32)
        target = hopf_state(x0, HORIZON).astype(np.float32)
        return Dataset(
            train=(x0[:2048], target[:2048]), val=(x0[2048:], target[2048:]),
            batch_size=int(knobs["batch_size"]),
        )

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        """Unroll ``max_iter`` iterations of MLP + recompute_input; MSE on the final state."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        x0 = tf1.placeholder(tf.float32, [None, 2], name="x0")
        target = tf1.placeholder(tf.float32, [None, 2], name="target")
        weights = _weights(int(knobs["hidden"]))  # created once: every iteration shares them
        dt = HORIZON / int(knobs["max_iter"])
        x = x0
        for _ in range(int(knobs["max_iter"])):
            output = _mlp(x, weights, str(knobs["bn_order"]))
            x = recompute_input(output, x, dt, knobs["epsilon"], knobs["input_clip"])
        loss = tf.reduce_mean(tf.square(x - target))
        return ModelGraph(inputs=(x0, target), loss=loss, watch={"final_absmax": tf.reduce_max(tf.abs(x))})


def hopf_state(x0: np.ndarray, t: float) -> np.ndarray:
    """The exact state at time ``t`` of the Hopf oscillator started at ``x0`` (shape [n, 2])."""
    r0 = np.hypot(x0[:, 0], x0[:, 1])
    c = 1.0 / r0**2 - 1.0
    decay = np.exp(-2.0 * t)
    r = 1.0 / np.sqrt(1.0 + c * decay)
    turned = t + SHEAR * (t + 0.5 * np.log((1.0 + c * decay) / (1.0 + c)))  # integral of 1 + SHEAR r^2
    theta = np.arctan2(x0[:, 1], x0[:, 0]) + turned
    return np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)


def _weights(hidden: int) -> list[tuple[Any, Any, Any, Any]]:
    """(kernel, bias, BatchNorm gamma, beta) of the 3 hidden layers, then the output layer's."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    layers = []
    for i, (fan_in, units) in enumerate([(2, hidden), (hidden, hidden), (hidden, hidden), (hidden, 2)]):
        output = i == 3
        init = tf1.random_normal_initializer(stddev=0.01) if output else tf1.glorot_uniform_initializer()
        kernel = tf1.get_variable(f"A{i + 1}", [fan_in, units], initializer=init)
        bias = tf1.get_variable(f"b{i + 1}", [units], initializer=tf1.zeros_initializer())
        gamma = None if output else tf1.get_variable(f"gamma{i + 1}", [units], initializer=tf1.ones_initializer())
        beta = None if output else tf1.get_variable(f"beta{i + 1}", [units], initializer=tf1.zeros_initializer())
        layers.append((kernel, bias, gamma, beta))
    return layers


def _mlp(x: Any, weights: list[tuple[Any, Any, Any, Any]], bn_order: str) -> Any:
    """3 x (dense, ReLU, BatchNorm in the knob's order), then a linear output of 2 rates."""
    import tensorflow as tf

    h = x
    for kernel, bias, gamma, beta in weights[:3]:
        h = tf.matmul(h, kernel) + bias
        if bn_order == "relu_bn":
            h = _batch_norm(tf.nn.relu(h), gamma, beta)
        else:
            h = tf.nn.relu(_batch_norm(h, gamma, beta))
    kernel, bias, _, _ = weights[3]
    return tf.matmul(h, kernel) + bias


def _batch_norm(h: Any, gamma: Any, beta: Any) -> Any:
    """BatchNorm on the batch's statistics (what Keras' layer does while training)."""
    import tensorflow as tf

    mean, variance = tf.nn.moments(h, axes=[0])
    return tf.nn.batch_normalization(h, mean, variance, beta, gamma, variance_epsilon=1e-3)


def recompute_input(output: Any, x: Any, dt: float, epsilon: float | None, clip: float | None) -> Any:
    """One Euler step in polar coordinates: grow the radius, turn the angle (naive, as ported)."""
    import tensorflow as tf

    growth, turn = output[:, :1], 1.0 + output[:, 1:]
    squared = tf.reduce_sum(tf.square(x), axis=1, keepdims=True)
    radius = tf.sqrt(squared + epsilon) if epsilon is not None else tf.sqrt(squared)
    u, v = x[:, :1] / radius, x[:, 1:] / radius
    cos, sin = tf.cos(dt * turn), tf.sin(dt * turn)
    new_radius = radius * (1.0 + dt * growth)
    x_next = new_radius * tf.concat([cos * u - sin * v, sin * u + cos * v], axis=1)
    return tf.clip_by_value(x_next, -clip, clip) if clip is not None else x_next
