"""The driver's storage (tuner.hooks.driver_storage): Optuna's cache keeping the trials a driver runs
in memory. What it shows is what the database holds, for this driver's trials and another's; an ask
reads none of this driver's running trials back; TPE suggests exactly what it suggests through
Optuna's own cache; it fails open."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner import hooks
from tuner.driver.search import make_sampler

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _storage(url: str, resync: float = 3600.0, fresh: float = 0.0) -> optuna.storages.BaseStorage:
    """A driver's storage whose full reads (which would hide a stale copy) are an hour apart, and which
    asks the database at every read (its default waits ``hooks.FRESH_S`` between two: the last test)."""
    return hooks.driver_storage(optuna.storages.RDBStorage(url), resync, fresh)


def _view(study: optuna.Study) -> list[tuple[Any, ...]]:
    return [(t.number, t.state, t.params, t.distributions, t.intermediate_values, t.user_attrs, t.value)
            for t in study.get_trials()]


def _stored(url: str) -> list[tuple[Any, ...]]:
    """The study as a fresh reader (Optuna's own cache, nothing held) sees it in the database."""
    return _view(optuna.load_study(study_name="s", storage=url))


def test_driver_storage_shows_what_the_database_holds_to_two_drivers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    a = optuna.create_study(study_name="s", storage=_storage(url))
    b = optuna.load_study(study_name="s", storage=_storage(url))  # a second driver on the same study
    assert type(a._storage).__name__ == "DriverStorage"

    first, second = a.ask(), a.ask()
    for trial in (first, second):
        trial.suggest_float("lr", 1e-4, 1.0, log=True)
        trial.suggest_int("max_iter", 1, 32)
        hooks.flush_held(a)  # as the search does after a trial's suggestions
    first.set_user_attr("tuner.driver", "a")
    first.report(0.3, 25)
    assert hooks.insert_intermediate_values([(first, {50: 0.2}), (second, {25: 0.5, 50: 0.4, 75: 9.0})])
    assert hooks.delete_intermediate_values_from(second, 75)
    other = b.ask()  # the other driver's trial, running
    other.suggest_float("lr", 1e-4, 1.0, log=True)
    hooks.flush_held(b)
    other.report(0.7, 25)
    a.enqueue_trial({"lr": 0.01})  # WAITING: the other driver starts it
    popped = b.ask()
    assert popped.suggest_float("lr", 1e-4, 1.0, log=True) == 0.01  # b read the WAITING trial a made
    hooks.flush_held(b)
    assert _view(a) == _view(b) == _stored(url)  # 4 running: 2 of a, 2 of b (one enqueued by a)

    a.tell(first, 0.2)
    hooks.tell_pruned_without_value(a, second.number)
    b.tell(other, 0.1)
    third = a.ask()
    third.suggest_float("lr", 1e-4, 1.0, log=True)
    hooks.flush_held(a)
    third.set_user_attr("tuner.reason", "x")  # held: written with the trial's next write
    hooks.flush_held(a)
    assert _view(a) == _view(b) == _stored(url)
    states = [t.state for t in a.get_trials()]
    assert states.count(optuna.trial.TrialState.RUNNING) == 2 and states.count(optuna.trial.TrialState.COMPLETE) == 2


def test_a_trial_another_launch_failed_is_read_back_at_the_next_write_or_full_read(tmp_path: Path) -> None:
    """Another launch fails this driver's trial as stale: this driver's copy says RUNNING until it
    writes to the trial (which fails as the database says, and reads it back) or reads in full."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    a = optuna.create_study(study_name="s", storage=_storage(url))
    b = optuna.load_study(study_name="s", storage=_storage(url))
    mine, again = a.ask(), a.ask()
    assert len(a.get_trials()) == 2  # a reads its new trials back once; from now on its copies serve
    for trial in (mine, again):
        assert hooks.fail_trial(b, hooks.frozen_trial(b, trial.number), {"tuner.reason": "stale"})
    mine.set_user_attr("tuner.record", "{}")  # held, to be written with the trial's end
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        a.tell(mine, 0.5)
    assert a.get_trials()[mine.number].state == optuna.trial.TrialState.FAIL
    assert a.get_trials()[again.number].state == optuna.trial.TrialState.RUNNING  # not written since
    full = optuna.load_study(study_name="s", storage=_storage(url, resync=0.0))  # every read a full one
    full.ask()
    assert _view(full) == _stored(url)


def test_an_ask_reads_none_of_the_drivers_own_running_trials_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's cache reads every unfinished trial back at each read, several reads per ask with TPE
    and the constant liar: O(trials in flight) per ask. Here only the others' are read."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    backend = optuna.storages.RDBStorage(url)
    storage = hooks.driver_storage(backend, resync=3600.0, fresh=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(study_name="s", storage=storage, sampler=make_sampler("tpe", 0, 2))
        for _ in range(30):
            trial = study.ask()
            trial.suggest_float("lr", 1e-4, 1.0, log=True)
            trial.report(0.5, 25)
        other = optuna.load_study(study_name="s", storage=url).ask()  # another driver's, in flight
        other.suggest_float("lr", 1e-4, 1.0, log=True)
        read: list[int] = []
        real = backend._get_trials

        def counted(*args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
            trials = real(*args, **kwargs)
            read.extend(t.number for t in trials)
            return trials

        monkeypatch.setattr(backend, "_get_trials", counted)
        asked = []
        for _ in range(3):
            asked.append(study.ask())
            asked[-1].suggest_float("lr", 1e-4, 1.0, log=True)
    assert read.count(other.number) >= 3  # the other driver's trial in flight: read at each read
    assert not set(read) & set(range(30))  # through Optuna's cache: all 31 in flight, at each read
    assert all(read.count(trial.number) <= 1 for trial in asked)  # a new trial: read back once


def test_tpe_suggests_the_same_through_the_drivers_storage_as_through_optunas_cache(tmp_path: Path) -> None:
    def run(storage: object) -> list[dict[str, Any]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.create_study(storage=storage, sampler=make_sampler("tpe", 7, 2))  # type: ignore[arg-type]
            running = []
            for n in range(24):
                trial = study.ask()
                trial.suggest_float("lr", 1e-4, 1.0, log=True)
                trial.suggest_int("max_iter", 1, 32)
                trial.report(float(n % 5), 25)
                running.append(trial)
                if n % 3 == 2:  # trials end while others are in flight (the constant liar's case)
                    done = running.pop(0)
                    study.tell(done, done.params["lr"] * done.params["max_iter"])
        return [t.params for t in study.trials]

    ours = run(_storage(f"sqlite:///{tmp_path / 'a.db'}"))
    assert ours == run(optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'b.db'}"))
    assert len({p["lr"] for p in ours}) == len(ours)


def test_driver_storage_is_optunas_own_cache_without_the_rdb_internals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    backend = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    monkeypatch.delattr(optuna.storages.RDBStorage, "_get_trials")  # an Optuna that reads trials otherwise
    with caplog.at_level(logging.DEBUG, logger="tuner.hooks"):
        assert hooks.driver_storage(backend) is backend
    assert "Optuna's own cache serves" in caplog.text


def _count_commits(backend: optuna.storages.RDBStorage) -> list[int]:
    """A list that grows by one at each commit of ``backend`` that wrote (reads commit too)."""
    import sqlalchemy

    wrote, commits = [False], []

    def statement(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        wrote[0] = wrote[0] or sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))

    def commit(_conn: Any) -> None:
        if wrote[0]:
            commits.append(1)
        wrote[0] = False

    sqlalchemy.event.listen(backend.engine, "before_cursor_execute", statement)
    sqlalchemy.event.listen(backend.engine, "commit", commit)
    return commits


def test_a_trials_parameters_are_written_in_one_transaction_and_checked_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    backend = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="s", storage=hooks.driver_storage(backend, resync=3600.0))

    def suggest(trial: optuna.trial.Trial) -> None:
        for name in ("a", "b", "c", "d"):
            trial.suggest_float(name, 0.0, 1.0)

    suggest(study.ask())  # the study's first trial: each distribution is new, written through
    commits = _count_commits(backend)
    second = study.ask()
    asked = len(commits)
    suggest(second)
    assert len(commits) == asked  # held
    hooks.flush_held(study)
    assert len(commits) == asked + 1  # four parameters, one transaction
    assert optuna.load_study(study_name="s", storage=url).trials[1].params == second.params
    with pytest.raises(ValueError, match="Cannot set different distribution kind"):
        study.ask().suggest_int("a", 0, 3)  # as through Optuna's own storage: at the suggestion


def test_a_trials_life_as_the_search_writes_it_takes_three_commits_and_ends_as_stored(tmp_path: Path) -> None:
    """Asked, claimed (first heartbeat, owner), suggested (TPE's attribute too), its last values, its
    record and its end: 3 commits of its own (8 when each attribute, the first beat and the last values
    were a transaction of their own), and its copy here, finished in memory, is the database's to the
    microsecond. (A running trial's latest value also goes in a batch every few seconds, one commit
    for every trial running: counted here too.)"""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    backend = optuna.storages.RDBStorage(url, heartbeat_interval=60)
    study = optuna.create_study(study_name="s", storage=hooks.driver_storage(backend, resync=3600.0))
    study.ask().suggest_float("lr", 1e-4, 1.0, log=True)  # the study's distribution, written through
    commits = _count_commits(backend)
    for tell in (lambda t: study.tell(t, 0.25), lambda t: hooks.tell_pruned_without_value(study, t.number),
                 lambda t: study.tell(t, state=optuna.trial.TrialState.FAIL)):
        start = len(commits)
        trial = study.ask()
        assert hooks.record_heartbeat(study, hooks.trial_id(trial))
        trial.set_user_attr("tuner.driver", "d1")
        study._storage.set_trial_system_attr(trial._trial_id, "tpe:x", [1, 2])
        trial.suggest_float("lr", 1e-4, 1.0, log=True)
        hooks.flush_held(study)
        assert _stored(url)[trial.number][5] == {"tuner.driver": "d1"}  # written with the parameters
        assert backend._get_stale_trial_ids(study._study_id) == []  # and the first beat
        assert _beats(backend) == [trial._trial_id]
        assert hooks.insert_intermediate_values([(trial, {25: 0.5})])  # the batch of the latest values
        before_end = len(commits)
        assert hooks.hold_intermediate_values(trial, {25: 0.9, 50: 0.3, 75: float("inf")})  # at its end
        assert hooks.cached_trial(trial).intermediate_values == {25: 0.5, 50: 0.3, 75: float("inf")}
        trial.set_user_attr("tuner.record", {"state": "x"})
        held = optuna.load_study(study_name="s", storage=url).trials[trial.number]
        assert held.user_attrs == {"tuner.driver": "d1"} and held.intermediate_values == {25: 0.5}  # until its end
        assert len(commits) == before_end
        tell(trial)
        assert len(commits) - start == 4
        stored = optuna.load_study(study_name="s", storage=url).trials[trial.number]
        mine = study.get_trials()[trial.number]
        assert stored.intermediate_values == {25: 0.5, 50: 0.3, 75: float("inf")}
        assert mine.intermediate_values == stored.intermediate_values  # the first value of a step kept
        assert stored.user_attrs == {"tuner.driver": "d1", "tuner.record": {"state": "x"}}
        assert stored.system_attrs == mine.system_attrs == {"tpe:x": [1, 2]}
        assert (mine.state, mine.values, mine.datetime_complete) == (
            stored.state, stored.values, stored.datetime_complete)
    assert _view(study) == _stored(url)
    with pytest.raises(TypeError):  # not JSON: at once, as Optuna's storage raises
        study.ask().set_user_attr("bad", object())


def _beats(backend: optuna.storages.RDBStorage) -> list[int]:
    """The ids of the running trials that have a heartbeat row."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(backend.scoped_session) as session:
        return sorted(tid for (tid,) in session.query(models.TrialHeartbeatModel.trial_id)
                      .join(models.TrialModel, models.TrialModel.trial_id == models.TrialHeartbeatModel.trial_id)
                      .filter(models.TrialModel.state == optuna.trial.TrialState.RUNNING))


def test_a_first_beat_the_heartbeat_thread_wrote_first_costs_nothing_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat thread beats a trial between its claim and its first write: the held first beat
    is not written twice, and the parameters and tag held with it are written all the same, whether
    the flush sees the thread's row or the row comes between its look and its commit."""
    from optuna.storages._rdb import models

    url = f"sqlite:///{tmp_path / 'o.db'}"
    backend = optuna.storages.RDBStorage(url, heartbeat_interval=60)
    study = optuna.create_study(study_name="s", storage=hooks.driver_storage(backend, resync=3600.0))
    study.ask().suggest_float("x", 0.0, 1.0)
    storage: Any = study._storage
    real = type(storage)._write

    def late(self: Any, session: Any, trial: Any, params: Any, attrs: Any, beat: bool, values: Any) -> None:
        if beat:  # it looked (no row yet), then the thread's row was committed: its add clashes
            thread = threading.Thread(target=hooks.record_heartbeats, args=(study, [trial.trial_id]))
            thread.start()
            thread.join()
            session.add(models.TrialHeartbeatModel(trial_id=trial.trial_id))
        real(self, session, trial, params, attrs, False, values)

    for race in (False, True):
        trial = study.ask()
        assert hooks.record_heartbeat(study, trial._trial_id)  # held
        trial.set_user_attr("tuner.driver", "d1")
        trial.suggest_float("x", 0.0, 1.0)
        if race:
            monkeypatch.setattr(type(storage), "_write", late)
        else:
            hooks.record_heartbeats(study, [trial._trial_id])  # the thread, before the flush looks
        hooks.flush_held(study)
        stored = optuna.load_study(study_name="s", storage=url).trials[trial.number]
        assert stored.params == trial.params and stored.user_attrs == {"tuner.driver": "d1"}
        assert trial._trial_id in _beats(backend)
        study.tell(trial, 0.5)


def test_parameters_held_for_a_trial_another_launch_failed_do_not_hold_back_the_others(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    a = optuna.create_study(study_name="s", storage=_storage(url))
    b = optuna.load_study(study_name="s", storage=_storage(url))
    a.ask().suggest_float("x", 0.0, 1.0)
    failed, kept = a.ask(), a.ask()
    assert len(a.get_trials()) == 3  # read back once
    failed.suggest_float("x", 0.0, 1.0)
    kept.suggest_float("x", 0.0, 1.0)
    assert hooks.fail_trial(b, hooks.frozen_trial(b, failed.number))
    hooks.flush_held(a)
    stored = optuna.load_study(study_name="s", storage=url).trials
    assert stored[kept.number].params == kept.params and stored[failed.number].params == {}
    assert a.get_trials()[failed.number].state == optuna.trial.TrialState.FAIL


def test_reads_within_fresh_seconds_serve_the_copies_and_another_drivers_trials_come_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pruner's decisions and TPE's reads come hundreds a second on a large cluster: within
    ``fresh`` seconds of a read they ask the database nothing; after it, another driver's new trial
    and its state are there, and this driver's own changes show at once throughout."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    backend = optuna.storages.RDBStorage(url)
    a = optuna.create_study(study_name="s", storage=hooks.driver_storage(backend, resync=3600.0, fresh=0.5))
    b = optuna.load_study(study_name="s", storage=_storage(url))
    queries: list[int] = []
    real = backend._get_trials
    monkeypatch.setattr(backend, "_get_trials", lambda *args, **kwargs: queries.append(1) or real(*args, **kwargs))
    first = a.ask()
    a.get_trials()
    asked = len(queries)
    other = b.ask()  # another driver's trial, made just after a's last read
    for _ in range(50):  # a pruner's decisions, say
        a.get_trials(deepcopy=False)
    a.tell(first, 0.5)
    assert a.get_trials()[first.number].state == optuna.trial.TrialState.COMPLETE  # its own: at once
    if len(queries) == asked:  # (the 50 reads took under fresh seconds, as on any machine but a stalled one)
        assert [t.number for t in a.get_trials()] == [first.number]  # the other's not yet
    time.sleep(0.6)
    assert [t.number for t in a.get_trials()] == [first.number, other.number]
    b.tell(other, 0.1)
    time.sleep(0.6)
    assert a.get_trials()[other.number].state == optuna.trial.TrialState.COMPLETE
    assert len(queries) <= asked + 3  # one query per fresh interval, not one per read
