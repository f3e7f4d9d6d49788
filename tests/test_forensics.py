"""Divergence forensics: the replay names the first non-finite op, its pass, layer and iteration."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

from planted import Planted

from tuner.records import DivergedOn, NonFiniteKind, RunSpec, RunStatus, TrainConfig

pytestmark = pytest.mark.tf


def diverge(knobs: dict, steps: int = 60, report_every: int = 10, learning_rate: float = 1e-2):
    """Train the planted model until it diverges; return the final record."""
    from tuner.worker.train import train_run

    model = Planted()
    knobs = {k: v.default for k, v in model.knobs.items()} | knobs
    spec = RunSpec(0, 0, "planted", TrainConfig(learning_rate, knobs=knobs), steps, report_every)
    final = list(train_run(model, model.data(knobs), spec))[-1]
    assert final.status is RunStatus.DIVERGED and final.forensics is not None
    return final


@pytest.mark.parametrize("bad_step", [1, 30, 37])
def test_forensics_names_forward_log_at_planted_step(bad_step: int) -> None:
    final = diverge({"fault": "log", "bad_step": bad_step})
    found = final.forensics
    assert (final.step, final.diverged_on) == (bad_step, DivergedOn.LOSS)
    assert (found.step, found.op, found.op_type) == (bad_step, "iter_1/hazard/Log", "Log")
    assert (found.kind, found.layer, found.iteration) == (NonFiniteKind.FORWARD, "hazard", 1)
    assert found.replayed_from == (bad_step - 1) // 10 * 10  # the last report step before it
    assert found.nonfinite_ops[0] == "iter_1/hazard/Log" and not found.note


def test_forensics_names_backward_op_when_forward_stays_finite() -> None:
    final = diverge({"fault": "sqrt", "bad_step": 23})
    found = final.forensics
    assert (final.step, final.diverged_on) == (23, DivergedOn.GRADIENT)
    assert (found.op, found.op_type) == ("gradients/iter_1/hazard/Sqrt_grad/SqrtGrad", "SqrtGrad")
    assert (found.kind, found.layer, found.iteration) == (NonFiniteKind.BACKWARD, "hazard", 1)
    assert found.forward_op == "iter_1/hazard/Sqrt"


def test_forensics_names_optimizer_update_that_overflows_a_weight() -> None:
    final = diverge({"fault": "weight"}, learning_rate=3e38)
    found = final.forensics
    assert (final.step, final.diverged_on) == (2, DivergedOn.WEIGHT)
    assert (found.kind, found.op_type) == (NonFiniteKind.UPDATE, "ResourceApplyAdam")
    assert found.op == "Adam/update_w/ResourceApplyAdam"


def test_forensics_names_the_weight_whose_gradient_overflowed_the_global_norm() -> None:
    """Inputs of 1e30 make w's gradient about 1.25e29: finite in float32, its square not. The first
    non-finite op is tuner's global_norm/L2Loss; the record names the weight and the value."""
    final = diverge({"fault": "gradient", "bad_step": 13})
    found = final.forensics
    assert (final.step, final.diverged_on) == (13, DivergedOn.GRADIENT)
    assert found.nonfinite_ops[0].startswith("global_norm/L2Loss")  # what the replay found first
    assert (found.op, found.op_type, found.kind) == ("w", "gradient norm", NonFiniteKind.BACKWARD)
    assert found.note == "gradient norm overflowed (the gradient of w reached 1.3e29)"


def test_a_replay_that_diverges_earlier_names_the_stateful_op_it_drew_anew() -> None:
    """Stateful noise (NaN about one step in 18) replayed from step 0 to step 300 goes NaN before it:
    "not analysed", with the op that drew the noise and how to make the replay exact."""
    import tensorflow as tf
    from noisy import Noisy

    from tuner.worker.forensics import replay
    from tuner.worker.graph import Snapshot, build, session_config

    model = Noisy()
    spec = RunSpec(0, 3, "noisy", TrainConfig(1e-4, knobs={"noise": "stateful"}), 300, 10)
    built = build(model, spec.config, spec.seed)
    with tf.compat.v1.Session(graph=built.graph, config=session_config(1, gpu=False)) as sess:
        built.start(sess, spec.config)
        names = [v.name for v in built.state]
        initial = Snapshot(0, tuple(sess.run(built.state)), lambda raw: dict(zip(names, raw, strict=True)))
        found = replay(model, model.data(spec.config.knobs), spec, initial, 300, built, sess)
    assert "diverged earlier" in found.note and "not analysed" in found.note
    assert "noise/random_uniform/RandomUniform" in found.note and "step_seed()" in found.note


def test_forensics_attributes_nonfinite_batch_to_data_without_replay() -> None:
    found = diverge({"fault": "loss", "bad_step": 12}).forensics
    assert (found.kind, found.op, found.samples) == (NonFiniteKind.DATA, "x", (0,))
    assert found.replayed_from is None


def test_forensics_keeps_report_points_and_last_steps_before_divergence() -> None:
    found = diverge({"fault": "log", "bad_step": 57}, steps=80, report_every=5).forensics
    assert [p["step"] for p in found.report_points] == list(range(5, 56, 5))
    assert {"loss", "grad_norm", "clip_fraction", "grad_norm/w"} <= set(found.report_points[-1])
    assert [s[0] for s in found.last_steps] == list(range(7, 57))  # the last 50 finite steps
    doc = found.to_dict()
    assert doc["kind"] == "forward" and doc["report_points"][0]["step"] == 5.0


