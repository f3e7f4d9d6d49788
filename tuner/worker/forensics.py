"""Divergence forensics: which op went non-finite first at the divergence step, and after what.

When a seed run diverges at step ``s``, :func:`investigate` first looks at the batch of step
``s``: a non-finite input or label attributes the divergence to the data, with the samples'
indices. Otherwise it replays step ``s`` in the run's own graph and session (the ops that load a
snapshot are added to the graph once): every variable loaded from the snapshot of the last report
step ``r`` (or of the initial values), steps ``r+1 .. s-1`` run as in training, then step ``s`` run with a
numeric check on the output of every op the train step runs (each output fetched and checked for
NaN/Inf). The first op in graph order (a topological order) whose output is non-finite while its
inputs are finite is where the divergence started. ``tf.compat.v1.add_check_numerics_ops`` is not
used: it stops at whichever failing check the executor happens to run first, which need not be
the first op in dataflow order. Normal training runs no numeric checks at all; the replay costs
at most ``report_every`` steps, once per diverged run (and a graph build when no session is given).

Names come from name scopes: ``iter_3/recompute_input/Log`` is a ``Log`` in layer
``recompute_input`` of loop iteration 3, in the forward pass. ``gradients/...`` is the backward
pass (``gradients/iter_3/recompute_input/Log_grad/Reciprocal`` differentiates
``iter_3/recompute_input/Log``); tuner's ``global_norm/`` and ``clip_by_global_norm/`` count as
backward too; a gradient that stays finite while its squared norm overflows (3.9e19 in float32)
makes tuner's ``global_norm/L2Loss_k`` the first non-finite op, and is named by its weight instead
(:func:`norm_overflow`). A replay that does not reproduce the run (it diverged earlier, or stayed
finite) names the stateful random ops it drew anew. An update that overflows a weight is
reported as the optimizer's apply op of that weight (kind ``update``). A model with several
losses has tuner's ops of each under the loss's name scope (``g_loss/gradients/...``); their kind
and layer are read without it. Its alternating updates are replayed one ``session.run`` per loss,
in order, as trained.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import tensorflow as tf

from tuner.models.base import Dataset, Model, has_label
from tuner.preflight import as_fed, overflow
from tuner.records import Forensics, NonFiniteKind, RunSpec
from tuner.worker.graph import UPDATED_SCOPE, Built, Snapshot, build, session_config

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, DTypeLike

    # a graph's snapshot loader, its placeholder per variable, the checked tensors of each run, its stateful ops
    _Tools: TypeAlias = tuple[tf.Operation, dict[str, tf.Tensor], list[list[tf.Tensor]], list[str]]

tf1 = tf.compat.v1

LISTED = 10  # non-finite ops listed in the record
_ITER = re.compile(r"iter_(\d+)")
_BACKWARD = ("gradients/", "global_norm/", "clip_by_global_norm/")


def investigate(
    model: Model, data: Dataset, spec: RunSpec, step: int, built: Built, sess: tf.compat.v1.Session,
    snapshot: Snapshot, sample_ids: Sequence[int] | np.ndarray | None = None,
) -> Forensics:
    """Find where the divergence at ``step`` started (see the module docs); never raises.

    ``built`` and ``sess`` are the run's graph and session; ``snapshot`` its variables after the
    last report step before ``step``.
    """
    names = [t.op.name for t in built.model.inputs]
    dtypes = [t.dtype.as_numpy_dtype for t in built.model.inputs]
    found = data_fault(data, spec, step, names, sample_ids, dtypes)
    if found is not None:
        return found
    try:
        return replay(model, data, spec, snapshot, step, built, sess)
    except Exception as exc:  # forensics must never turn a divergence into a failure
        return Forensics(step, note=f"the replay failed: {type(exc).__name__}: {exc}")


def data_fault(
    data: Dataset, spec: RunSpec, step: int, input_names: Sequence[str], sample_ids: Sequence[int] | np.ndarray | None,
    dtypes: Sequence[DTypeLike] | None = None,
) -> Forensics | None:
    """A DATA record if the batch of ``step`` holds a non-finite input or label as fed to placeholders
    of ``dtypes`` (after the cast: 1.2e39 in float64 is Inf in float32), else None."""
    batch = data.batch(step, spec.seed)
    fed = [as_fed(a, dtypes[i] if dtypes is not None else None) for i, a in enumerate(batch)]
    bad = [np.flatnonzero(~finite_rows(a)) for a in fed]  # per array: bad rows of the batch
    if not any(len(rows) for rows in bad):
        return None
    first = next(i for i, rows in enumerate(bad) if len(rows))
    rows = sorted({int(r) for r in np.concatenate(bad)})
    index = data.batch_indices(step, spec.seed)
    samples = [int(index[r]) for r in rows]
    if sample_ids is not None:
        samples = [int(sample_ids[i]) for i in samples]
    what = "label" if has_label(len(batch)) and first == len(batch) - 1 else "input"
    note = f"the batch held {len(rows)} sample(s) with a non-finite {what}"
    _, row, what = overflow(batch[first], fed[first])
    if row >= 0:
        note += f" as fed: sample {samples[rows.index(row)]}, {what}"
    return Forensics(
        step, NonFiniteKind.DATA, op=input_names[first], op_type="Placeholder", samples=tuple(samples), note=note,
    )


def finite_rows(array: np.ndarray) -> np.ndarray:
    """Per sample (first axis): every value finite (non-numeric arrays count as finite)."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.number):
        return np.ones(len(array), bool)
    return np.isfinite(array.reshape(len(array), -1)).all(axis=1)


