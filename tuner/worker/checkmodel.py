"""``python -m tuner check-model SPEC``: check a model against the contract before launching it.

Loads the model, builds it in fresh graphs and trains it a few steps through tuner's own trainer,
then prints one line per check (``PASS`` or ``FAIL`` and what it found):

- ``contract``: ``knobs``, ``build`` and ``data`` are there (and every Knob is valid);
- ``knob names``: no model knob takes the name of one of tuner's knobs;
- ``data``: ``data`` returns a :class:`~tuner.models.Dataset`, the same arrays on every call;
- ``build``: ``build`` returns a :class:`~tuner.models.ModelGraph` of placeholders, one per
  data array, and creates no optimizer;
- ``data preflight``: the launch's data preflight finds nothing, with the arrays cast to the
  placeholders' dtypes (a float64 value beyond float32, a NaN, a label out of its range);
- ``loss``: the loss (each of several named losses) is a scalar and finite at init on the first batch;
- ``gradients``: a gradient reaches every trainable weight; each of several losses trains at least
  one weight (its ``trains=`` matches some) and some loss trains each; a single loss that sums two
  adversarial terms (a GAN's ``d_loss + g_loss``: gradients opposed on the weights and on an
  activation both are computed from, ``tuner.worker.adversaries``) fails;
- ``validation loss``: what a launch ranks trials by (the model's ``val_loss``, else the loss or
  the sum of several losses); a WARN (exit status still 0) when that default sums losses that
  fight (a GAN without its own ``val_loss``): it rises while training is healthy;
- ``knob NAME``: some other valid value of the knob changes the graph's op count, the data, the
  loss at init or how several losses train (update order, optimizer, learning-rate factor), with
  the other knobs at their defaults, or with one of them changed (for a knob that only matters
  together with another);
- ``knob NAME ends``: a numeric knob at its low and at its high end gives a finite loss at init;
- ``training``: a few steps of tuner's trainer stay finite.

Exit status 0 when every check passes (warnings included), 2 otherwise. Errors in the model's code are reported as
one line naming the model, the member and the line of code, never as a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from tuner.config import CheckModelOptions, load_options
from tuner.environ import prepare_process
from tuner.errors import ModelError
from tuner.knobs import TUNER_KNOBS
from tuner.models import Dataset, Model, ModelGraph, load_model, user_code_error
from tuner.preflight import check_data
from tuner.records import RunSpec, RunStatus, TrainConfig
from tuner.worker.actor import import_tensorflow
from tuner.worker.adversaries import opposed_terms, summed_terms

if TYPE_CHECKING:
    from tuner.models.base import Graph, Tensor, Variable

_T = TypeVar("_T")

SEED = 0  # graph seed of every build: the same graph gives the same loss at init
SMOKE = TrainConfig(1e-3, clip_norm=1.0, l2_weight=1e-4)  # the training check's tuner knobs


@dataclass(frozen=True)
class Check:
    """The outcome of one check: its name, whether it passed, and what it found."""

    name: str
    ok: bool
    detail: str
    warn: bool = False  # passed, but a launch would likely go wrong (exit status still 0)

    def line(self) -> str:
        """One report line: ``PASS  name  detail`` (``WARN`` or ``FAIL`` instead of ``PASS``)."""
        return f"{'FAIL' if not self.ok else 'WARN' if self.warn else 'PASS'}  {self.name:<24} {self.detail}"


def run_check(args: argparse.Namespace) -> int:
    """Run every check on ``args.spec`` (training ``args.steps`` steps); print the report.

    Returns:
        0 when every check passed, 2 otherwise.
    """
    options = load_options(CheckModelOptions, vars(args))  # --steps in range, before TensorFlow is imported
    prepare_process()
    import_tensorflow()  # with Keras 2 selected, which tf.compat.v1.layers need
    print(f"checking model {options.spec!r} against tuner's model contract (docs/models.md)", flush=True)
    failed = total = warned = 0
    for check in check_model(options.spec, options.steps):
        print(check.line(), flush=True)
        total += 1
        failed += not check.ok
        warned += check.ok and check.warn
    verdict = "all checks passed" if not failed else f"{failed} of {total} checks failed"
    verdict += f" ({warned} warning{'s' if warned > 1 else ''})" if warned else ""
    print(f"model {options.spec!r}: {verdict}")
    return 2 if failed else 0


def check_model(spec: str, steps: int) -> Iterator[Check]:
    """Yield the checks of ``spec`` in order; stop after a failure that later checks depend on."""
    try:
        model = load_model(spec)
    except ModelError as exc:
        yield Check("contract", False, str(exc))
        return
    yield Check("contract", True, f"{_qualname(model)}: knobs ({len(model.knobs)}), build and data")
    yield _knob_names(model, spec)
    probe = Probe(model, spec)
    for blocking in (probe.data_check, probe.build_check, probe.preflight_check, probe.loss_check):
        check = blocking()
        yield check
        if not check.ok and blocking != probe.preflight_check:  # bad data: the rest is still checked
            return
    yield probe.gradient_check()
    yield probe.val_loss_check()
    for name in model.knobs:
        yield probe.knob_check(name)
        if model.knobs[name].kind in ("int", "float"):
            yield probe.ends_check(name)
    yield _training(model, spec, steps, probe.defaults)


def _qualname(model: Model) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


def _knob_names(model: Model, spec: str) -> Check:
    clash = sorted(set(model.knobs) & set(TUNER_KNOBS))
    if clash:
        return Check("knob names", False, f"model {spec!r}: knob(s) {clash} take the name of tuner's own knobs "
                     f"{sorted(TUNER_KNOBS)}, which tuner applies itself: rename them")
    return Check("knob names", True, f"{sorted(model.knobs)}; none is one of tuner's own knobs")


@dataclass(frozen=True)
class _Built:
    """One build of the model alone (no optimizer) in its own graph, with its op count."""

    graph: Graph
    model: ModelGraph
    ops: int


class Probe:
    """Builds, data and losses at init of one model, cached by knob values."""

    def __init__(self, model: Model, spec: str) -> None:
        self.model, self.spec = model, spec
        self.defaults: dict[str, object] = {name: knob.default for name, knob in model.knobs.items()}
        self._builds: dict[str, _Built] = {}
        self._datasets: dict[str, Dataset] = {}
        self._losses: dict[str, dict[str, float]] = {}

    # -- the checks ------------------------------------------------------------------------

    def data_check(self) -> Check:
        """``data`` returns a Dataset, the same arrays on every call."""
        try:
            data = self.data(self.defaults)
            again = self._call("data(knobs)", self.model.data, self.defaults)
        except ModelError as exc:
            return Check("data", False, str(exc))
        if _fingerprint(again) != _fingerprint(data):
            return Check("data", False, f"model {self.spec!r}: data() returns different arrays on each call; "
                         "make it deterministic (seed its generator): the trial seed only picks the batch order")
        return Check("data", True, f"{len(data.train)} array(s), {data.size} train / {len(data.val[0])} val "
                     f"samples, batch {data.batch_size}; the same arrays on every call")

    def build_check(self) -> Check:
        """``build`` returns a ModelGraph of placeholders, one per data array, and no optimizer."""
        try:
            built = self.build(self.defaults)
        except ModelError as exc:
            return Check("build", False, str(exc))
        problem = _graph_problem(built, len(self.data(self.defaults).train))
        if problem:
            return Check("build", False, f"model {self.spec!r}: build() {problem}")
        weights = len(built.graph.get_collection("trainable_variables"))
        return Check("build", True, f"fresh graph: {built.ops} ops, {len(built.model.inputs)} "
                     f"placeholder(s), {weights} trainable weight(s)")

    def preflight_check(self) -> Check:
        """The data preflight of a launch finds nothing, the arrays checked as fed to the placeholders."""
        dtypes = [t.dtype.as_numpy_dtype for t in self.build(self.defaults).model.inputs]
        report = check_data(self.data(self.defaults), dtypes)
        if report.findings:
            found = "; ".join(f.line() for f in report.findings)
            return Check("data preflight", False, f"model {self.spec!r}: {found}; fix the data, or a launch stops "
                         "(with --allow-bad-data, it leaves these samples out)")
        sizes = report.sizes
        return Check("data preflight", True, f"{sizes['train']} train / {sizes['val']} val samples finite as fed, "
                     "in the declared ranges")

    def ends_check(self, name: str) -> Check:
        """The loss at init is finite with numeric knob ``name`` at its low and at its high end."""
        knob = self.model.knobs[name]
        try:
            for end, value in (("low", knob.low), ("high", knob.high)):
                value = int(value) if knob.kind == "int" else value  # type: ignore[arg-type]
                loss = self.loss({**self.defaults, name: value})
                if not math.isfinite(loss):
                    return Check(f"knob {name} ends", False, f"model {self.spec!r}: with {name}={value!r} (its {end} "
                                 f"end) the loss at init is {loss} on the first batch: narrow the knob's range, "
                                 "or guard the model at that value")
        except ModelError as exc:
            return Check(f"knob {name} ends", False, str(exc))
        return Check(f"knob {name} ends", True, f"loss at init finite at {name}={knob.low!r} and {knob.high!r}")

    def loss_check(self) -> Check:
        """Each loss (and the validation loss) is a scalar, finite at init on the first batch."""
        mg = self.build(self.defaults).model
        tensors = {("loss" if not mg.losses else f'loss "{name}"'): loss.tensor
                   for name, loss in mg.all_losses().items()}
        for what, tensor in (*tensors.items(), ("val_loss", mg.val_loss)):
            shape = getattr(tensor, "shape", None)
            if tensor is not None and (shape is None or shape.rank != 0):
                return Check("loss", False, f"model {self.spec!r}: build() returned a {what} of shape "
                             f"{shape}; it must be a scalar: reduce it over the batch (tf.reduce_mean)")
        try:
            values = self.losses(self.defaults)
        except ModelError as exc:
            return Check("loss", False, str(exc))
        for name, value in values.items():
            if not math.isfinite(value):
                what = "the loss" if not mg.losses else f'loss "{name}"'
                return Check("loss", False, f"model {self.spec!r}: {what} at init is {value} on the first "
                             "batch; check the data (NaN, huge values) and the loss (log of 0, division by 0)")
        if not mg.losses:
            return Check("loss", True, f"scalar, finite at init on the first batch: {values['loss']:.4g}")
        each = ", ".join(f"{name} {value:.4g}" for name, value in values.items())
        return Check("loss", True, f"{len(values)} scalar losses, updated {mg.update}ly, finite at init on the "
                     f"first batch: {each}")

    def gradient_check(self) -> Check:
        """A gradient reaches every trainable weight; with several losses, each loss trains at least
        one weight and a gradient of it reaches each weight it trains."""
        import tensorflow as tf

        built = self.build(self.defaults)
        with built.graph.as_default():
            variables = tf.compat.v1.trainable_variables()
            if not variables:
                return Check("gradients", False, f"model {self.spec!r}: build() creates no trainable weight")
            trained = {name: loss.variables(variables) for name, loss in built.model.all_losses().items()}
            grads = {name: tf.compat.v1.gradients(built.model.all_losses()[name].tensor, own) if own else []
                     for name, own in trained.items()}
        for name, own in trained.items():
            if not own:
                return Check("gradients", False, f'model {self.spec!r}: loss "{name}" trains no weight: its trains= '
                             f"({built.model.losses[name].describe_trains()}) matches none of "
                             f"{[v.op.name for v in variables][:8]}; name a scope or filter that matches")
        dead = [v.op.name for name in trained for v, g in zip(trained[name], grads[name], strict=True) if g is None]
        if dead:
            return Check("gradients", False, f"model {self.spec!r}: no gradient reaches {dead}: use them in "
                         "the loss, or create them with trainable=False")
        covered = {id(v) for own in trained.values() for v in own}
        idle = [v.op.name for v in variables if id(v) not in covered]
        if idle:
            return Check("gradients", False, f"model {self.spec!r}: no loss trains {idle}: add them to a loss's "
                         "trains=, or create them with trainable=False")
        if not built.model.losses:
            return self.adversaries_check(built, variables, grads["loss"])
        each = ", ".join(f"{name} {len(own)}" for name, own in trained.items())
        return Check("gradients", True, f"each loss trains its weights ({each}), a gradient reaches each of them")

    def adversaries_check(self, built: _Built, variables: list[Variable], grads: list[Tensor | None]) -> Check:
        """A single loss that is a sum of terms pulling its weights in opposite directions (the naive
        port of a GAN: ``d_loss + g_loss`` under one optimizer) fails; otherwise gradients pass."""
        terms = summed_terms(built.model.loss)
        fight = None
        if len(terms) > 1:
            fight = opposed_terms(built.graph, terms, variables, self._feed(built, self.defaults), _session())
        if fight is not None:
            a, b, cosine = fight
            return Check("gradients", False, f"model {self.spec!r}: the loss is a sum whose terms {a} and {b} pull "
                         f"the weights in opposite directions (cosine {cosine:.2f} at init): one optimizer minimizing "
                         "their sum trains neither (a GAN's d_loss + g_loss); return them as named losses, each "
                         "with the weights it trains: ModelGraph(losses={...}) (docs/models.md, several losses)")
        return Check("gradients", True, f"a gradient reaches each of the {len(variables)} trainable weight(s)")

    def val_loss_check(self) -> Check:
        """The validation loss a launch ranks trials by: the model's own ``val_loss``, or tuner's
        default (the loss, or the sum of several losses). A default that sums losses that fight
        (a GAN's d_loss and g_loss: gradients opposed, ``tuner.worker.adversaries``) rises while
        training is healthy, so every trial would end "did not learn": a warning."""
        import tensorflow as tf

        built = self.build(self.defaults)
        mg = built.model
        if mg.val_loss is not None:
            return Check("validation loss", True, "the model's own val_loss")
        if not mg.losses:
            return Check("validation loss", True, "the loss on the validation data (no val_loss of its own)")
        names = " + ".join(mg.losses)
        terms = [term for loss in mg.losses.values() for term in summed_terms(loss.tensor)]
        with built.graph.as_default():
            variables = tf.compat.v1.trainable_variables()
        fight = opposed_terms(built.graph, terms, variables, self._feed(built, self.defaults), _session())
        if fight is None:
            return Check("validation loss", True, f"the sum of the losses ({names}) on the validation data")
        a, b, cosine = fight
        return Check("validation loss", True, warn=True, detail=(
            f"model {self.spec!r} has no val_loss: the default is the sum of its losses ({names}), whose terms "
            f"{a} and {b} fight (gradients opposed, cosine {cosine:.2f} at init): that sum rises while training "
            "is healthy, so every trial would end 'did not learn'; return a val_loss that falls as the model "
            "learns: ModelGraph(val_loss=...) (docs/models.md)"))

    def knob_check(self, name: str) -> Check:
        """Some other valid value of knob ``name`` changes the graph, the data or the loss at init."""
        tried = self.model.knobs[name].alternatives()
        try:
            for context, note in self._contexts(name):
                for value in tried:
                    change = self.difference(context, {**context, name: value})
                    if change:
                        about = f" ({self.model.knobs[name].help})" if self.model.knobs[name].help else ""
                        return Check(f"knob {name}", True, f"{name}={value!r} {change}{note}{about}")
        except ModelError as exc:
            return Check(f"knob {name}", False, str(exc))
        return Check(f"knob {name}", False, f"model {self.spec!r}: knob {name!r} changes nothing: none of "
                     f"{tried} changes the graph, the data or the loss at init, even with another knob "
                     "changed; use it in build or data, or remove it")

    # -- cached pieces ---------------------------------------------------------------------

    def build(self, knobs: Mapping[str, object]) -> _Built:
        """The model alone (no optimizer), built with ``knobs`` in a fresh graph."""
        key = _key(knobs)
        if key not in self._builds:
            self._builds[key] = self._build(knobs)
        return self._builds[key]

    def data(self, knobs: Mapping[str, object]) -> Dataset:
        """The model's dataset for ``knobs``."""
        key = _key(knobs)
        if key not in self._datasets:
            data = self._call("data(knobs)", self.model.data, knobs)
            if not isinstance(data, Dataset):
                raise ModelError(f"model {self.spec!r}: data() must return a tuner.models.Dataset, "
                                 f"got {type(data).__name__}")
            self._datasets[key] = data
        return self._datasets[key]

    def loss(self, knobs: Mapping[str, object]) -> float:
        """The loss at init on the first batch (seed 0) for ``knobs`` (the sum of several losses)."""
        return sum(self.losses(knobs).values())

    def losses(self, knobs: Mapping[str, object]) -> dict[str, float]:
        """Each loss at init on the first batch (seed 0) for ``knobs`` (``{"loss": ...}`` for one)."""
        key = _key(knobs)
        if key not in self._losses:
            self._losses[key] = self._loss(knobs)
        return self._losses[key]

    def difference(self, a: Mapping[str, object], b: Mapping[str, object]) -> str | None:
        """What differs between the knob values ``a`` and ``b`` (None: nothing seen)."""
        ops_a, ops_b = self.build(a).ops, self.build(b).ops
        if ops_a != ops_b:
            return f"changes the graph ({ops_a} -> {ops_b} ops)"
        if _fingerprint(self.data(a)) != _fingerprint(self.data(b)):
            return "changes the data"
        setup_a, setup_b = _training_setup(self.build(a)), _training_setup(self.build(b))
        changed = [f"{k} {setup_a.get(k)} -> {setup_b.get(k)}" for k in {**setup_a, **setup_b}
                   if setup_a.get(k) != setup_b.get(k)]
        if changed:
            return f"changes how the losses train ({'; '.join(changed)})"
        loss_a, loss_b = self.loss(a), self.loss(b)
        if not (loss_a == loss_b or (math.isnan(loss_a) and math.isnan(loss_b))):
            return f"changes the loss at init ({loss_a:.4g} -> {loss_b:.4g})"
        return None

    def _contexts(self, name: str) -> Iterator[tuple[dict[str, object], str]]:
        """The defaults, then the defaults with one other knob changed (for conditional knobs)."""
        yield dict(self.defaults), ""
        for other, knob in self.model.knobs.items():
            if other != name:
                for value in knob.alternatives():
                    yield {**self.defaults, other: value}, f" (when {other}={value!r})"

    def _build(self, knobs: Mapping[str, object]) -> _Built:
        import tensorflow as tf

        graph = tf.Graph()
        state = random.getstate()
        random.seed(SEED)  # Keras 2's unseeded initializers draw their seeds from it: the same init every build
        try:
            with graph.as_default():
                tf.compat.v1.set_random_seed(SEED)
                mg = self._call("build(knobs)", self.model.build, knobs)
        finally:
            random.setstate(state)
        if not isinstance(mg, ModelGraph):
            raise ModelError(f"model {self.spec!r}: build() must return a tuner.models.ModelGraph, "
                             f"got {type(mg).__name__}")
        return _Built(graph, mg, len(graph.get_operations()))

    def _loss(self, knobs: Mapping[str, object]) -> dict[str, float]:
        import tensorflow as tf

        built = self.build(knobs)
        with built.graph.as_default():
            init = tf.compat.v1.global_variables_initializer()
        losses = {name: loss.tensor for name, loss in built.model.all_losses().items()}
        with tf.compat.v1.Session(graph=built.graph, config=_session()) as sess:
            sess.run(init)
            values = self._call("running the loss on the first batch", sess.run, losses, self._feed(built, knobs))
        return {name: float(value) for name, value in values.items()}

    def _feed(self, built: _Built, knobs: Mapping[str, object]) -> dict[Tensor, np.ndarray]:
        """The first batch (seed 0) for the model's placeholders, and its step seed if it made one."""
        from tuner.models.base import STEP_SEED

        feed: dict[Tensor, np.ndarray] = dict(zip(built.model.inputs, self.data(knobs).batch(1, SEED), strict=False))
        with contextlib.suppress(KeyError):  # no step_seed() in the graph
            feed[built.graph.get_tensor_by_name(STEP_SEED + ":0")] = np.array([SEED, 1], np.int32)
        return feed

    def _call(self, doing: str, fn: Callable[..., _T], *args: object) -> _T:
        """Call the model's code; any exception becomes a one-line ModelError at its line."""
        try:
            return fn(*args)
        except Exception as exc:
            raise user_code_error(self.spec, doing, exc) from None


def _graph_problem(built: _Built, arrays: int) -> str | None:
    """What is wrong with a model's graph (None: nothing)."""
    inputs = list(built.model.inputs)
    kinds = {getattr(getattr(t, "op", None), "type", None) for t in inputs}
    if not kinds <= {"Placeholder", "PlaceholderWithDefault"}:
        return "must return placeholders (tf.compat.v1.placeholder) as ModelGraph.inputs"
    if len(inputs) != arrays:
        return f"returned {len(inputs)} placeholder(s) but data() has {arrays} array(s): one per array, same order"
    applies = sorted({op.type for op in built.graph.get_operations() if "Apply" in op.type})
    if applies:
        return f"creates an optimizer ({', '.join(applies)}): tuner adds Adam, L2 and clipping; return the loss only"
    return None


def _training(model: Model, spec: str, steps: int, knobs: Mapping[str, object]) -> Check:
    """A few steps of tuner's own trainer (Adam, L2, clipping, the NaN checks) stay finite."""
    from tuner.worker.train import train_run

    run = RunSpec(0, SEED, spec, replace(SMOKE, knobs=dict(knobs)), steps=steps, report_every=steps)
    try:
        final = list(train_run(model, model.data(knobs), run))[-1]
    except Exception as exc:
        return Check("training", False, str(user_code_error(spec, "training", exc)))
    setup = f"{steps} step(s), learning rate {SMOKE.learning_rate:g}, clip {SMOKE.clip_norm:g}, L2 {SMOKE.l2_weight:g}"
    if final.status is not RunStatus.SURVIVED:
        return Check("training", False, f"model {spec!r}: {setup} with the default knobs: {final.status} at step "
                     f"{final.step} ({final.cause} went NaN/Inf); check the data and the loss")
    return Check("training", True, f"{setup}: loss {final.loss:.4g}, validation loss {final.val_loss:.4g}")


def _training_setup(built: _Built) -> dict[str, str]:
    """How tuner trains the losses of a build: the update order and each loss's optimizer, learning-rate
    factor and weights (empty for a model with one loss)."""
    mg = built.model
    if not mg.losses:
        return {}
    variables = built.graph.get_collection("trainable_variables")
    setup = {"update": mg.update}
    setup.update({f'loss "{name}"': f"{loss.optimizer or 'trial optimizer'} at lr x{loss.lr_factor:g} on "
                  f"{len(loss.variables(variables))} weight(s)" for name, loss in mg.losses.items()})
    return setup


def _session() -> object:
    from tuner.worker.train import session_config

    return session_config(1, gpu=False)


def _key(knobs: Mapping[str, object]) -> str:
    return repr(sorted(knobs.items()))


def _fingerprint(data: Dataset) -> str:
    """A digest of a dataset's arrays and settings (its batch size, ranges, any added fields)."""
    digest = hashlib.sha1()
    for array in (*data.train, *data.val):
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    settings = [(f.name, getattr(data, f.name)) for f in fields(data) if f.name not in ("train", "val")]
    digest.update(f"{type(data).__qualname__}{settings}".encode())
    return digest.hexdigest()
