"""Adversarial terms in one loss: the naive port of a GAN, ``d_loss + g_loss`` under one optimizer.

``tuner check-model``'s gradient check (``tuner.worker.checkmodel``) fails a single loss that is a
sum of scalar terms (:func:`summed_terms`) whose gradients point in opposite directions at init
(:func:`opposed_terms`), over the weights both reach and over an activation of the batch both are
computed from (a GAN's ``D(G(z))``): one optimizer minimizing their sum trains neither. Terms that
only share weights (a classifier's loss on its positive and its negative samples) are not flagged.
Only workers import this module (it runs TensorFlow sessions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tuner.models.base import Graph, Tensor, Variable

OPPOSED = -0.9  # two terms of one summed loss whose gradients' cosine is below this are adversaries


def summed_terms(loss: Tensor) -> list[Tensor]:
    """The scalar terms of ``loss`` when it is a sum (``a + b``, ``tf.add_n``), else ``[loss]``."""
    if loss.op.type not in ("Add", "AddV2", "AddN"):
        return [loss]
    terms = [term for t in loss.op.inputs for term in summed_terms(t)]
    return terms if all(t.shape.rank == 0 for t in terms) else [loss]


def _shared_activations(a: Tensor, b: Tensor) -> list[Tensor]:
    """The floating tensors of a batch (first dimension unknown) that both ``a`` and ``b`` are computed from."""
    def ancestors(tensor: Tensor) -> dict[str, Tensor]:
        seen: dict[str, Tensor] = {}
        todo = [tensor]
        while todo:
            t = todo.pop()
            if t.name not in seen:
                seen[t.name] = t
                todo.extend(t.op.inputs)
        return seen

    mine, theirs = ancestors(a), ancestors(b)
    return [t for name, t in mine.items() if name in theirs and t.dtype.is_floating
            and t.shape.rank is not None and t.shape.rank >= 1 and t.shape[0] is None]


def _present(grads: list[Tensor | None]) -> list[Tensor]:
    return [g for g in grads if g is not None]


def _reached(grads: list[Tensor | None]) -> list[bool]:
    return [g is not None for g in grads]


def _one(values: list[np.ndarray], reached: list[bool], k: int) -> tuple[list[np.ndarray], list[bool]]:
    """The fetched gradient of entry ``k`` alone, in :func:`_cosine`'s form."""
    if not reached[k]:
        return [], [False]
    return [values[sum(reached[:k])]], [True]


def _cosine(a: list[np.ndarray], a_reached: list[bool], b: list[np.ndarray], b_reached: list[bool]) -> float | None:
    """Cosine of two gradients (fetched values of the reached weights) over the weights both reach."""
    ia, ib = iter(a), iter(b)
    pairs = [(next(ia) if ra else None, next(ib) if rb else None) for ra, rb in zip(a_reached, b_reached, strict=True)]
    both = [(np.ravel(x), np.ravel(y)) for x, y in pairs if x is not None and y is not None]
    if not both:
        return None
    x, y = np.concatenate([p[0] for p in both]), np.concatenate([p[1] for p in both])
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y) / norm if norm > 0 and math.isfinite(norm) else None


def opposed_terms(graph: Graph, terms: list[Tensor], variables: list[Variable], feed: Mapping[Tensor, np.ndarray],
                  config: object) -> tuple[str, str, float] | None:
    """Two terms that are adversaries at init on the first batch, or None: their gradients point in
    opposite directions (cosine below ``OPPOSED``) over the weights both reach and over an
    activation of the batch both are computed from (a GAN's ``D(G(z))``). Terms that only share
    weights (a classifier's loss on its positive and its negative samples) are not flagged."""
    import tensorflow as tf

    pairs = [(i, j) for i in range(len(terms)) for j in range(i + 1, len(terms))]
    shared = {(i, j): _shared_activations(terms[i], terms[j]) for i, j in pairs}
    with graph.as_default():
        on_weights = [tf.compat.v1.gradients(t, variables) for t in terms]
        on_shared = {(i, j): [tf.compat.v1.gradients(terms[k], shared[i, j]) for k in (i, j)] for i, j in pairs}
        init = tf.compat.v1.global_variables_initializer()
    fetch = ([_present(g) for g in on_weights],
             {key: [_present(g) for g in both] for key, both in on_shared.items()})
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        weights, activations = sess.run(fetch, feed)
    for i, j in pairs:
        cosine = _cosine(weights[i], _reached(on_weights[i]), weights[j], _reached(on_weights[j]))
        (a, b), (ra, rb) = activations[i, j], [_reached(g) for g in on_shared[i, j]]
        fights = [c for k in range(len(ra)) if (c := _cosine(*_one(a, ra, k), *_one(b, rb, k))) is not None]
        if cosine is not None and cosine < OPPOSED and fights and min(fights) < OPPOSED:
            return terms[i].op.name, terms[j].op.name, cosine
    return None
