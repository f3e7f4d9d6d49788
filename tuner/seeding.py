"""The seeds of a built graph's random ops, so a kept graph can be reseeded for another run.

A fresh build with graph seed ``g`` gives every random op the attributes ``(g, k)``, ``k`` not
depending on ``g`` (:func:`random_ops`); :func:`reseed_ops` sets them as a build with another
seed would, so a reused graph starts a run exactly as a fresh build of that seed
(``tuner.graph.Graphs``). Imports no TensorFlow: it works on the ops it is given.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from tuner.hooks import can_set_attrs, set_int_attr

MAXINT32 = 2**31 - 1  # TensorFlow truncates graph and op seeds modulo this (random_seed._truncate_seed)


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


def random_ops(graph: Any, seed: int) -> tuple[list[tuple[Any, int]], bool]:
    """The ops with ``seed`` and ``seed2`` attributes with their op seeds, and whether they can be reseeded.

    With a graph seed ``g`` set, TensorFlow gives a random op the attributes ``(g, k)``
    (``random_seed.get_seed``): ``k`` is the op's own seed, or else a per-graph counter, so it
    does not depend on ``g``; ``(0, 0)`` alone becomes ``(0, 2**31-1)``. An op whose ``seed`` is not
    ``g`` (made with raw seeds), one that takes its seeds as inputs (``tf.data``'s shuffle), or a
    stateless random op seeded by a constant (Keras's initializers, seeded from Python's
    ``random``, see :func:`python_seeded`; not one seeded by ``step_seed()``) makes a graph that is
    always built afresh, as is every graph when TensorFlow's op attributes cannot be set
    (``tuner.hooks.can_set_attrs``).
    """
    has_seed: dict[str, tuple[bool, bool, int | None]] = {}  # op type -> (seed attrs, seed2 input, seed input)
    found: list[tuple[Any, int]] = []
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
            reusable = False
        if attr:
            op_seed = op.get_attr("seed2")
            if graph_seed == 0 and op_seed == MAXINT32:
                op_seed = 0
            reusable = reusable and op.get_attr("seed") == graph_seed
            found.append((op, op_seed))
    return found, reusable


def reseed_ops(ops: list[tuple[Any, int]], seed: int) -> None:
    """Give every ``(op, op seed)`` of ``ops`` the seed attributes a fresh build with graph seed ``seed`` would give.

    Takes effect in sessions opened afterwards (a session reads the graph when it first runs).
    """
    graph_seed = seed % MAXINT32
    for op, op_seed in ops:
        set_int_attr(op, "seed", graph_seed)
        set_int_attr(op, "seed2", MAXINT32 if (graph_seed, op_seed) == (0, 0) else op_seed)
