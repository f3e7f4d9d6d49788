"""Models with several named losses (a GAN): each loss's optimizer, update order and divergence."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import FINISHED, NO_VERIFY, ROOT, run_tuner
from tuner.models import Dataset, Knob, Loss, ModelGraph, load_model
from tuner.records import DivergedOn, RunSpec, RunStatus, TrainConfig
from tuner.worker.checkmodel import Probe, run_check

GAN = f"{ROOT / 'examples' / 'gan.py'}:GAN"


class TwoScalars:
    """``first = (a - 3)^2`` trains ``a`` at twice the rate; ``second`` pulls ``b`` towards ``a``."""

    knobs: Mapping[str, Knob] = {
        "update": Knob("categorical", "simultaneous", choices=("simultaneous", "alternating")),
        "second": Knob("categorical", "square", choices=("square", "abs_by_sqrt")),
        "b_init": Knob("float", 2.0, 0.0, 5.0),
        "second_trains": Knob("categorical", "second", choices=("second", "nothing")),
    }

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        zeros = np.zeros((8, 1), np.float32)
        return Dataset(train=(zeros,), val=(zeros,), batch_size=4)

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        import tensorflow as tf

        tf1 = tf.compat.v1
        x = tf1.placeholder(tf.float32, [None, 1], name="x")
        with tf1.variable_scope("first"):
            a = tf1.get_variable("a", [], initializer=tf1.constant_initializer(1.0))
        with tf1.variable_scope("second"):
            b = tf1.get_variable("b", [], initializer=tf1.constant_initializer(float(knobs["b_init"])))
        first = tf.square(a - 3.0 - tf.reduce_mean(x))
        gap = tf.square(b - a)
        second = gap if knobs["second"] == "square" else tf.sqrt(gap)  # d sqrt = inf at 0
        return ModelGraph(inputs=(x,), update=str(knobs["update"]), losses={
            "first": Loss(first, trains=lambda v: v.name.startswith("first/"), lr_factor=2.0),
            "second": Loss(second, trains=str(knobs["second_trains"]), optimizer="sgd"),
        })


def test_model_graph_takes_one_loss_or_several_named_ones() -> None:
    with pytest.raises(ValueError, match="a loss, or several named losses"):
        ModelGraph(inputs=(), loss=1.0, losses={"d": Loss(1.0)})
    with pytest.raises(ValueError, match="a loss, or several named losses"):
        ModelGraph(inputs=())
    with pytest.raises(ValueError, match=r"update 'together'.*alternating"):
        ModelGraph(inputs=(), losses={"d": Loss(1.0)}, update="together")
    with pytest.raises(ValueError, match="loss name 'gradients'"):
        ModelGraph(inputs=(), losses={"gradients": Loss(1.0)})
    with pytest.raises(ValueError, match="lr_factor 0"):
        Loss(1.0, lr_factor=0)
    assert list(ModelGraph(inputs=(), loss=1.0).all_losses()) == ["loss"]


@pytest.mark.tf
@pytest.mark.parametrize(("update", "b_after"), [("simultaneous", 1.8), ("alternating", 1.84)])
def test_each_loss_trains_its_weights_with_its_optimizer_in_the_update_order(update: str, b_after: float) -> None:
    """Adam at 0.1 x 2 moves ``a`` from 1 to 1.2; SGD at 0.1 moves ``b`` from 2 by 0.2 (b - a): with
    the old ``a`` (simultaneous: 1.8) or with the updated one (alternating: 1.84)."""
    import tensorflow as tf

    from tuner.worker.train import build

    model = TwoScalars()
    config = TrainConfig(0.1, knobs={**_defaults(model), "update": update})
    built = build(model, config, seed=0)
    assert built.losses == ("first", "second")
    assert len(built.runs) == (1 if update == "simultaneous" else 2)
    with tf.compat.v1.Session(graph=built.graph) as sess:
        built.start(sess, config)
        fetched = [sess.run(run.fetches, built.feed(model.data(config.knobs).batch(1, 0))) for run in built.runs]
        variables = {v.op.name: v for v in built.state}
        a, b, step = sess.run([variables["first/a"], variables["second/b"], variables["global_step"]])
    assert a == pytest.approx(1.2, rel=1e-5) and b == pytest.approx(b_after, rel=1e-5) and step == 1
    first_ok, first_loss, first_gnorm = fetched[0][:3]
    assert first_ok and first_loss == pytest.approx(4.0) and first_gnorm == pytest.approx(4.0)


@pytest.mark.tf
def test_a_loss_that_trains_no_variable_is_refused_at_build_and_by_check_model() -> None:
    from tuner.worker.train import build

    model = TwoScalars()
    knobs = {**_defaults(model), "second_trains": "nothing"}
    with pytest.raises(ValueError, match=r'loss "second" trains no variable: its trains= \(scope \'nothing\'\)'):
        build(model, TrainConfig(0.1, knobs=knobs), seed=0)
    probe = Probe(model, "TwoScalars")
    probe.defaults = knobs
    check = probe.gradient_check()
    assert not check.ok and 'loss "second" trains no weight' in check.detail and "first/a" in check.detail


@pytest.mark.tf
def test_a_non_finite_gradient_names_its_loss() -> None:
    """sqrt(|b - a|^2) at b == a: the loss is 0, its gradient NaN."""
    from tuner.worker.train import train_run

    model = TwoScalars()
    knobs = {**_defaults(model), "second": "abs_by_sqrt", "b_init": 1.0}
    final = list(train_run(model, model.data(knobs), RunSpec(0, 0, "TwoScalars", TrainConfig(0.1, knobs=knobs), 5)))
    assert (final[-1].status, final[-1].step, final[-1].diverged_on) == (RunStatus.DIVERGED, 1, DivergedOn.GRADIENT)
    assert final[-1].diverged_loss == "second" and final[-1].cause == 'gradient of loss "second"'
    assert final[0].cause == 'gradient of loss "second"'  # the record the driver gets at once
    assert final[-1].forensics is not None
    assert final[-1].forensics.note.startswith('gradient of loss "second" went non-finite first')
    assert final[-1].forensics.op.startswith("second/gradients/")  # tuner's backward pass of that loss


@pytest.mark.tf
def test_gan_divergence_names_the_loss_and_a_kept_graph_trains_like_a_fresh_one() -> None:
    """The tutorials' ``log(1 - D(G(z)))`` is log(0) once the discriminator saturates (a learning rate
    of 0.1 times 10); each seed's run on a kept graph equals a fresh build's."""
    from tuner.worker.train import Graphs, train_run

    model = load_model(GAN)
    knobs = {**_defaults(model), "loss_form": "log", "d_lr_factor": 10.0}
    config = TrainConfig(0.1, clip_norm=5.0, knobs=knobs)
    graphs = Graphs()

    def trained(seed: int, kept: Graphs | None) -> list:
        return list(train_run(model, model.data(knobs), RunSpec(0, seed, GAN, config, 60, 1), graphs=kept))

    first, reused, fresh = trained(3, graphs), trained(4, graphs), trained(4, None)
    assert reused[-1].info["graph"] == "reused" and first[-1].info["graph"] == "built"
    assert [(r.step, r.loss, r.grad_norm, r.metrics) for r in reused] == [
        (r.step, r.loss, r.grad_norm, r.metrics) for r in fresh]
    final = reused[-1]
    assert final.status is RunStatus.DIVERGED and final.cause == 'loss "d_loss"'
    assert final.forensics is not None and final.forensics.op == "d_loss/Log_1"  # log(1 - D(G(z)))
    assert final.forensics.note.startswith('loss "d_loss" went non-finite first')
    assert {"loss/d_loss", "loss/g_loss/grad_norm", "grad_norm/g_loss/generator/out/kernel"} <= set(reused[0].metrics)


@pytest.mark.tf
def test_check_model_flags_two_adversarial_losses_summed_into_one() -> None:
    """The naive port of a GAN (``loss = d_loss + g_loss``, one optimizer) fails the gradients check."""
    check = Probe(NaiveGAN(), "NaiveGAN").gradient_check()
    assert not check.ok and "pull the weights in opposite directions" in check.detail
    assert "ModelGraph(losses=" in check.detail


@pytest.mark.tf
@pytest.mark.slow
def test_check_model_passes_on_the_gan(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_check(argparse.Namespace(spec=GAN, steps=5)) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "2 scalar losses, updated alternatingly" in out
    assert "each loss trains its weights (d_loss 6, g_loss 6)" in out


class NaiveGAN:
    """examples/gan.py ported naively: its two losses summed into one, every weight trained on the sum."""

    knobs: Mapping[str, Knob] = {"batch_size": Knob("int", 64, 16, 256)}

    def data(self, knobs: Mapping[str, Any]) -> Dataset:
        return load_model(GAN).data({**_defaults(load_model(GAN)), **knobs})

    def build(self, knobs: Mapping[str, Any]) -> ModelGraph:
        gan = load_model(GAN)
        mg = gan.build(_defaults(gan))
        return ModelGraph(inputs=mg.inputs, loss=mg.losses["d_loss"].tensor + mg.losses["g_loss"].tensor)


def _defaults(model: Any) -> dict[str, Any]:
    return {name: knob.default for name, knob in model.knobs.items()}


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_launch_the_gan_its_divergence_names_the_loss_in_mlflow(tmp_path: Path) -> None:
    """Through Ray workers, the driver and MLflow: the run record, tags and divergence.json name d_loss."""
    import mlflow

    space = tmp_path / "diverging.yaml"
    space.write_text("params:\n  learning_rate: {low: 0.1, high: 0.3, log: true}\n  loss_form: log\n"
                     "  d_lr_factor: 10.0\n  clip_norm: 5.0\n")
    tracking = f"sqlite:///{tmp_path / 'm.db'}"
    result = run_tuner([
        "launch", "--model", GAN, "--space", str(space), "--trials", "1", "--steps", "100", "--seeds", "1",
        "--num-cpus", "2", "--study", "gan", "--storage", f"sqlite:///{tmp_path / 't.db'}",
        "--tracking-uri", tracking, "--out", str(tmp_path / "best.yaml"), "--no-live", *NO_VERIFY,
    ], cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    client = mlflow.tracking.MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("gan").experiment_id])
    trial = next(r for r in runs if r.data.tags.get("phase") == "search")
    tags = trial.data.tags
    assert (tags["status"], tags["diverged_on"], tags["diverged_loss"]) == ("diverged", "loss", "d_loss"), tags
    assert tags["first_nonfinite_op"] == "d_loss/Log_1"
    assert tags["forensics_note"].startswith('loss "d_loss" went non-finite first')
    assert 'step 2: loss "d_loss"' in result.stdout  # the console's line for the diverged trial names it too
