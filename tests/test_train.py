"""The training loop: exact divergence step and cause, progress cadence, what tuner adds to a graph."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

from planted import Planted

from tuner.records import DivergedOn, RunSpec, RunStatus, TrainConfig

pytestmark = pytest.mark.tf


def run(knobs: dict, steps: int = 60, report_every: int = 10, **config: float) -> list:
    from tuner.worker.train import train_run

    model = Planted()
    knobs = {k: v.default for k, v in model.knobs.items()} | knobs
    cfg = TrainConfig(learning_rate=config.pop("learning_rate", 1e-2), knobs=knobs, **config)
    return list(train_run(model, model.data(knobs), RunSpec(0, 0, "planted", cfg, steps, report_every)))


@pytest.mark.parametrize(("fault", "cause"), [("loss", DivergedOn.LOSS), ("gradient", DivergedOn.GRADIENT)])
def test_train_run_stops_at_exact_step_of_planted_fault(fault: str, cause: DivergedOn) -> None:
    records = run({"fault": fault, "bad_step": 37})
    final = records[-1]
    assert final.final and final.status is RunStatus.DIVERGED
    assert (final.step, final.steps_survived, final.diverged_on) == (37, 36, cause)
    assert math.isfinite(final.last_finite_loss)
    assert [r.step for r in records if r.status is RunStatus.RUNNING] == [10, 20, 30]
    alarm = records[-2]  # streamed before the replay, so the driver cancels the siblings at once
    assert (alarm.final, alarm.status, alarm.step, alarm.diverged_on) == (False, RunStatus.DIVERGED, 37, cause)


def test_train_run_gradient_fault_has_finite_loss_but_is_caught() -> None:
    """The facts: a gradient can overflow while the loss is still finite; a loss-only check misses it."""
    records = run({"fault": "gradient", "bad_step": 5}, report_every=1)
    assert records[-1].diverged_on is DivergedOn.GRADIENT
    assert records[-1].step == 5


def test_train_run_updated_weight_overflow_is_caught() -> None:
    records = run({"fault": "weight"}, learning_rate=3e38)  # Adam steps ~lr: w overflows on step 2
    final = records[-1]
    assert (final.status, final.diverged_on, final.step) == (RunStatus.DIVERGED, DivergedOn.WEIGHT, 2)


def test_train_run_survivor_reports_val_loss_and_summary() -> None:
    records = run({}, steps=30, report_every=10)
    final = records[-1]
    assert final.status is RunStatus.SURVIVED and final.steps_survived == 30
    assert final.val_loss is not None and math.isfinite(final.val_loss)
    assert {"grad_norm_p50", "grad_norm_p90", "grad_norm_p99", "grad_norm_max"} <= set(final.metrics)
    assert final.info["train_seconds"] > 0


def test_train_run_clipping_counts_clipped_steps() -> None:
    clipped = run({}, steps=20, clip_norm=1e-6)[-1]
    unclipped = run({}, steps=20, clip_norm=1e6)[-1]
    assert clipped.metrics["clip_fraction"] == 1.0
    assert unclipped.metrics["clip_fraction"] == 0.0


def test_train_run_should_stop_cancels_at_next_report() -> None:
    from tuner.worker.train import train_run

    model = Planted()
    knobs = {k: v.default for k, v in model.knobs.items()}
    spec = RunSpec(0, 0, "planted", TrainConfig(1e-2, knobs=knobs), 10_000, 10)
    reported: list[int] = []  # false while the graph is built, true once the first report is out
    records = []
    for record in train_run(model, model.data(knobs), spec, should_stop=lambda: bool(reported)):
        records.append(record)
        reported.append(record.step)
    assert records[-1].status is RunStatus.CANCELLED and records[-1].steps_survived == 10


def test_train_run_cancelled_during_its_graph_build_trains_no_step() -> None:
    from tuner.worker.train import train_run

    model = Planted()
    knobs = {k: v.default for k, v in model.knobs.items()}
    spec = RunSpec(0, 0, "planted", TrainConfig(1e-2, knobs=knobs), 10_000, 10)
    records = list(train_run(model, model.data(knobs), spec, should_stop=lambda: True))
    assert len(records) == 1
    assert records[0].final and records[0].status is RunStatus.CANCELLED and records[0].step == 0


def test_train_run_cancel_stops_a_build_midway() -> None:
    """A cancel that comes while the graph is being built ends the run before the build does."""
    from tuner.models import load_model
    from tuner.worker.train import train_run

    model = load_model("iterated_mlp")
    knobs = {k: v.default for k, v in model.knobs.items()} | {"max_iter": 16}
    spec = RunSpec(0, 0, "iterated_mlp", TrainConfig(1e-3, knobs=knobs), 10_000, 10)
    asked: list[bool] = []

    def cancelled_soon() -> bool:  # the cancel arrives while the first ~200 ops are made
        asked.append(True)
        return len(asked) >= 3

    records = list(train_run(model, model.data(knobs), spec, should_stop=cancelled_soon))
    assert len(records) == 1 and records[0].status is RunStatus.CANCELLED and records[0].step == 0
    assert len(asked) == 3  # asked every StoppableGraph.CHECK_EVERY ops while building, not after the stop


def test_build_adds_l2_over_kernels_only() -> None:
    import tensorflow as tf

    from tuner.worker.train import build

    model = Planted()
    knobs = {k: v.default for k, v in model.knobs.items()} | {"width": 3}
    base = TrainConfig(1e-2, knobs=knobs)
    with_l2 = TrainConfig(1e-2, l2_weight=0.5, knobs=knobs)
    data = model.data(knobs)
    values = []
    for config in (base, with_l2):
        built = build(model, config, 0)
        with tf.compat.v1.Session(graph=built.graph) as sess:
            built.start(sess, config)
            _, _, gnorm = sess.run(built.train_fetches, built.feed(data.batch(1, 0)))
            values.append(gnorm)
    # each of the 12 kernel entries has data gradient -0.4; the L2 term adds 0.5 * w = 0.05
    assert values[0] == pytest.approx(0.4 * 12**0.5, rel=1e-5)
    assert values[1] == pytest.approx(0.35 * 12**0.5, rel=1e-5)


def _trained(model: object, spec: RunSpec, graphs: object = None) -> list:
    from tuner.worker.train import train_run

    return list(train_run(model, model.data(spec.config.knobs), spec, graphs=graphs))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "knobs", "steps"),
    [("iterated_mlp", {"max_iter": 4}, 60), ("counting_cnn", {}, 6)],
)
def test_reused_graph_trains_exactly_as_a_fresh_build(name: str, knobs: dict, steps: int) -> None:
    """A kept graph, reseeded for another seed and fed other tuner knobs, gives a fresh build's run."""
    from tuner.models import load_model
    from tuner.worker.train import Graphs

    model = load_model(name)
    knobs = {k: v.default for k, v in model.knobs.items()} | knobs
    first = TrainConfig(3e-3, clip_norm=0.5, l2_weight=1e-3, lr_decay=0.5, knobs=knobs)
    second = TrainConfig(1e-3, knobs=knobs)  # no clipping, no L2, no decay: the "off" values fed
    graphs = Graphs()
    _trained(model, RunSpec(0, 11, name, first, steps, 20), graphs)
    reused = _trained(model, RunSpec(1, 12345, name, second, steps, 20), graphs)
    fresh = _trained(model, RunSpec(1, 12345, name, second, steps, 20))
    assert (reused[-1].info["graph"], fresh[-1].info["graph"]) == ("reused", "built")
    assert [(r.step, r.status, r.loss, r.grad_norm) for r in reused] == [
        (r.step, r.status, r.loss, r.grad_norm) for r in fresh
    ]
    assert (reused[-1].init_val_loss, reused[-1].val_loss) == (fresh[-1].init_val_loss, fresh[-1].val_loss)
    other_seed = _trained(model, RunSpec(1, 7, name, second, steps, 20), graphs)
    assert other_seed[-1].init_val_loss != reused[-1].init_val_loss  # the reseed changed the init


