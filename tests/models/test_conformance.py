"""One conformance suite over every registered model (and the test fixture model).

Each model: its knobs are valid; it builds in a fresh graph; its data fits its placeholders; its
loss is finite at init on a tiny batch; and tuner's knobs (learning rate, clipping, L2) apply.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tuner.models import BUILTIN, Knob, load_model
from tuner.records import RunSpec, RunStatus, TrainConfig

pytestmark = pytest.mark.tf

PLANTED = f"{Path(__file__).resolve().parent.parent / 'fixtures' / 'planted.py'}:Planted"
ADDING_RNN = f"{Path(__file__).resolve().parents[2] / 'examples' / 'adding_lstm.py'}:AddingRNN"
MODELS = [*sorted(BUILTIN), PLANTED, ADDING_RNN]


def defaults(model) -> dict:
    return {name: knob.default for name, knob in model.knobs.items()}


def one_step(spec_model: str, config: TrainConfig, batch_size: int = 4):
    """Build, init and run one train step on a tiny batch; return (built, fetched values, deltas)."""
    import tensorflow as tf

    from tuner.worker.train import build

    model = load_model(spec_model)
    data = model.data(config.knobs)
    built = build(model, config, seed=0)
    batch = tuple(a[:batch_size] for a in data.batch(1, 0))
    with tf.compat.v1.Session(graph=built.graph) as sess:
        built.start(sess, config)  # the variables initialised, tuner's knobs set to the config's
        variables = built.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        before = sess.run(variables)
        fetched = sess.run(built.train_fetches, built.feed(batch))
        after = sess.run(variables)
    deltas = [float(np.max(np.abs(a - b))) for a, b in zip(after, before, strict=True)]
    return built, fetched, deltas


@pytest.mark.parametrize("spec", MODELS)
def test_model_knobs_are_valid_knobs(spec: str) -> None:
    model = load_model(spec)
    assert model.knobs and all(isinstance(k, Knob) for k in model.knobs.values())
    assert all(k.problem(k.default) is None for k in model.knobs.values())


@pytest.mark.parametrize("spec", MODELS)
def test_model_data_fits_placeholders_and_ignores_seed(spec: str) -> None:
    model = load_model(spec)
    data = model.data(defaults(model))
    assert len(data.train) == len(data.val) >= 1
    first, again, other = data.batch(3, 0), data.batch(3, 0), data.batch(3, 1)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again, strict=True))
    assert len(first[0]) == data.batch_size
    assert data.size >= data.batch_size
    assert model.data(defaults(model)).size == data.size  # deterministic, not seed-dependent
    assert other is not None


@pytest.mark.parametrize("spec", MODELS)
def test_model_builds_fresh_graph_with_finite_scalar_loss(spec: str) -> None:
    model = load_model(spec)
    built, (weights_ok, loss, gnorm), _ = one_step(spec, TrainConfig(1e-3, knobs=defaults(model)))
    assert built.model.loss.shape.rank == 0
    assert math.isfinite(loss) and math.isfinite(gnorm) and weights_ok
    assert len(built.model.inputs) == len(model.data(defaults(model)).train)


@pytest.mark.parametrize("spec", MODELS)
def test_model_learning_rate_sets_first_adam_step(spec: str) -> None:
    """Adam's first step moves each weight by at most the learning rate, and some by about it."""
    model = load_model(spec)
    _, _, deltas = one_step(spec, TrainConfig(1e-3, knobs=defaults(model)))
    assert max(deltas) == pytest.approx(1e-3, rel=0.05)
    assert all(d <= 1e-3 * 1.05 for d in deltas)


@pytest.mark.parametrize("spec", MODELS)
def test_model_clipping_and_l2_apply(spec: str) -> None:
    model = load_model(spec)
    knobs = defaults(model)
    _, (_, _, plain), _ = one_step(spec, TrainConfig(1e-3, knobs=knobs))
    _, (_, _, with_l2), _ = one_step(spec, TrainConfig(1e-3, l2_weight=1.0, knobs=knobs))
    assert with_l2 != pytest.approx(plain, rel=1e-4)  # the L2 term reaches the gradients


@pytest.mark.parametrize("spec", sorted(BUILTIN))
def test_model_trains_a_few_steps_through_the_runner(spec: str) -> None:
    from tuner.worker.train import train_run

    model = load_model(spec)
    knobs = defaults(model)
    spec_ = RunSpec(0, 0, spec, TrainConfig(1e-3, clip_norm=1.0, knobs=knobs), steps=20, report_every=10)
    records = list(train_run(model, model.data(knobs), spec_))
    assert records[-1].status is RunStatus.SURVIVED
    assert [r.step for r in records] == [10, 20, 20]
