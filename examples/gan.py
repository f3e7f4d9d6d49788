"""A small TF1 GAN with two losses and two optimizers, on tuner's model contract.

Written here in the style of the TF1 GAN tutorials: a generator and a discriminator of
``tf.compat.v1.get_variable`` weights under their own variable scopes, the discriminator applied
to real and generated samples through ``reuse=True``, and the tutorial's training setup::

    d_vars = [v for v in tf.trainable_variables() if v.name.startswith("discriminator")]
    g_vars = [v for v in tf.trainable_variables() if v.name.startswith("generator")]
    d_train = tf.train.AdamOptimizer(lr).minimize(d_loss, var_list=d_vars)
    g_train = tf.train.AdamOptimizer(lr).minimize(g_loss, var_list=g_vars)
    for it in range(steps):
        sess.run(d_train, {x: batch, z: noise()})
        sess.run(g_train, {z: noise()})

The port returns the two losses by name, each with the variable scope it trains
(``Loss(d_loss, trains="discriminator")``) and ``update="alternating"``: tuner gives each loss its
own optimizer (the trial's, at the trial's learning rate times the loss's ``lr_factor``), its own
L2 term and clipping, runs ``d_loss``'s update and then ``g_loss``'s, each in its own
``session.run``, and checks both losses and both gradient norms every step. A divergence names
the loss (``gradient of loss "g_loss"``). The latent noise is drawn in the graph with
:func:`tuner.models.step_seed`, so a divergence's replay draws the same noise.

The data is a 2-D Gaussian (mean (2, -1), a tilted covariance). The validation loss is how far
the generated samples' means and standard deviations are from the validation data's: a GAN has no
training loss that says it learned, and this one falls as the generator fits the data.

Knobs: the update order, the discriminator's learning-rate factor, the loss form (``logits``:
``sigmoid_cross_entropy_with_logits``, stable; ``log``: the tutorials' ``-log(D(x)) - log(1 -
D(G(z)))``, which is ``log(0)`` once the discriminator saturates in float32), the width and the
latent size.

Try it::

    python -m tuner check-model examples/gan.py:GAN
    python -m tuner launch --model examples/gan.py:GAN --space examples/gan.yaml --trials 12 --steps 300
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tuner.models import Dataset, Knob, Loss, ModelGraph, step_seed

DATA_SEED = 11  # the arrays never depend on the trial seed
MEAN = np.array([2.0, -1.0])
MIX = np.array([[0.5, 0.0], [0.9, 1.2]])  # x = MEAN + MIX @ normal: a tilted Gaussian


class GAN:
    """A generator and a discriminator, trained by two losses (see the module docs)."""

    knobs: Mapping[str, Knob] = {
        "update": Knob("categorical", "alternating", choices=("alternating", "simultaneous"),
                       help="d_loss's update then g_loss's, each in its own session.run; or both at once"),
        "d_lr_factor": Knob("float", 1.0, 0.1, 10.0, help="the discriminator's learning rate over the generator's"),
        "loss_form": Knob("categorical", "logits", choices=("logits", "log"),
                          help="sigmoid cross-entropy of the logits, or the tutorials' log(D) (log(0) if D saturates)"),
        "hidden": Knob("int", 16, 4, 64, help="units of each hidden layer of both networks"),
        "z_dim": Knob("int", 4, 1, 16, help="size of the generator's latent noise"),
        "batch_size": Knob("int", 64, 16, 256),
    }

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        """Samples of the 2-D Gaussian, from a fixed seed; no labels."""
        rng = np.random.default_rng(DATA_SEED)
        x = (MEAN + rng.normal(size=(2304, 2)) @ MIX.T).astype(np.float32)
        return Dataset(train=(x[:2048],), val=(x[2048:],), batch_size=int(knobs["batch_size"]))

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        """Both networks, both losses, and the moment mismatch as the validation loss."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        hidden = int(knobs["hidden"])
        x = tf1.placeholder(tf.float32, [None, 2], name="x")
        z = tf.random.stateless_normal([tf.shape(x)[0], int(knobs["z_dim"])], seed=step_seed(), name="z")
        with tf1.variable_scope("generator"):
            fake = mlp(z, hidden, 2)
        with tf1.variable_scope("discriminator"):
            real_logit = mlp(x, hidden, 1)
        with tf1.variable_scope("discriminator", reuse=True):
            fake_logit = mlp(fake, hidden, 1)
        with tf.name_scope("d_loss"):
            d_loss = discriminator_loss(real_logit, fake_logit, str(knobs["loss_form"]))
        with tf.name_scope("g_loss"):
            g_loss = generator_loss(fake_logit, str(knobs["loss_form"]))
        with tf.name_scope("moments"):
            mean_real, var_real = tf.nn.moments(x, axes=[0])
            mean_fake, var_fake = tf.nn.moments(fake, axes=[0])
            spread = tf.sqrt(var_fake) - tf.sqrt(var_real)
            mismatch = tf.reduce_sum(tf.square(mean_fake - mean_real) + tf.square(spread))
        return ModelGraph(
            inputs=(x,),
            losses={
                "d_loss": Loss(d_loss, trains="discriminator", lr_factor=float(knobs["d_lr_factor"])),
                "g_loss": Loss(g_loss, trains="generator"),
            },
            update=str(knobs["update"]),
            val_loss=mismatch,
            watch={"real_logit": real_logit, "fake_logit": fake_logit},
        )


def mlp(x: Any, hidden: int, out: int) -> Any:
    """Two ReLU layers and a linear output, in the current variable scope (``layer0``, ``layer1``, ``out``)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    for i, units in enumerate((hidden, hidden, out)):
        with tf1.variable_scope(f"layer{i}" if i < 2 else "out"):
            w = tf1.get_variable("kernel", [x.shape[-1], units], initializer=tf1.glorot_uniform_initializer())
            b = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
            x = tf.matmul(x, w) + b
            x = tf.nn.relu(x) if i < 2 else x
    return x


def discriminator_loss(real_logit: Any, fake_logit: Any, form: str) -> Any:
    """Real samples labelled 1, generated ones 0."""
    import tensorflow as tf

    if form == "log":  # the tutorials': D = sigmoid(logit), log(D) is -inf once D is 0 in float32
        d_real, d_fake = tf.sigmoid(real_logit), tf.sigmoid(fake_logit)
        return -tf.reduce_mean(tf.math.log(d_real) + tf.math.log(1.0 - d_fake))
    ce = tf.nn.sigmoid_cross_entropy_with_logits
    return (tf.reduce_mean(ce(labels=tf.ones_like(real_logit), logits=real_logit))
            + tf.reduce_mean(ce(labels=tf.zeros_like(fake_logit), logits=fake_logit)))


def generator_loss(fake_logit: Any, form: str) -> Any:
    """The non-saturating generator loss: generated samples labelled 1."""
    import tensorflow as tf

    if form == "log":
        return -tf.reduce_mean(tf.math.log(tf.sigmoid(fake_logit)))
    labels = tf.ones_like(fake_logit)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=fake_logit))
