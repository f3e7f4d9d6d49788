"""Models written with ``tf.compat.v1.layers`` (Keras 2, selected by tuner): checked, trained, reused."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from tests.conftest import FINISHED, FIXTURES, NO_VERIFY, ROOT, run_tuner
from tuner.models import load_model
from tuner.records import RunSpec, RunStatus, TrainConfig
from tuner.worker.checkmodel import run_check

EXAMPLE = f"{ROOT / 'examples' / 'counting_blocks.py'}:CountingBlocks"
SPACE = ROOT / "examples" / "counting_blocks.yaml"
LAYERS_MLP = f"{FIXTURES / 'layers_mlp.py'}:LayersMLP"

pytestmark = pytest.mark.tf


def _trained(model: object, spec: RunSpec, graphs: object = None) -> list:
    from tuner.worker.train import train_run

    return list(train_run(model, model.data(spec.config.knobs), spec, graphs=graphs))  # type: ignore[attr-defined,arg-type]


def test_tf_layers_build_with_batch_norm_updates_and_train() -> None:
    """dense, conv2d, batch_normalization (its moving averages updated by tuner's train op), dropout."""
    import tensorflow as tf

    from tuner.worker.train import build

    model = load_model(EXAMPLE)
    config = TrainConfig(1e-3, knobs={k: v.default for k, v in model.knobs.items()})
    built = build(model, config, seed=0)
    updates = built.graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    assert len(updates) == 4  # moving mean and variance of both batch_normalization layers
    moving = [v for v in built.state if "moving_mean" in v.name]
    data = model.data(config.knobs)
    with tf.compat.v1.Session(graph=built.graph) as sess:
        built.start(sess, config)  # initialise the variables and set tuner's knobs
        before = sess.run(moving)
        sess.run(built.train_fetches, built.feed(data.batch(1, 0)))
        after = sess.run(moving)
    assert all(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    final = _trained(load_model(LAYERS_MLP), RunSpec(0, 1, LAYERS_MLP, TrainConfig(1e-2, knobs={
        k: v.default for k, v in load_model(LAYERS_MLP).knobs.items()}), 40, 20))[-1]
    assert final.status is RunStatus.SURVIVED and final.val_loss < final.init_val_loss


@pytest.mark.parametrize(("spec", "steps"), [(EXAMPLE, 6), (LAYERS_MLP, 30)])
def test_tf_layers_runs_are_a_function_of_the_seed_and_never_reuse_a_stale_init(spec: str, steps: int) -> None:
    """tf_keras seeds an unseeded initializer from Python's ``random`` and bakes the seed into the
    graph as a constant: tuner seeds Python's random from the run's seed while building, so two
    builds with one seed train the same, and a kept graph reseeded (its constants rewritten with
    the new seed's draws) trains exactly as a fresh build with that seed."""
    from tuner.worker.train import Graphs

    model = load_model(spec)
    knobs = {k: v.default for k, v in model.knobs.items()}
    config = TrainConfig(3e-3, clip_norm=1.0, knobs=knobs)
    graphs = Graphs()
    _trained(model, RunSpec(0, 11, spec, config, steps, 3), graphs)
    kept = _trained(model, RunSpec(1, 12345, spec, config, steps, 3), graphs)
    fresh = _trained(model, RunSpec(1, 12345, spec, config, steps, 3))
    assert kept[-1].info["graph"] == "reused"  # the Keras-seeded graph was reseeded
    assert [(r.step, r.status, r.loss, r.grad_norm) for r in kept] == [
        (r.step, r.status, r.loss, r.grad_norm) for r in fresh
    ]
    assert (kept[-1].init_val_loss, kept[-1].val_loss) == (fresh[-1].init_val_loss, fresh[-1].val_loss)
    other_seed = _trained(model, RunSpec(1, 7, spec, config, steps, 3), graphs)
    assert other_seed[-1].info["graph"] == "reused"
    assert other_seed[-1].init_val_loss != kept[-1].init_val_loss  # another seed, another init
    assert [r.loss for r in other_seed] == [r.loss for r in _trained(model, RunSpec(1, 7, spec, config, steps, 3))]


def test_check_model_builds_tf_layers_with_the_same_keras_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    """A knob that changes nothing fails, though each build draws new Keras 2 initializer seeds."""
    status = run_check(argparse.Namespace(spec=f"{FIXTURES / 'layers_mlp.py'}:UnusedKnob", steps=1))
    out = capsys.readouterr().out
    assert status == 2, out
    assert "FAIL  knob unused" in out and "PASS  knob hidden" in out and "PASS  loss" in out


@pytest.mark.slow
@pytest.mark.ray
def test_tf_layers_example_passes_check_model_and_a_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user runs them, with no TF_USE_LEGACY_KERAS in the environment: tuner selects Keras 2 itself."""
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    checked = run_tuner(["check-model", EXAMPLE, "--steps", "2"], cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]
    assert "PASS  knob clip_predictions" in checked.stdout and "PASS  training" in checked.stdout
    storage = f"sqlite:///{tmp_path / 't.db'}"
    result = run_tuner([
        "launch", "--model", EXAMPLE, "--space", str(SPACE), "--trials", "2", "--steps", "20", "--seeds", "2",
        "--num-cpus", "2", "--study", "blocks", "--storage", storage, "--tracking-uri",
        f"sqlite:///{tmp_path / 'm.db'}", "--out", str(tmp_path / "best.yaml"), *NO_VERIFY,
    ], cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    trials = optuna.load_study(study_name="blocks", storage=storage).trials
    assert len(trials) == 2 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}, trials
    config = yaml.safe_load((tmp_path / "best.yaml").read_text())["config"]
    assert {"learning_rate", "input_scaling", "initializer", "loss", "clip_predictions"} <= set(config)
