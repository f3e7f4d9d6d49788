"""``counting_cnn``: the model of ``shared/seeds/001``, a small CNN that counts blocks in images.

The task: RGB images (pixel values 0..255) holding 0..``max_blocks`` coloured blocks; the label
is the count. Two blocks of ``conv 3x3 stride 2 -> BatchNorm -> ReLU`` (``filters`` then
``2 * filters`` channels) feed a linear output: one number (``mse``, ``huber``) or one logit per
possible count (``classify``).

The seed's knobs are here as they were in the user's port: pixels fed raw (``input_scaling:
raw``, the seed's) or divided by 255 in the graph, Glorot or He (variance scaling) kernels, and
the loss. ``classify`` takes the log of the softmax the way a naive port does (the seed's user put
an epsilon on the logits, which changes nothing): once the logits span ~90 a probability
underflows to 0 and the loss turns Inf or NaN. Label smoothing is its guard: it bounds the logit
gaps the loss pushes towards. BatchNorm right after each conv makes the network's output
independent of the input's scale, so ``input_scaling`` does not move the divergence boundary.

The validation loss is the squared error of the predicted count whatever the loss (the argmax
count for ``classify``), so trials with different losses compare. The data can carry the faults
of the seed's pipeline (NaN labels, negative labels, corrupt all-NaN images, unscaled 16-bit
images), planted only in the training split; ``classify`` one-hot encodes a NaN or negative label
as all zeros and so trains through them, as ``tf.one_hot`` does. The declared input range is
0..255 whatever ``input_scaling`` says (the arrays always hold 8-bit values; ``unit`` divides in
the graph), so the data preflight flags unscaled 16-bit images, not raw pixels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.models.base import Dataset, Knob, ModelGraph
from tuner.models.data import Faults, block_images

if TYPE_CHECKING:
    from tuner.models.base import Tensor

DATA_SEED = 4321
BN_EPSILON = 1e-3
NO_FAULTS = Faults()


class CountingCNN:
    """The block-counting CNN of the seed (see module docs).

    Args:
        faults: data faults to plant in the training split (none by default).
        image_size: image height and width in pixels (a multiple of 4).
        max_blocks: the largest count in the data.
        train_size: number of training images.
        val_size: number of validation images.
    """

    knobs: Mapping[str, Knob] = {
        "input_scaling": Knob(
            "categorical", "raw", choices=("raw", "unit"),
            help="feed pixels as 0..255 (raw, the seed's) or divided by 255 in the graph (unit)",
        ),
        "initializer": Knob(
            "categorical", "glorot", choices=("glorot", "variance_scaling"),
            help="kernel initializer: Glorot uniform (the seed's) or He variance scaling",
        ),
        "loss": Knob(
            "categorical", "mse", choices=("mse", "huber", "classify"),
            help="regress the count (mse, huber) or classify it (naive softmax cross-entropy)",
        ),
        "label_smoothing": Knob(
            "float", 0.0, 0.0, 0.3, help="label smoothing of the classify loss (else unused)"
        ),
        "filters": Knob("int", 8, 2, 64, help="channels of the first conv block (doubled in the second)"),
        "batch_size": Knob("int", 32, 4, 512, help="images per training step"),
    }

    def __init__(
        self,
        faults: Faults = NO_FAULTS,
        image_size: int = 16,
        max_blocks: int = 6,
        train_size: int = 2048,
        val_size: int = 256,
    ) -> None:
        if image_size % 4 or (image_size // 4) ** 2 < max_blocks:
            raise ValueError(
                f"image_size {image_size} must be a multiple of 4 with room for {max_blocks} blocks"
            )
        self.faults = faults
        self.image_size = image_size
        self.max_blocks = max_blocks
        self.train_size = train_size
        self.val_size = val_size
        self._arrays: tuple[np.ndarray, ...] | None = None

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        """Raw-pixel images and counts; faults only in the training split (see module docs)."""
        x_train, y_train, x_val, y_val = self._generate()
        # the arrays hold 8-bit pixel values whatever input_scaling says: "unit" divides by 255
        # in the graph. So the input the model expects is 0..255 either way, and the preflight
        # flags values beyond it (unscaled 16-bit pixels), not the raw pixels themselves.
        return Dataset(
            train=(x_train, y_train), val=(x_val, y_val),
            batch_size=int(knobs["batch_size"]),
            label_range=(0.0, float(self.max_blocks)),
            input_range=(0.0, 255.0),
        )

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        """Two conv blocks and a linear output; the loss named by the ``loss`` knob."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        size = self.image_size
        images = tf1.placeholder(tf.float32, [None, size, size, 3], name="images")
        counts = tf1.placeholder(tf.float32, [None], name="counts")
        x = images / 255.0 if knobs["input_scaling"] == "unit" else images
        init = _initializer(str(knobs["initializer"]))
        filters = int(knobs["filters"])
        watch = {}
        for block, channels in enumerate((filters, 2 * filters)):
            with tf1.variable_scope(f"conv{block}"):
                x = _conv_block(x, channels, init)
                watch[f"conv{block}/absmax"] = tf.reduce_max(tf.abs(x))
        classify = knobs["loss"] == "classify"
        with tf1.variable_scope("out"):
            flat = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])
            out = _dense(flat, self.max_blocks + 1 if classify else 1, init)
            watch["out/absmax"] = tf.reduce_max(tf.abs(out))
        with tf.name_scope("loss"):
            if classify:
                smoothing = float(knobs["label_smoothing"])
                loss = _cross_entropy(out, counts, self.max_blocks + 1, smoothing)
                predicted = tf.cast(tf.argmax(out, axis=1), tf.float32)
            else:
                loss = _regression_loss(out[:, 0], counts, str(knobs["loss"]))
                predicted = out[:, 0]
            val_loss = tf.reduce_mean(tf.square(predicted - counts), name="count_mse")
        return ModelGraph(inputs=(images, counts), loss=loss, val_loss=val_loss, watch=watch)

    def _generate(self) -> tuple[np.ndarray, ...]:
        """The four arrays, made once per instance from the fixed data seed."""
        if self._arrays is None:
            size, blocks = self.image_size, self.max_blocks
            x_train, y_train = block_images(self.train_size, size, blocks, DATA_SEED, self.faults)
            x_val, y_val = block_images(self.val_size, size, blocks, DATA_SEED + 1)
            self._arrays = (x_train, y_train, x_val, y_val)
        return self._arrays