def replay(model: Model, data: Dataset, spec: RunSpec, snapshot: Snapshot, step: int,
           built: Built | None = None, sess: tf.compat.v1.Session | None = None) -> Forensics:
    """Replay ``step`` from ``snapshot`` with every op's output checked (see the module docs).

    In ``built`` and ``sess`` (the run's), or else in a fresh build of ``spec``.
    """
    if built is None or sess is None:
        built = build(model, spec.config, spec.seed)
        with tf1.Session(graph=built.graph, config=session_config(spec.threads, gpu=True)) as fresh:
            built.start(fresh, spec.config)
            return replay(model, data, spec, snapshot, step, built, fresh)
    load, feeds, checked, stateful = _tools(built)

    def feed(k: int) -> dict[tf.Tensor, np.ndarray]:
        return built.feed(data.batch(k, spec.seed), spec.seed, k)

    sess.run(load, {feeds[name]: value for name, value in snapshot.values().items()})
    for k in range(snapshot.step + 1, step):
        if not all(_finite(sess.run(run.fetches, feed(k))) for run in built.runs):
            note = f"the replay from step {snapshot.step} diverged earlier, at step {k}; not analysed"
            return Forensics(step, replayed_from=snapshot.step, note=note + _redrawn(stateful))
    ops: list[tf.Operation] = []
    for run, tensors in zip(built.runs, checked, strict=True):  # alternating losses: one run each, in order
        values, _ = sess.run((tensors, run.fetches), feed(step))
        bad = {t.name for t, v in zip(tensors, values, strict=True) if not np.all(np.isfinite(v))}
        ops = [op for op in built.graph.get_operations() if any(t.name in bad for t in op.outputs)]
        if ops:
            break
    if not ops:
        note = f"the replay of step {step} stayed finite: the divergence did not reproduce"
        return Forensics(step, replayed_from=snapshot.step, note=note + _redrawn(stateful))
    origin = next((op for op in ops if not any(t.name in bad for t in op.inputs)), ops[0])
    listed = tuple(op.name for op in ops[:LISTED])
    found = norm_overflow(origin, built.gradient_of, dict(zip((t.name for t in tensors), values, strict=True)))
    if found is None:
        found = describe(origin, built.losses if len(built.losses) > 1 else ())
    return replace(found, step=step, nonfinite_ops=listed, replayed_from=snapshot.step)


def norm_overflow(op: tf.Operation, gradient_of: dict[str, str], values: dict[str, np.ndarray]) -> Forensics | None:
    """A gradient's squared norm that overflowed while the gradient stayed finite, named by its weight.

    tuner's global norm (``tf.linalg.global_norm`` in tuner.worker.graph, and the per-weight norms of
    the telemetry) is a sum of ``L2Loss`` ops, the k-th over the k-th gradient: a gradient of 3.9e19
    is finite in float32, its square is not. The first non-finite op is then tuner's
    ``global_norm/L2Loss_k``, which says nothing to the model's author; the weight does.
    ``gradient_of``: gradient tensor name -> its variable; ``values``: the replayed step's outputs.
    """
    if op.type != "L2Loss" or not op.inputs or op.inputs[0].name not in gradient_of:
        return None
    gradient = op.inputs[0].name
    weight = gradient_of[gradient]
    largest = values.get(gradient)
    reached = f" reached {_short(float(np.max(np.abs(largest))))}" if largest is not None else " overflowed"
    layer, iteration, _ = locate(weight)
    return Forensics(0, NonFiniteKind.BACKWARD, op=weight, op_type="gradient norm", layer=layer,
                     iteration=iteration, note=f"gradient norm overflowed (the gradient of {weight}{reached})")


def _short(x: float) -> str:
    """``3.9e19`` for 3.9e+19; two significant digits."""
    return f"{x:.2g}".replace("e+", "e")


def _redrawn(stateful: Sequence[str]) -> str:
    """Why a replay that did not reproduce the run may differ: the stateful random ops it redrew ("" if none)."""
    if not stateful:
        return ""
    return (f"; the train step draws random numbers with stateful ops ({', '.join(stateful[:3])}), which "
            "the replay draws anew: draw them with tf.random.stateless_* and tuner.models.step_seed() "
            "to make the replay exact")


