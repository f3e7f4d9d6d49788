"""The private-API hooks (tuner.hooks): each works today, and each fails open, said at debug level,
when the private API it reaches for is gone."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import optuna
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

from planted import Planted

from tuner import hooks
from tuner.records import TrainConfig


def test_is_enqueued_tells_an_enqueued_trial_from_a_sampled_one() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"x": 0.5})
    enqueued, sampled = study.ask(), study.ask()
    assert (hooks.is_enqueued(enqueued), hooks.is_enqueued(sampled)) == (True, False)


def test_is_enqueued_counts_a_trial_as_enqueued_when_optunas_storage_is_unreadable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    study = optuna.create_study()
    trial = study.ask()
    monkeypatch.setattr(study, "_storage", object())  # an Optuna whose storage lacks get_trial_system_attrs
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert hooks.is_enqueued(trial) is True
    assert "counted as enqueued" in caplog.text


def test_save_trial_note_writes_the_note_optuna_dashboard_reads_back() -> None:
    from optuna_dashboard import get_note

    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert hooks.save_trial_note(study, 1, "**first**", version=1)
    assert hooks.save_trial_note(study, 1, "second, *longer* than the first", version=2)
    trial = optuna.Trial(study, study.trials[1]._trial_id)
    assert get_note(trial) == "second, *longer* than the first"
    assert get_note(optuna.Trial(study, study.trials[0]._trial_id)) == ""
    assert not hooks.save_trial_note(study, 1, "x" * 2046, version=3)  # over one chunk: not saved, not cut
    assert get_note(trial) == "second, *longer* than the first"


def test_save_trial_note_does_nothing_without_optuna_dashboards_note_format(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    monkeypatch.setitem(sys.modules, "optuna_dashboard._note", None)  # not installed, or the module moved
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert hooks.save_trial_note(study, 0, "note", version=1) is False
    assert "no optuna-dashboard note for trial 0" in caplog.text
    assert not any(k.startswith("dashboard:") for k in study._storage.get_study_system_attrs(study._study_id))


@pytest.mark.ray
def test_stop_ray_monitor_does_nothing_when_rays_node_internals_are_gone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import ray._private.worker

    monkeypatch.delattr(ray._private.worker, "_global_node")
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        hooks.stop_ray_monitor()  # no cluster is touched, nothing raised
    assert "could not stop the autoscaler monitor" in caplog.text


@pytest.mark.tf
def test_stoppable_graph_stops_a_build_and_is_a_plain_graph_without_create_op_internal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tensorflow as tf

    graph = hooks.stoppable_graph(lambda: True)
    with graph.as_default(), pytest.raises(hooks.BuildStopped):
        for _ in range(hooks.CHECK_EVERY):
            tf.constant(1.0)
    monkeypatch.delattr(tf.Graph, hooks.CREATE_OP)
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        plain = hooks.stoppable_graph(lambda: True)
    assert type(plain) is tf.Graph
    assert "will not stop early" in caplog.text
    hooks.stop_checks(plain)  # nothing to stop on a plain graph


@pytest.mark.tf
def test_graphs_build_every_run_afresh_when_op_attrs_cannot_be_set(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tuner.worker.graph import Graphs

    model = Planted()
    config = TrainConfig(1e-2, knobs={k: v.default for k, v in model.knobs.items()})
    assert hooks.can_set_attrs()
    monkeypatch.setattr(hooks, "SET_ATTR", "_set_attr_renamed")  # as if a TensorFlow release renamed it
    graphs = Graphs(size=2)
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert [graphs.get(model, config, seed)[1] for seed in (0, 1)] == [False, False]
    assert "cannot be reseeded" in caplog.text


def test_loopback_node_keeps_the_loopback_address_only_inside_its_block() -> None:
    """Ray turns 127.0.0.1 into the machine's external address; inside the block it stays 127.0.0.1
    (what makes an embedded cluster listen on the loopback: tests/test_ports.py checks the sockets)."""
    import ray._private.services as services

    resolve = services.resolve_ip_for_localhost
    with hooks.loopback_node():
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
        assert services.resolve_ip_for_localhost("10.1.2.3") == "10.1.2.3"
    assert services.resolve_ip_for_localhost is resolve


def test_loopback_node_does_nothing_but_say_so_when_ray_lacks_the_function(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import ray._private.services as services

    monkeypatch.delattr(services, "resolve_ip_for_localhost")  # as if a Ray release renamed it
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"), hooks.loopback_node():
        assert not hasattr(services, "resolve_ip_for_localhost")
    assert "listens on all interfaces" in caplog.text


def test_tell_pruned_without_value_leaves_a_stopped_trial_without_its_training_loss() -> None:
    import optuna

    from tuner.hooks import tell_pruned_without_value

    study = optuna.create_study()
    told = study.ask()
    told.report(0.7, 100)
    assert tell_pruned_without_value(study, told.number)
    kept = study.ask()
    kept.report(0.7, 100)
    study.tell(kept, state=optuna.trial.TrialState.PRUNED)  # Optuna's own: the last training loss as value
    frozen = study.get_trials(deepcopy=False)
    assert [t.state for t in frozen] == [optuna.trial.TrialState.PRUNED] * 2
    assert frozen[0].value is None and frozen[1].value == 0.7  # the hook's difference
    assert frozen[0].intermediate_values == {100: 0.7}  # what TPE ranks a pruned trial by
    assert not tell_pruned_without_value(object(), 0)  # fails open: the caller tells it through study.tell
