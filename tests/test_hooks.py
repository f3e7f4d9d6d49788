"""The private-API hooks (tuner.hooks): each works today, and each fails open, said at debug level,
when the private API it reaches for is gone."""

from __future__ import annotations

import logging
import math
import sys
import time
import types
import warnings
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
    monkeypatch.setattr(hooks.graph, "SET_ATTR", "_set_attr_renamed")  # as if a TensorFlow release renamed it
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


def _sqlite_study(tmp_path: Path, **kwargs: object) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", **kwargs)  # type: ignore[arg-type]


def test_insert_intermediate_values_batch_is_stored_and_seen_by_the_pruner(tmp_path: Path) -> None:
    """The batch lands in a SQLite study and in each trial's own copy, which ``should_prune`` hands the
    pruner: without the copy, every pruner saw no step and stopped nothing (until 2026-12-05)."""
    study = _sqlite_study(tmp_path, pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    high, low = study.ask(), study.ask()
    assert hooks.insert_intermediate_values([(high, {10: 0.5, 20: 5.0}), (low, {10: 0.5})])
    assert high.should_prune() and not low.should_prune()  # the pruner reads the latest step: 5.0 > 1.0
    assert hooks.insert_intermediate_values([(high, {20: 0.1, 30: 0.2})])  # step 20 keeps its first value
    assert study.trials[high.number].intermediate_values == {10: 0.5, 20: 5.0, 30: 0.2}
    study.tell(low, state=optuna.trial.TrialState.FAIL)  # finished meanwhile: gets nothing more
    assert hooks.insert_intermediate_values([(low, {40: 0.1})])
    assert study.trials[low.number].intermediate_values == {10: 0.5}


def test_insert_intermediate_values_leaves_it_to_report_where_it_cannot_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert not hooks.insert_intermediate_values([(optuna.create_study().ask(), {1: 1.0})])  # in memory: report's way
    study = _sqlite_study(tmp_path)
    trial = study.ask()
    number = trial.number
    monkeypatch.delattr(trial, "_cached_frozen_trial")  # an Optuna whose Trial keeps no copy of itself there
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert not hooks.insert_intermediate_values([(trial, {1: 1.0})])
    assert "keeps no copy of itself" in caplog.text
    assert study.trials[number].intermediate_values == {}  # nothing written: the caller reports them


def test_cached_trial_is_the_copy_the_pruner_reads(caplog: pytest.LogCaptureFixture) -> None:
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    trial = study.ask()
    assert not trial.should_prune()
    hooks.cached_trial(trial).intermediate_values[5] = 9.0
    assert trial.should_prune()
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert hooks.cached_trial(object()) is None
    assert "keeps no copy of itself" in caplog.text


@pytest.mark.parametrize("storage", ["sqlite", "memory"])
def test_delete_intermediate_values_from_takes_them_back_from_storage_and_pruner(tmp_path: Path, storage: str) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}" if storage == "sqlite" else None
    study = optuna.create_study(storage=url, pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    trial = study.ask()
    for step, value in {10: 0.5, 20: 0.4, 30: 5.0}.items():
        trial.report(value, step)
    assert trial.should_prune()  # the pruner reads the latest step: 5.0 > 1.0
    assert hooks.delete_intermediate_values_from(trial, 20)
    assert study.trials[trial.number].intermediate_values == {10: 0.5}
    assert not trial.should_prune()  # the trial's own copy lost them too


def test_delete_intermediate_values_from_keeps_them_on_a_storage_it_does_not_know(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from optuna.storages.journal import JournalFileBackend

    study = optuna.create_study(storage=optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "j.log"))))
    trial = study.ask()
    trial.report(0.5, 10)
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert not hooks.delete_intermediate_values_from(trial, 10)
    assert "could not be taken back" in caplog.text
    assert study.trials[trial.number].intermediate_values == {10: 0.5}