def test_reused_graph_clips_and_decays_as_a_fresh_build() -> None:
    """Tuner's knobs switched on after a run without them: the same divergence step and losses."""
    from tuner.models import load_model
    from tuner.worker.train import Graphs

    model = load_model("iterated_mlp")
    knobs = {k: v.default for k, v in model.knobs.items()} | {"max_iter": 4}
    graphs = Graphs()
    _trained(model, RunSpec(0, 1, "iterated_mlp", TrainConfig(1e-3, knobs=knobs), 5, 5), graphs)
    hot = TrainConfig(0.5, clip_norm=2.0, l2_weight=1e-2, lr_decay=0.1, knobs=knobs)
    reused = _trained(model, RunSpec(1, 99, "iterated_mlp", hot, 80, 10), graphs)
    fresh = _trained(model, RunSpec(1, 99, "iterated_mlp", hot, 80, 10))
    assert reused[-1].info["graph"] == "reused"
    assert [(r.step, r.status, r.loss, r.diverged_on) for r in reused] == [
        (r.step, r.status, r.loss, r.diverged_on) for r in fresh
    ]
    assert reused[-1].metrics["clip_fraction"] == fresh[-1].metrics["clip_fraction"] > 0


def test_graphs_keep_the_latest_configs_and_rebuild_a_graph_with_its_own_seeds() -> None:
    import tensorflow as tf

    from tuner.worker.train import Graphs

    class OpSeed(Planted):
        """Draws a random op with an op seed: ``(graph seed, 3)``, which a reseed follows."""

        def build(self, knobs: dict) -> object:
            graph = super().build(knobs)
            tf.random.uniform([1], seed=3)
            return graph

    class RawSeed(Planted):
        """Draws a random op with raw seeds: its seed attribute cannot follow the graph seed."""

        def build(self, knobs: dict) -> object:
            graph = super().build(knobs)
            tf.raw_ops.RandomUniform(shape=[1], dtype=tf.float32, seed=5, seed2=7)
            return graph

    graphs = Graphs(size=2)
    model = Planted()
    base = {k: v.default for k, v in model.knobs.items()}
    configs = [TrainConfig(1e-2, knobs=base | {"width": w}) for w in (1, 2, 3)]
    assert [graphs.get(model, c, 0)[1] for c in configs] == [False, False, False]
    assert [graphs.get(model, c, 1)[1] for c in configs[1:]] == [True, True]
    assert graphs.get(model, configs[0], 1)[1] is False  # the oldest was dropped
    assert [Graphs(size=0).get(model, configs[0], s)[1] for s in (0, 1)] == [False, False]  # reuse off
    op_seed = OpSeed()
    graphs.get(op_seed, configs[0], 0)
    built, reused = graphs.get(op_seed, configs[0], 42)
    assert reused and [(op.get_attr("seed"), op.get_attr("seed2")) for op, _ in built.random_ops] == [(42, 3)]
    raw = RawSeed()
    assert graphs.get(raw, configs[0], 0)[0].reusable is False
    assert graphs.get(raw, configs[0], 1)[1] is False


