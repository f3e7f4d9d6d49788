"""A user's TF1 block-counting CNN written with ``tf.layers``, ported to tuner's model contract.

The model of ``shared/seeds/001``, the way its author wrote it: an Estimator ``model_fn`` of
``tf.layers.conv2d`` (He variance-scaling kernels, as the answer suggests),
``tf.layers.batch_normalization`` with ``training=(mode == TRAIN)``, ReLU and a linear
``tf.layers.dense`` output, trained with ``tf.losses.mean_squared_error`` (or
``tf.losses.softmax_cross_entropy`` with label smoothing, counting as classification). The port
keeps those calls (as ``tf.compat.v1.layers`` / ``tf.compat.v1.losses``) and only moves code:

- the ``input_fn`` becomes ``data``: the images of ``tuner.models.data.block_images`` (RGB,
  pixel values 0..255, 0..6 blocks), the label being the count;
- the ``model_fn`` becomes ``build``: the ``TRAIN`` mode is the training loss; the ``EVAL`` mode
  (``training=False``: BatchNorm on its moving averages, shared weights through ``reuse=True``)
  is the validation loss, as the Estimator evaluated it;
- the ``AdamOptimizer``, ``exponential_decay``, ``minimize`` and the gradient hook go: tuner adds
  Adam, the decay (``lr_decay``), clipping and the NaN checks. BatchNorm's moving averages still
  update on every step: tuner runs the ``UPDATE_OPS`` collection with its train op.

The answer's ``epsilon=1e-8`` argument of ``softmax_cross_entropy`` does not exist in TF1 (a
``TypeError``) and is left out. Its other suggestions are knobs: ``input_scaling`` (the cast and
``/ 255.0``), ``initializer``, ``loss`` with ``label_smoothing`` and ``clip_predictions``
(``tf.clip_by_value`` on the regression output).

Try it::

    python -m tuner check-model examples/counting_blocks.py:CountingBlocks
    python -m tuner launch --model examples/counting_blocks.py:CountingBlocks --trials 20 --steps 300
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.models import Dataset, Knob, ModelGraph
from tuner.models.data import block_images

MAX_BLOCKS = 6
IMAGE_SIZE = 16
DATA_SEED = 2024  # the arrays never depend on the trial seed


class CountingBlocks:
    """The seed's block-counting CNN in ``tf.layers`` (see module docs)."""

    knobs: Mapping[str, Knob] = {
        "input_scaling": Knob("categorical", "unit", choices=("unit", "raw"),
                              help="divide the pixels by 255 (unit, the answer's) or feed them raw"),
        "initializer": Knob("categorical", "variance_scaling", choices=("variance_scaling", "glorot"),
                            help="conv kernels: VarianceScaling(scale=2.0) (the answer's) or the tf.layers default"),
        "loss": Knob("categorical", "mse", choices=("mse", "classify"),
                     help="regress the count (mean squared error) or classify it (softmax cross-entropy)"),
        "label_smoothing": Knob("float", 0.0, 0.0, 0.3, help="label smoothing of the classify loss"),
        "clip_predictions": Knob("bool", False, help="clip the regressed count to [0, MAX_BLOCKS]"),
        "filters": Knob("int", 8, 4, 32, help="filters of the first conv layer (doubled in the second)"),
        "batch_size": Knob("int", 32, 8, 256),
    }

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        """Images (pixel values 0..255) and block counts, from a fixed seed."""
        x_train, y_train = block_images(1024, IMAGE_SIZE, MAX_BLOCKS, DATA_SEED)
        x_val, y_val = block_images(256, IMAGE_SIZE, MAX_BLOCKS, DATA_SEED + 1)
        return Dataset(train=(x_train, y_train), val=(x_val, y_val), batch_size=int(knobs["batch_size"]),
                       label_range=(0.0, float(MAX_BLOCKS)), input_range=(0.0, 255.0))

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        """The model_fn's TRAIN loss, and its EVAL loss (moving averages) as the validation loss."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        image = tf1.placeholder(tf.float32, [None, IMAGE_SIZE, IMAGE_SIZE, 3], name="image")
        labels = tf1.placeholder(tf.float32, [None], name="labels")
        with tf1.variable_scope("cnn"):
            logits = model_fn(image, knobs, training=True)
        with tf1.variable_scope("cnn", reuse=True):
            eval_logits = model_fn(image, knobs, training=False)
        with tf.name_scope("loss"):
            loss = _loss(logits, labels, knobs)
        with tf.name_scope("eval_loss"):
            val_loss = _loss(eval_logits, labels, knobs)
        return ModelGraph(inputs=(image, labels), loss=loss, val_loss=val_loss,
                          watch={"logits_absmax": logits})


def model_fn(image: Any, knobs: Mapping[str, Any], training: bool) -> Any:
    """The seed's network: two conv -> batch_normalization -> ReLU blocks and a dense output."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    x = tf.cast(image, tf.float32)
    if knobs["input_scaling"] == "unit":
        x = x / 255.0
    init = tf1.initializers.variance_scaling(scale=2.0) if knobs["initializer"] == "variance_scaling" else None
    for filters in (int(knobs["filters"]), 2 * int(knobs["filters"])):
        x = tf1.layers.conv2d(x, filters=filters, kernel_size=3, strides=2, padding="same", kernel_initializer=init)
        x = tf1.layers.batch_normalization(x, training=training)
        x = tf.nn.relu(x)
    units = MAX_BLOCKS + 1 if knobs["loss"] == "classify" else 1
    return tf1.layers.dense(tf1.layers.flatten(x), units=units, activation=None)


def _loss(logits: Any, labels: Any, knobs: Mapping[str, Any]) -> Any:
    """``tf.losses.mean_squared_error`` on the count, or ``softmax_cross_entropy`` over the counts."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    if knobs["loss"] == "classify":
        onehot = tf.one_hot(tf.cast(labels, tf.int32), MAX_BLOCKS + 1)
        return tf1.losses.softmax_cross_entropy(onehot, logits, label_smoothing=float(knobs["label_smoothing"]))
    predictions = logits[:, 0]
    if knobs["clip_predictions"]:
        predictions = tf.clip_by_value(predictions, 0.0, float(MAX_BLOCKS))
    return tf1.losses.mean_squared_error(labels=labels, predictions=predictions)