def test_trial_id_opens_the_trial_and_is_none_where_optuna_keeps_no_id(caplog: pytest.LogCaptureFixture) -> None:
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="a").ask()
    trial = optuna.create_study(storage=storage, study_name="b").ask()
    tid = hooks.trial_id(trial)
    assert tid is not None and tid != trial.number  # the storage's id, not the study's number
    assert optuna.Trial(trial.study, tid).number == trial.number
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert hooks.trial_id(object()) is None
    assert "has no storage id" in caplog.text


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # heartbeats are, in Optuna 5
def test_record_heartbeat_makes_a_trial_stale_once_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A trial with a heartbeat that stopped is failed by ``fail_stale_trials``; one that never had one is not."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage)
    beaten, silent = study.ask(), study.ask()
    assert hooks.record_heartbeat(study, hooks.trial_id(beaten))
    time.sleep(2.5)  # past the grace period (the storage's clock has whole seconds)
    optuna.storages.fail_stale_trials(study)
    assert [t.state.name for t in study.trials] == ["FAIL", "RUNNING"]
    assert not hooks.record_heartbeat(study, None)
    monkeypatch.setattr(study, "_storage", object())  # an Optuna whose storage records no heartbeat
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert not hooks.record_heartbeat(study, hooks.trial_id(silent))
    assert "stay RUNNING" in caplog.text


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize("failure", [None, "gone", "bad row"])
def test_record_heartbeats_beats_every_trial_in_one_call_and_one_by_one_without_optunas_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: str | None
) -> None:
    """Beaten twice, then silent past the grace period: all three stale; a trial never beaten is not.
    Without Optuna's models, or when one row breaks the batch, each trial is beaten alone."""
    import sqlite3

    import sqlalchemy.exc

    def broken(*_: object) -> None:
        if failure == "gone":
            raise AttributeError("module 'optuna.storages._rdb.models' has no attribute 'TrialHeartbeatModel'")
        raise sqlalchemy.exc.IntegrityError("INSERT INTO trial_heartbeats", {}, Exception("FOREIGN KEY"))

    batched = failure is None
    if not batched:
        monkeypatch.setattr(hooks.trials, "_beat_rows", broken)
    caplog.set_level(logging.DEBUG, logger="tuner.hooks")
    path = tmp_path / "o.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage)
    beaten, silent = [study.ask() for _ in range(3)], study.ask()
    ids = [hooks.trial_id(t) for t in beaten]
    hooks.record_heartbeats(study, ids)  # type: ignore[arg-type]
    with sqlite3.connect(path) as db:
        first = dict(db.execute("SELECT trial_id, heartbeat FROM trial_heartbeats").fetchall())
    time.sleep(1.1)
    hooks.record_heartbeats(study, ids)  # type: ignore[arg-type]
    with sqlite3.connect(path) as db:
        second = dict(db.execute("SELECT trial_id, heartbeat FROM trial_heartbeats").fetchall())
    assert sorted(first) == sorted(second) == sorted(ids)  # one row per trial, updated in place
    assert all(second[i] > first[i] for i in ids)
    time.sleep(2.5)
    optuna.storages.fail_stale_trials(study)
    assert [t.state.name for t in study.trials] == ["FAIL"] * 3 + ["RUNNING"]
    assert silent.number == 3
    assert ("one transaction per trial" in caplog.text) is not batched


def test_frozen_trial_reads_one_trial_by_number_and_all_of_them_without_optunas_internals(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="a").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    study = optuna.create_study(storage=storage, study_name="b")
    study.enqueue_trial({"x": 0.25})
    study.enqueue_trial({"x": 0.75})
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert hooks.frozen_trial(study, 1).params == {"x": 0.75}
    for kind in (optuna.storages.InMemoryStorage, optuna.storages.BaseStorage):  # an Optuna whose storage differs
        monkeypatch.delattr(kind, "get_trial_id_from_study_id_trial_number")
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert hooks.frozen_trial(study, 1).params == {"x": 0.75}
    assert "read with all the study's trials" in caplog.text