def _one_step_weight(config: TrainConfig, steps: int = 1) -> tuple[float, bool]:
    """Planted (width 3, every kernel gradient -0.4 at w = 0.1): a kernel entry after ``steps``
    train steps, and whether the last step was clipped."""
    import tensorflow as tf

    from tuner.worker.train import build

    model = Planted()
    built = build(model, config, 0)
    data = model.data(config.knobs)
    with tf.compat.v1.Session(graph=built.graph) as sess:
        built.start(sess, config)
        clipped = False
        for step in range(1, steps + 1):
            extra = () if built.clipped is None else (built.clipped,)
            out = sess.run(built.train_fetches + extra, built.feed(data.batch(step, 0)))
            clipped = bool(out[3]) if extra else False
        (w,) = [v for v in built.state if v.name == "w:0"]
        return float(sess.run(w)[0, 0]), clipped


WIDE = {"fault": "none", "bad_step": 0, "batch_size": 8, "width": 3}


@pytest.mark.parametrize(
    ("optimizer", "knobs", "expected"),
    [
        ("sgd", {}, 0.1 + 0.1 * 0.4),
        ("adagrad", {}, 0.1 + 0.1 * 0.4 / (0.1 + 0.16) ** 0.5),  # accumulator starts at 0.1
        ("rmsprop", {}, 0.1 + 0.1 * 0.4 / (0.9 * 1.0 + 0.1 * 0.16) ** 0.5),  # mean square starts at 1
        ("rmsprop", {"rho": 0.5}, 0.1 + 0.1 * 0.4 / (0.5 * 1.0 + 0.5 * 0.16) ** 0.5),
        ("adam", {}, 0.1 + 0.1),  # Adam's first step is lr * sign(-g)
        ("momentum", {}, 0.1 + 0.1 * 0.4),  # the same first step as SGD; momentum shows on the second
    ],
)
def test_each_optimizer_takes_its_tf1_update(optimizer: str, knobs: dict, expected: float) -> None:
    w, _ = _one_step_weight(TrainConfig(0.1, optimizer=optimizer, knobs=WIDE, **knobs))
    assert w == pytest.approx(expected, rel=1e-4)


