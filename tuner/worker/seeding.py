"""The seeds of a built graph's random ops, so a kept graph can be reseeded for another run.

A fresh build with graph seed ``g`` gives every random op the attributes ``(g, k)``, ``k`` not
depending on ``g`` (:func:`random_ops`); :func:`reseed_ops` sets them as a build with another
seed would, so a reused graph starts a run exactly as a fresh build of that seed
(``tuner.worker.graph.Graphs``).

Keras 2's initializers without a seed (``tf.compat.v1.layers``) are stateless random ops seeded by
a constant ``[s, 0]``, ``s`` drawn with ``random.randint(1, 10**9)`` while the model is built
(``tf_keras``' ``RandomGenerator._create_seed``). The build runs with Python's ``random`` seeded
from the run's seed (:func:`python_seeded`), so the ``i``-th such draw of a build with seed ``g``
is ``Random(g).randint(1, 10**9)``'s ``i``-th: :func:`random_ops` finds each constant's ``i``
among the first draws of ``g`` and :func:`reseed_consts` writes the ``i``-th draw of another
seed into it, as a fresh build with that seed would. A constant not found there (a model that
drew other numbers from ``random`` in between, or seeded Keras itself) makes a graph that is
always built afresh. TensorFlow is imported only by the functions that read or write op values.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from tuner.hooks import can_set_attrs, set_int_attr, set_tensor_attr

if TYPE_CHECKING:
    from tuner.models.base import Graph, Operation

MAXINT32 = 2**31 - 1  # TensorFlow truncates graph and op seeds modulo this (random_seed._truncate_seed)
KERAS_DRAW = (1, int(1e9))  # tf_keras' RandomGenerator._create_seed: random.randint(1, int(1e9))
DRAWS_SEARCHED = 256  # draws of a build's seed searched for a constant's (at least 4 per constant)


@contextlib.contextmanager
def python_seeded(seed: int) -> Iterator[None]:
    """Python's and numpy's global random state seeded from the run's seed while a model is built.

    Keras's initializers without a seed (``tf.compat.v1.layers.dense``'s Glorot) draw theirs from
    ``random.randint``, not from the graph seed: seeded here, a build is a function of the run's
    seed, as with TF's own initializers. The states are restored afterwards.
    """
    state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def random_ops(graph: Graph, seed: int) -> tuple[list[tuple[Operation, int]], list[tuple[Operation, int]], bool]:
    """The random ops of a graph built with ``seed`` and what a reseed needs of them.

    Returns ``(ops, consts, reusable)``: the ops with ``seed`` and ``seed2`` attributes with their
    op seeds; the constants seeding stateless random ops (Keras' initializers), each with the index
    of its Python draw (see the module docs); and whether :func:`reseed_ops` and
    :func:`reseed_consts` can give the graph any other seed's.

    With a graph seed ``g`` set, TensorFlow gives a random op the attributes ``(g, k)``
    (``random_seed.get_seed``): ``k`` is the op's own seed, or else a per-graph counter, so it
    does not depend on ``g``; ``(0, 0)`` alone becomes ``(0, 2**31-1)``. An op whose ``seed`` is not
    ``g`` (made with raw seeds), one that takes its seeds as inputs (``tf.data``'s shuffle), or a
    stateless random op seeded by a constant that is not a Python draw of the build (not one
    seeded by ``step_seed()``, which is fed) makes a graph that is always built afresh, as is every
    graph when TensorFlow's op attributes cannot be set (``tuner.hooks.can_set_attrs``).
    """
    has_seed: dict[str, tuple[bool, bool, int | None]] = {}  # op type -> (seed attrs, seed2 input, seed input)
    found: list[tuple[Operation, int]] = []
    consts: dict[str, Operation] = {}  # name -> a Const op seeding a stateless random op
    graph_seed = seed % MAXINT32
    reusable = can_set_attrs()
    for op in graph.get_operations():
        if op.type not in has_seed:
            attrs = {a.name for a in op.op_def.attr}
            inputs = [a.name for a in op.op_def.input_arg]
            seed_at = inputs.index("seed") if "seed" in inputs and op.type.startswith("Stateless") else None
            has_seed[op.type] = ({"seed", "seed2"} <= attrs, "seed2" in inputs, seed_at)
        attr, seed2_input, seed_at = has_seed[op.type]
        reusable = reusable and not seed2_input
        if seed_at is not None and op.inputs[seed_at].op.type == "Const":
            consts[op.inputs[seed_at].op.name] = op.inputs[seed_at].op
        if attr:
            op_seed = op.get_attr("seed2")
            if graph_seed == 0 and op_seed == MAXINT32:
                op_seed = 0
            reusable = reusable and op.get_attr("seed") == graph_seed
            found.append((op, op_seed))
    drawn = _draw_indices(list(consts.values()), seed)
    return found, drawn or [], reusable and drawn is not None


def _draw_indices(consts: list[Operation], seed: int) -> list[tuple[Operation, int]] | None:
    """Each ``[s, 0]`` constant with the index of ``s`` among the Python draws of a build with
    ``seed`` (see the module docs); None if one is not such a draw."""
    if not consts:
        return []
    import tensorflow as tf

    draws = keras_draws(seed, max(DRAWS_SEARCHED, 4 * len(consts)))
    index = {value: i for i, value in reversed(list(enumerate(draws)))}  # draw -> its first index
    out = []
    for const in consts:
        value = tf.make_ndarray(const.get_attr("value"))
        if value.shape != (2,) or value[1] != 0 or int(value[0]) not in index:
            return None
        out.append((const, index[int(value[0])]))
    return out


def keras_draws(seed: int, count: int) -> list[int]:
    """The first ``count`` seeds Keras' unseeded initializers draw in a build with ``seed`` (:func:`python_seeded`)."""
    draw = random.Random(seed)
    return [draw.randint(*KERAS_DRAW) for _ in range(count)]


def reseed_ops(ops: list[tuple[Operation, int]], seed: int) -> None:
    """Give every ``(op, op seed)`` of ``ops`` the seed attributes a fresh build with graph seed ``seed`` would give.

    Takes effect in sessions opened afterwards (a session reads the graph when it first runs).
    """
    graph_seed = seed % MAXINT32
    for op, op_seed in ops:
        set_int_attr(op, "seed", graph_seed)
        set_int_attr(op, "seed2", MAXINT32 if (graph_seed, op_seed) == (0, 0) else op_seed)


def reseed_consts(consts: list[tuple[Operation, int]], seed: int) -> None:
    """Give every ``(constant, draw index)`` of ``consts`` the value a fresh build with ``seed`` would give it."""
    if not consts:
        return
    import tensorflow as tf

    draws = keras_draws(seed, max(i for _, i in consts) + 1)
    for const, i in consts:
        dtype = tf.as_dtype(const.get_attr("dtype")).as_numpy_dtype
        set_tensor_attr(const, "value", np.asarray([draws[i], 0], dtype))