def test_fail_trial_fails_a_running_trial_with_its_reason_and_through_tell_without_internals(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    study = _sqlite_study(tmp_path)
    first, second = study.ask(), study.ask()
    assert hooks.fail_trial(study, hooks.frozen_trial(study, first.number), {"reason": "stopped"})
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        hooks.fail_trial(study, hooks.frozen_trial(study, first.number), {"reason": "again"})
    stand_in = types.SimpleNamespace(number=second.number)  # an Optuna whose FrozenTrial has no storage id
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert hooks.fail_trial(study, stand_in, {"reason": "stopped"})
    assert "told FAIL through study.tell" in caplog.text
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        hooks.fail_trial(study, stand_in)
    trials = study.trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"]
    assert trials[0].user_attrs == {"reason": "stopped"} and trials[1].user_attrs == {}  # no reason kept through tell


def _package(root: Path, name: str, init: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(init)
    (root / f"{name}_heavy.py").write_text("LOADED = True\n")


def test_import_without_skips_an_eager_import_a_package_tolerates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As ``import tensorflow`` goes on without Keras' optimizers (tests/test_worker.py: the real one)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _package(tmp_path, "tolerant", "try:\n    import tolerant_heavy\nexcept ImportError:\n    HEAVY = False\n"
                                   "else:\n    HEAVY = True\n")
    _package(tmp_path, "strict", "import strict_heavy\n")
    for name in ("tolerant", "tolerant_heavy", "strict", "strict_heavy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    hooks.import_without("tolerant", ["tolerant_heavy"], unless="no_such_module")
    assert sys.modules["tolerant"].HEAVY is False and "tolerant_heavy" not in sys.modules
    import tolerant_heavy  # not kept from loading after the import

    assert tolerant_heavy.LOADED
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        hooks.import_without("strict", ["strict_heavy"], unless="no_such_module")  # fails open: imported with it
    assert "strict" in sys.modules and "strict_heavy" in sys.modules
    assert "imported with nothing skipped" in caplog.text


def _objective_study(sampler: optuna.samplers.BaseSampler, finished: int, running: int = 0) -> optuna.Study:
    """A study of ``finished`` trials (every fifth PRUNED, as a diverged one) and ``running`` more."""
    study = optuna.create_study(sampler=sampler)
    for _ in range(finished):
        trial = study.ask()
        x, y = trial.suggest_float("x", 1e-5, 1.0, log=True), trial.suggest_float("y", -1.0, 1.0)
        if trial.number % 5 == 4:
            trial.report(1.0, step=trial.number % 7)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, (x - 0.01) ** 2 + y * y)
    for _ in range(running):
        trial = study.ask()
        trial.suggest_float("x", 1e-5, 1.0, log=True), trial.suggest_float("y", -1.0, 1.0)
    return study


def test_windowed_tpe_is_tpe_itself_up_to_its_window() -> None:
    args = {"seed": 3, "multivariate": True, "group": True, "constant_liar": True, "n_startup_trials": 4}
    plain = _objective_study(optuna.samplers.TPESampler(**args), 30, running=2)
    windowed = _objective_study(hooks.windowed_tpe(window=30, **args), 30, running=2)
    assert [t.params for t in windowed.trials] == [t.params for t in plain.trials]


def test_windowed_tpe_reads_the_best_the_recent_and_the_running_trials_past_its_window() -> None:
    from optuna.samplers._tpe.sampler import _split_trials

    sampler = hooks.windowed_tpe(window=20, best=5, seed=0, multivariate=True, constant_liar=True, n_startup_trials=4)
    study = _objective_study(sampler, 120, running=3)
    trials = study.get_trials(deepcopy=False)
    seen = sampler.visible(study, trials)  # type: ignore[attr-defined]
    done = [t for t in trials if t.state.is_finished()]
    best = {t.number for t in _split_trials(study, done, 5)[0]}
    running = {t.number for t in trials if t.state is optuna.trial.TrialState.RUNNING}
    assert {t.number for t in seen} == best | {t.number for t in done[-20:]} | running
    assert len(best - {t.number for t in done[-20:]}) > 0  # the good group reaches back before the window
    widths = []
    visible = sampler.visible  # type: ignore[attr-defined]
    sampler.visible = lambda s, t: widths.append(len(r := visible(s, t))) or r  # type: ignore[attr-defined]
    trial = study.ask()
    assert 1e-5 <= trial.suggest_float("x", 1e-5, 1.0, log=True) <= 1.0
    assert widths and max(widths) <= 5 + 20 + 4  # every read TPE made went through the window


def _reported_study(sampler: optuna.samplers.BaseSampler, n: int = 60, in_flight: int = 3) -> optuna.Study:
    """Trials that report a value every step before they end: every third stopped (PRUNED) after a
    number of steps that varies, every fifth of those diverged (its last value NaN), the rest COMPLETE."""
    study = optuna.create_study(sampler=sampler)
    running: list[optuna.trial.Trial] = []
    for _ in range(n):
        trial = study.ask()
        trial.suggest_float("x", 1e-5, 1.0, log=True), trial.suggest_float("y", -1.0, 1.0)
        running.append(trial)
        if len(running) <= in_flight:
            continue
        done = running.pop(0)
        loss = (done.params["x"] - 0.01) ** 2 + done.params["y"] ** 2
        steps = 3 + done.number % 11
        for step in range(steps):
            done.report(loss * (steps - step), step)
        if done.number % 3 == 1:
            if done.number % 5 == 1:
                done.report(float("nan"), steps)
            study.tell(done, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(done, loss)
    return study


def test_windowed_tpe_reads_a_pruned_trials_last_value_only_and_suggests_as_tpe() -> None:
    args = {"seed": 7, "multivariate": True, "constant_liar": True, "n_startup_trials": 5}
    plain = _reported_study(optuna.samplers.TPESampler(**args))
    sampler = hooks.windowed_tpe(window=1000, **args)
    windowed = _reported_study(sampler)
    assert [t.params for t in windowed.trials] == [t.params for t in plain.trials]  # suggestion for suggestion

    trials = windowed.get_trials(deepcopy=False)
    pruned = {t.number: t for t in trials if t.state is optuna.trial.TrialState.PRUNED}
    assert len(pruned) > 10 and all(len(t.intermediate_values) > 1 for t in pruned.values())
    seen = sampler.visible(windowed, trials)  # type: ignore[attr-defined]
    assert [t.number for t in seen] == [t.number for t in trials]
    for t in seen:
        if t.number in pruned:
            last = max(pruned[t.number].intermediate_values)
            assert list(t.intermediate_values) == [last]
            assert t.intermediate_values[last] == pruned[t.number].intermediate_values[last] or math.isnan(
                t.intermediate_values[last])
            assert t.params == pruned[t.number].params and t is not pruned[t.number]
        else:
            assert t is trials[t.number]  # complete and running trials as the study holds them
    again = sampler.visible(windowed, trials)  # type: ignore[attr-defined]
    assert all(a is b for a, b in zip(seen, again, strict=True))  # each made once
    assert len(pruned[max(pruned)].intermediate_values) > 1  # the study's own trials are untouched


def test_windowed_tpe_reads_every_trial_without_optunas_split(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(hooks.tpe, "_windowed_tpe", [])  # the class made below is not kept
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"), monkeypatch.context() as gone:
        gone.delattr("optuna.samplers._tpe.sampler._split_trials")  # (TPE itself needs it back below)
        sampler = hooks.windowed_tpe(window=10, seed=0)
    study = _objective_study(sampler, 30)
    assert len(sampler.visible(study, study.get_trials(deepcopy=False))) == 30  # type: ignore[attr-defined]
    assert "no window" in caplog.text


def test_windowed_tpe_pickles() -> None:
    """Ray Tune pickles its searcher (the benchmarks' Tune baseline uses tuner's sampler)."""
    import pickle

    sampler = hooks.windowed_tpe(window=10, best=5, seed=1, multivariate=True, n_startup_trials=4)
    study = _objective_study(sampler, 20)
    copy = pickle.loads(pickle.dumps(sampler))
    assert type(copy) is type(sampler) and (copy.window, copy.best) == (10, 5)  # type: ignore[attr-defined]
    trials = study.get_trials(deepcopy=False)
    assert copy.visible(study, trials) == sampler.visible(study, trials)  # type: ignore[attr-defined]
    study.sampler = copy
    assert 1e-5 <= study.ask().suggest_float("x", 1e-5, 1.0, log=True) <= 1.0


def _mixed_study(sampler: optuna.samplers.BaseSampler, n: int = 40, in_flight: int = 5) -> optuna.Study:
    """A study of a log float, an int and a categorical, whose trials end while ``in_flight`` others
    run (the constant liar's case); each told trial's value depends on all three."""
    study = optuna.create_study(sampler=sampler)
    running: list[optuna.trial.Trial] = []
    for _ in range(n):
        trial = study.ask()
        trial.suggest_float("x", 1e-5, 1.0, log=True), trial.suggest_int("k", 1, 32)
        trial.suggest_categorical("c", ["a", "b", "c"])
        running.append(trial)
        if len(running) > in_flight:
            done = running.pop(0)
            study.tell(done, done.params["x"] * done.params["k"] + (done.params["c"] == "b"))
    return study


def test_windowed_tpe_converts_a_trials_parameters_once_to_tpes_own_observations() -> None:
    args = {"seed": 5, "multivariate": True, "group": True, "constant_liar": True, "n_startup_trials": 6}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        plain = _mixed_study(optuna.samplers.TPESampler(**args), n=130)
        sampler = hooks.windowed_tpe(window=1000, **args)
        windowed = _mixed_study(sampler, n=130)
        assert [t.params for t in windowed.trials] == [t.params for t in plain.trials]  # suggestion for suggestion

        trials = windowed.get_trials(deepcopy=False)
        space = trials[-1].distributions
        tpe = optuna.samplers.TPESampler(**args)
        ours = sampler._get_internal_repr(trials, space, windowed)  # type: ignore[attr-defined]
        theirs = tpe._get_internal_repr(trials, space, windowed)
        assert ours.keys() == theirs.keys()
        assert all(ours[k].dtype == theirs[k].dtype and (ours[k] == theirs[k]).all() for k in ours)

        # (TPE reads its good group, a few trials, and the rest in two calls: the rows outlive both)
        converted: list[int] = []
        real = sampler._get_params  # type: ignore[attr-defined]
        sampler._get_params = lambda t, s: converted.append(t.number) or real(t, s)  # type: ignore[attr-defined]
        trial = windowed.ask()
        trial.suggest_float("x", 1e-5, 1.0, log=True)
    # every trial was converted by an earlier ask, but the one asked last (an ask leaves its own trial out)
    assert converted == [trials[-1].number]