def test_momentum_knob_is_fed() -> None:
    """Two steps: momentum 0 is plain SGD, momentum 0.9 carries the first step's velocity on."""
    plain, _ = _one_step_weight(TrainConfig(0.1, optimizer="sgd", knobs=WIDE), steps=2)
    none, _ = _one_step_weight(TrainConfig(0.1, optimizer="momentum", momentum=0.0, knobs=WIDE), steps=2)
    heavy, _ = _one_step_weight(TrainConfig(0.1, optimizer="momentum", momentum=0.9, knobs=WIDE), steps=2)
    assert none == pytest.approx(plain, rel=1e-6)
    assert heavy > plain + 0.02  # the first step's velocity carries on


@pytest.mark.parametrize(
    ("mode", "clip", "expected", "clipped"),
    [
        ("global", 0.5, 0.1 + 0.4 * 0.5 / (0.4 * 12**0.5), None),  # scaled by clip / global norm
        ("per_tensor", 0.5, 0.1 + 0.4 * 0.5 / (0.4 * 12**0.5), True),  # one tensor: its norm is the global one
        ("value", 0.1, 0.1 + 0.1, True),  # each value cut to -0.1
        ("value", 1.0, 0.1 + 0.4, False),  # nothing above 1.0
        ("per_tensor", 10.0, 0.1 + 0.4, False),
    ],
)
def test_clip_modes_clip_as_tf_does(mode: str, clip: float, expected: float, clipped: bool | None) -> None:
    w, was_clipped = _one_step_weight(TrainConfig(1.0, clip_norm=clip, clip_mode=mode, optimizer="sgd", knobs=WIDE))
    assert w == pytest.approx(expected, rel=1e-5)
    if clipped is not None:
        assert was_clipped is clipped


def test_reused_graph_feeds_the_optimizer_knobs_as_a_fresh_build() -> None:
    """RMSProp with its momentum, decay and epsilon fed: a reused graph trains as a fresh one, and
    the optimizer and clip mode key the graph (another optimizer is built, not reused)."""
    from tuner.models import load_model
    from tuner.worker.train import Graphs

    model = load_model("iterated_mlp")
    knobs = {k: v.default for k, v in model.knobs.items()} | {"max_iter": 3}
    graphs = Graphs()
    first = TrainConfig(1e-3, optimizer="rmsprop", knobs=knobs)
    second = TrainConfig(3e-4, optimizer="rmsprop", momentum=0.5, rho=0.8, optimizer_epsilon=1e-6,
                         clip_norm=0.3, clip_mode="value", knobs=knobs)
    _trained(model, RunSpec(0, 1, "iterated_mlp", first, 5, 5), graphs)
    built_value = _trained(model, RunSpec(1, 2, "iterated_mlp", second, 5, 5), graphs)
    assert built_value[-1].info["graph"] == "built"  # clip_mode value: another graph
    reused = _trained(model, RunSpec(1, 3, "iterated_mlp", second, 40, 10), graphs)
    fresh = _trained(model, RunSpec(1, 3, "iterated_mlp", second, 40, 10))
    assert reused[-1].info["graph"] == "reused"
    assert [(r.step, r.loss, r.metrics.get("clip_fraction")) for r in reused] == [
        (r.step, r.loss, r.metrics.get("clip_fraction")) for r in fresh
    ]
    sgd = TrainConfig(1e-3, optimizer="sgd", knobs=knobs)
    assert _trained(model, RunSpec(2, 1, "iterated_mlp", sgd, 5, 5), graphs)[-1].info["graph"] == "built"
