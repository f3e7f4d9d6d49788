"""A TF1 recurrent network on the adding problem, on tuner's model contract.

Written here in the style of the TF1 recurrent-network tutorials (an LSTM cell from
``tf.nn.rnn_cell``, the sequence unstacked and unrolled with ``static_rnn``, a linear read-out of
the last output)::

    x = tf.unstack(x, timesteps, 1)
    lstm_cell = tf.nn.rnn_cell.BasicLSTMCell(num_hidden, forget_bias=1.0)
    outputs, states = tf.nn.static_rnn(lstm_cell, x, dtype=tf.float32)
    prediction = tf.matmul(outputs[-1], weights["out"]) + biases["out"]

The task is the adding problem (Hochreiter and Schmidhuber, 1997): a sequence of ``seq_len`` steps,
each a value in [0, 1) and a marker, two of them marked; the target is the sum of the two marked
values, so the network must carry them across the sequence. Always answering 1.0 scores a mean
squared error of about 0.167 (the variance of the sum); a network that learned the task scores
well below.

Gradients through a long unrolled sequence are where recurrent networks diverge: a ReLU RNN
with identity recurrence (``cell: irnn``, Le et al., 2015) explodes as the learning rate or the
sequence grows, unless its gradients are clipped; a tanh RNN saturates; an LSTM is the stable
cell, if not at every learning rate. None of tuner's defaults or rules was tuned on this model.

Try it::

    python -m tuner check-model examples/adding_lstm.py:AddingRNN
    python -m tuner launch --model examples/adding_lstm.py:AddingRNN --space examples/adding_lstm.yaml \\
        --trials 12 --steps 300
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tuner.models import Dataset, Knob, ModelGraph

DATA_SEED = 7  # the arrays never depend on the trial seed
TRAIN, VAL = 4096, 512


class AddingRNN:
    """An LSTM (or a plain RNN) reading a sequence and answering the sum of its two marked values."""

    knobs: Mapping[str, Knob] = {
        "seq_len": Knob("int", 50, 5, 200, help="steps per sequence, unrolled in the graph: the gradient's path"),
        "cell": Knob("categorical", "lstm", choices=("lstm", "irnn", "tanh"),
                     help="BasicLSTMCell, a ReLU RNN with identity recurrence, or a tanh RNN"),
        "hidden": Knob("int", 32, 4, 256, help="units of the recurrent cell"),
        "forget_bias": Knob("float", 1.0, 0.0, 5.0, help="added to the LSTM's forget gate (lstm only)"),
        "batch_size": Knob("int", 64, 8, 512),
    }

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        """Adding-problem sequences of ``seq_len`` steps, from a fixed seed: inputs [n, seq_len, 2], sums [n, 1]."""
        x, y = adding_problem(TRAIN + VAL, int(knobs["seq_len"]), DATA_SEED)
        return Dataset(train=(x[:TRAIN], y[:TRAIN]), val=(x[TRAIN:], y[TRAIN:]), batch_size=int(knobs["batch_size"]),
                       label_range=(0.0, 2.0), input_range=(0.0, 1.0))

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        """The unrolled cell over the sequence and a linear read-out of its last output; MSE."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        seq_len, hidden = int(knobs["seq_len"]), int(knobs["hidden"])
        x = tf1.placeholder(tf.float32, [None, seq_len, 2], name="x")
        target = tf1.placeholder(tf.float32, [None, 1], name="target")
        steps = tf.unstack(x, seq_len, 1)
        cell = str(knobs["cell"])
        # an IRNN's kernel starts at identity recurrence: the scope's initializer reaches the cell's kernel
        with tf1.variable_scope("net", initializer=_IdentityRecurrence(hidden) if cell == "irnn" else None):
            outputs, _ = tf1.nn.static_rnn(make_cell(cell, hidden, float(knobs["forget_bias"])), steps,
                                           dtype=tf.float32)
        with tf1.variable_scope("out"):
            w = tf1.get_variable("kernel", [hidden, 1], initializer=tf1.glorot_uniform_initializer())
            b = tf1.get_variable("bias", [1], initializer=tf1.zeros_initializer())
        prediction = tf.matmul(outputs[-1], w) + b
        loss = tf.reduce_mean(tf.square(prediction - target), name="mse")
        return ModelGraph(inputs=(x, target), loss=loss,
                          watch={"last_output": outputs[-1], "prediction": prediction})


def make_cell(kind: str, hidden: int, forget_bias: float) -> Any:
    """The recurrent cell: ``tf.nn.rnn_cell``'s LSTM, or a basic RNN cell (ReLU for the IRNN, or tanh)."""
    import tensorflow as tf

    cells = tf.compat.v1.nn.rnn_cell
    if kind == "lstm":
        return cells.BasicLSTMCell(hidden, forget_bias=forget_bias)
    return cells.BasicRNNCell(hidden, activation=tf.nn.relu if kind == "irnn" else tf.tanh)


class _IdentityRecurrence:
    """Initialiser of a BasicRNNCell kernel ``[inputs + hidden, hidden]``: small normal input rows, the
    identity below them (the recurrence); its bias has an initialiser of its own (zeros)."""

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden

    def __call__(self, shape: Any, dtype: Any = None, partition_info: Any = None) -> Any:
        import tensorflow as tf

        inputs = int(shape[0]) - self.hidden
        top = tf.random.normal([inputs, self.hidden], stddev=0.001, dtype=dtype or tf.float32)
        return tf.concat([top, tf.eye(self.hidden, dtype=dtype or tf.float32)], axis=0)


def adding_problem(n: int, seq_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences of ``seq_len`` >= 2 steps: values in [0, 1) and a 0/1 marker on two steps (one in
    each half); and the sums of the marked values."""
    rng = np.random.default_rng(seed)
    values = rng.random((n, seq_len), dtype=np.float32)
    markers = np.zeros((n, seq_len), np.float32)
    half = seq_len // 2
    first = rng.integers(0, half, n)
    second = rng.integers(half, seq_len, n)
    markers[np.arange(n), first] = 1.0
    markers[np.arange(n), second] = 1.0
    sums = (values * markers).sum(axis=1, keepdims=True).astype(np.float32)
    return np.stack([values, markers], axis=-1), sums