def _finite(fetched: Sequence[ArrayLike]) -> bool:
    """Whether a run's fetches, ``(weights_ok, loss, grad_norm)`` per loss, are all finite."""
    return all(bool(v) if k % 3 == 0 else bool(np.isfinite(v)) for k, v in enumerate(fetched))


def describe(op: tf.Operation, losses: Sequence[str] = ()) -> Forensics:
    """Kind, layer and loop iteration of ``op`` from its name scopes (step left 0).

    ``losses``: the loss names of a model with several, whose name scopes hold tuner's ops of each
    loss (``g_loss/gradients/...``); such an op is read without its loss's scope.
    """
    name = _tuner_part(op.name, losses)
    if name.startswith(UPDATED_SCOPE + "/") and op.type == "ReadVariableOp":
        variable = op.inputs[0].op
        apply = _apply_op(op.graph, variable)
        layer, iteration, _ = locate(variable.name)
        return Forensics(
            0, NonFiniteKind.UPDATE, op=apply.name if apply else op.name,
            op_type=apply.type if apply else op.type, layer=layer, iteration=iteration,
            note=f"the update of weight {variable.name} made it non-finite",
        )
    kind = NonFiniteKind.BACKWARD if name.startswith(_BACKWARD) else NonFiniteKind.FORWARD
    if name.startswith("Adam/") or op.type.startswith(("ResourceApply", "Apply")):
        kind = NonFiniteKind.UPDATE
    layer, iteration, forward_op = locate(name)
    return Forensics(0, kind, op=op.name, op_type=op.type, layer=layer, iteration=iteration, forward_op=forward_op)


def _tuner_part(name: str, losses: Sequence[str]) -> str:
    """``name`` without the loss scope of one of ``losses`` when tuner made it there (``g_loss/gradients/...``)."""
    first, _, rest = name.partition("/")
    tuner_scopes = (*_BACKWARD, UPDATED_SCOPE + "/")
    return rest if first in losses and rest.startswith(tuner_scopes) else name


def locate(name: str) -> tuple[str | None, int | None, str | None]:
    """(layer, loop iteration, forward op) of an op name; see the module docs.

    >>> locate("gradients/iter_3/recompute_input/Log_grad/Reciprocal")
    ('recompute_input', 3, 'iter_3/recompute_input/Log')
    """
    backward = name.startswith("gradients/")
    scopes = name.removeprefix("gradients/").split("/")[:-1]
    cut = next((i for i, s in enumerate(scopes) if s.endswith("_grad")), None)
    forward_op = None
    if backward and cut is not None:
        forward_op = "/".join([*scopes[:cut], scopes[cut].removesuffix("_grad")])
        scopes = scopes[:cut]
    iteration = next((int(m.group(1)) for s in scopes if (m := _ITER.fullmatch(s))), None)
    rest = [s for s in scopes if not _ITER.fullmatch(s)]
    return (rest[0] if rest else None), iteration, forward_op


_TOOLS: weakref.WeakKeyDictionary[tf.Graph, _Tools] = weakref.WeakKeyDictionary()


def _tools(built: Built) -> _Tools:
    """The snapshot loader, the checked tensors of each run of a train step, and its stateful random
    ops, for ``built``, made once per graph (a kept graph serves many runs)."""
    if built.graph not in _TOOLS:
        with built.graph.as_default():
            load, feeds = _loader(built.state)
            needs = [_needed(run.fetches) for run in built.runs]
            checked = [[t for op in built.graph.get_operations() if op in needed
                        for t in op.outputs if t.dtype.is_floating and built.graph.is_fetchable(t)]
                       for needed in needs]
            stateful = [op.name for op, _ in built.random_ops if any(op in needed for needed in needs)]
            _TOOLS[built.graph] = (load, feeds, checked, stateful)
    return _TOOLS[built.graph]


def _loader(variables: Sequence[tf.Variable]) -> tuple[tf.Operation, dict[str, tf.Tensor]]:
    """One op assigning every variable from a placeholder; variable name -> its placeholder."""
    feeds, assigns = {}, []
    with tf.name_scope("snapshot"):
        for v in variables:
            feeds[v.name] = tf1.placeholder(v.dtype.base_dtype, v.shape)
            assigns.append(tf1.assign(v, feeds[v.name]))
    return tf.group(*assigns), feeds


def _needed(fetches: Sequence[tf.Tensor]) -> set[tf.Operation]:
    """Every op that running ``fetches`` runs (their inputs and control inputs, transitively)."""
    needed: set[tf.Operation] = set()
    todo = [f.op for f in fetches]
    while todo:
        op = todo.pop()
        if op not in needed:
            needed.add(op)
            todo.extend(t.op for t in op.inputs)
            todo.extend(op.control_inputs)
    return needed


def _apply_op(graph: tf.Graph, variable: tf.Operation) -> tf.Operation | None:
    """The optimizer op that updates ``variable`` (its handle op), if any."""
    for op in graph.get_operations():
        if op.type.startswith("ResourceApply") and op.inputs and op.inputs[0].op is variable:
            return op
    return None