def test_forensics_data_attribution_maps_counting_cnn_nan_labels_to_sample_indices() -> None:
    from tuner.models.counting_cnn import CountingCNN
    from tuner.models.data import Faults
    from tuner.worker.train import train_run

    model = CountingCNN(faults=Faults(nan_labels=0.02), train_size=256, val_size=32)
    knobs = {k: v.default for k, v in model.knobs.items()} | {"loss": "mse", "batch_size": 16}
    data = model.data(knobs)
    nan = set(np.flatnonzero(np.isnan(data.train[1])))
    first = next(s for s in range(1, 100) if nan & set(data.batch_indices(s, 3)))
    spec = RunSpec(0, 3, "counting_cnn", TrainConfig(1e-3, knobs=knobs), 100, 10)
    final = list(train_run(model, data, spec))[-1]
    assert final.step == first and final.forensics.kind is NonFiniteKind.DATA
    assert final.forensics.op == "counts"
    assert set(final.forensics.samples) == nan & set(data.batch_indices(first, 3))


def test_locate_reads_layer_iteration_and_forward_op_from_scopes() -> None:
    from tuner.worker.forensics import locate

    assert locate("gradients/iter_3/recompute_input/Log_grad/Reciprocal") == (
        "recompute_input", 3, "iter_3/recompute_input/Log")
    assert locate("iter_12/layer2/batchnorm/Rsqrt") == ("layer2", 12, None)
    assert locate("conv1/Conv2D") == ("conv1", None, None)
    assert locate("Mean") == (None, None, None)


@pytest.mark.slow
def test_forensics_finds_origin_of_real_iterated_mlp_divergence() -> None:
    """max_iter 4 at a high rate diverges within a few steps; the replay must reproduce it."""
    from tuner.models.iterated_mlp import IteratedMLP
    from tuner.worker.train import train_run

    model = IteratedMLP()
    knobs = {k: v.default for k, v in model.knobs.items()} | {"max_iter": 4}
    spec = RunSpec(0, 0, "iterated_mlp", TrainConfig(1e-2, knobs=knobs), 100, 25)
    final = list(train_run(model, model.data(knobs), spec))[-1]
    found = final.forensics
    assert final.status is RunStatus.DIVERGED and not found.note
    assert found.op is not None and found.op.startswith(f"iter_{found.iteration}/")
    assert found.kind is NonFiniteKind.FORWARD and found.layer == "recompute_input"


def _noisy(noise: str, seed: int) -> object:
    from noisy import Noisy

    from tuner.worker.train import train_run

    model = Noisy()
    spec = RunSpec(0, seed, "noisy", TrainConfig(1e-4, knobs={"noise": noise}), 500, 10)
    final = list(train_run(model, model.data(spec.config.knobs), spec))[-1]
    assert final.status is RunStatus.DIVERGED
    return final


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_replay_redraws_noise_drawn_with_the_step_seed(seed: int) -> None:
    """Noise keyed by tuner.models.step_seed() is drawn again exactly: the replay names the Log."""
    final = _noisy("stateless", seed)
    found = final.forensics
    assert (found.op, found.kind, found.step) == ("hazard/Log", NonFiniteKind.FORWARD, final.step), found.note
    assert final.step > 1  # a real replay from a snapshot, not the first step


def test_replay_of_stateful_noise_says_how_to_make_it_exact() -> None:
    """Stateful noise is drawn anew by the replay; when that misses the divergence, the note says
    which op drew it and what to use instead."""
    notes = [_noisy("stateful", seed).forensics.note for seed in (3, 4, 5)]
    missed = [n for n in notes if n]
    assert missed, "the replay redrew a divergence-causing draw on all 3 seeds (probability ~1/5000)"
    assert all("noise/random_uniform/RandomUniform" in n and "step_seed()" in n for n in missed)


def test_unlabelled_autoencoder_trains_and_its_nan_input_is_blamed_on_the_data() -> None:
    from autoencoder import Autoencoder, NanInput

    from tuner.worker.train import train_run

    clean = Autoencoder()
    knobs = {k: v.default for k, v in clean.knobs.items()}
    final = list(train_run(clean, clean.data(knobs), RunSpec(0, 1, "ae", TrainConfig(1e-2, knobs=knobs), 40, 20)))[-1]
    assert final.status is RunStatus.SURVIVED and final.val_loss < final.init_val_loss
    faulty = NanInput()
    data = faulty.data(knobs)
    first = next(s for s in range(1, 40) if 7 in data.batch_indices(s, 1))
    final = list(train_run(faulty, data, RunSpec(0, 1, "ae", TrainConfig(1e-2, knobs=knobs), 40, 20)))[-1]
    found = final.forensics
    assert (final.step, found.kind, found.op, found.samples) == (first, NonFiniteKind.DATA, "x", (7,))
    assert found.note == "the batch held 1 sample(s) with a non-finite input"


def test_forensics_blames_a_float64_input_that_overflows_float32_on_the_data() -> None:
    from dataclasses import replace

    from autoencoder import Autoencoder

    from tuner.worker.train import train_run

    model = Autoencoder()
    knobs = {k: v.default for k, v in model.knobs.items()}
    data = model.data(knobs)
    x = data.train[0].copy()
    x[9, 4] = 1.2e39  # finite in float64, Inf in the float32 placeholder
    first = next(s for s in range(1, 40) if 9 in data.batch_indices(s, 1))
    spec = RunSpec(0, 1, "ae", TrainConfig(1e-2, knobs=knobs), 40, 20)
    final = list(train_run(model, replace(data, train=(x,)), spec))[-1]
    found = final.forensics
    assert (final.step, found.kind, found.op, found.samples) == (first, NonFiniteKind.DATA, "x", (9,))
    assert "as fed: sample 9, feature 4: 1.2e+39 overflows float32" in found.note