def _initializer(name: str) -> object:
    """Glorot uniform, or He (variance scaling 2.0, fan-in) as the seed's answer suggests."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    if name == "glorot":
        return tf1.glorot_uniform_initializer()
    return tf1.variance_scaling_initializer(scale=2.0)


def _conv_block(x: Tensor, channels: int, init: object) -> Tensor:
    """conv 3x3 stride 2 -> BatchNorm on batch statistics -> ReLU."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    kernel = tf1.get_variable("kernel", [3, 3, int(x.shape[-1]), channels], initializer=init)
    h = tf.nn.conv2d(x, kernel, strides=2, padding="SAME")
    gamma = tf1.get_variable("bn_gamma", [channels], initializer=tf1.ones_initializer())
    beta = tf1.get_variable("bn_beta", [channels], initializer=tf1.zeros_initializer())
    mean, var = tf.nn.moments(h, axes=[0, 1, 2])
    h = tf.nn.batch_normalization(h, mean, var, beta, gamma, variance_epsilon=BN_EPSILON)
    return tf.nn.relu(h)


def _dense(x: Tensor, units: int, init: object) -> Tensor:
    """A linear layer."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    kernel = tf1.get_variable("kernel", [int(x.shape[-1]), units], initializer=init)
    bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
    return tf.matmul(x, kernel) + bias


def _regression_loss(pred: Tensor, counts: Tensor, kind: str) -> Tensor:
    """Mean squared error, or Huber (delta 1) on the count."""
    import tensorflow as tf

    err = tf.abs(pred - counts)
    if kind == "mse":
        return tf.reduce_mean(tf.square(err), name="mse")
    quad = tf.minimum(err, 1.0)
    return tf.reduce_mean(0.5 * tf.square(quad) + (err - quad), name="huber")


def _cross_entropy(logits: Tensor, counts: Tensor, classes: int, smoothing: float) -> Tensor:
    """Softmax cross-entropy over the possible counts, label-smoothed, as the naive port has it."""
    import tensorflow as tf

    onehot = tf.one_hot(tf.cast(counts, tf.int32), classes)
    target = onehot * (1.0 - smoothing) + smoothing / classes
    log_probs = tf.math.log(tf.nn.softmax(logits))  # the seed's hazard: log(0) once p underflows
    return tf.reduce_mean(-tf.reduce_sum(target * log_probs, axis=1), name="cross_entropy")
