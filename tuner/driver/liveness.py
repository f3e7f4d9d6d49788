"""Several drivers on one study: heartbeats, and repair of only the trials whose driver is dead.

Optuna's answer to dead workers is the heartbeat (``RDBStorage(heartbeat_interval=...,
grace_period=...)`` and ``optuna.storages.fail_stale_trials``). With ask/tell Optuna records no
heartbeat itself, so the driver does: right after ``ask`` (before the trial is marked as this
driver's, ``tuner.driver``), then from a thread every ``grace / 6`` seconds (at least 1 s) for
every trial it is running. A trial whose last heartbeat is older than ``--grace-period`` (its
driver was killed, or lost the storage) is stale: any launch on the study marks it FAIL and queues
its config again (user attr ``rerun_of``), at its start and every heartbeat interval while it runs.
A live driver's trials are never touched, so several launches can share one study, Optuna's own
distributed pattern (one study, many processes, one RDB storage).

A RUNNING trial without ``tuner.driver`` (left by a tuner without heartbeats) is stale once it is
older than the grace period. Each driver also beats on the study (user attr
``tuner.driver.<id>``: the time of its last beat), so a launch closes only dead drivers' MLflow runs.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence

import optuna

from tuner import hooks
from tuner.driver.trialrecord import DRIVER, DUPLICATE_OF, REASON, RERUN_OF

log = logging.getLogger(__name__)

DRIVER_BEAT = "tuner.driver."  # study user attr prefix: driver id -> time of its last beat
_RUNNING = optuna.trial.TrialState.RUNNING
# ask/tell with heartbeats is what this module is for: Optuna warns about it on every ask
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def counted(trials: Sequence[optuna.trial.FrozenTrial]) -> int:
    """Finished trials that count toward ``--trials``: not an interrupted one (its rerun counts
    instead) nor a duplicate that was never trained."""
    interrupted = {t.user_attrs[RERUN_OF] for t in trials if RERUN_OF in t.user_attrs}
    return sum(t.state.is_finished() and t.number not in interrupted and DUPLICATE_OF not in t.user_attrs
               for t in trials)


def live_drivers(study: optuna.Study, grace: float = 30) -> set[str]:
    """Ids of the drivers whose last beat on ``study`` is within ``grace`` seconds (a driver that
    stopped recorded 0: gone at once)."""
    now = time.time()
    return {key.removeprefix(DRIVER_BEAT) for key, value in study.user_attrs.items()
            if key.startswith(DRIVER_BEAT) and isinstance(value, (int, float)) and now - value < grace}


_MAKE_TRIES = 3  # opening a new database whose tables another launch makes at the same instant


def _made_meanwhile(exc: BaseException) -> bool:
    """Whether opening a storage failed because another process made its tables at the same instant:
    Optuna creates them and stamps its schema version in ``alembic_version``, and the later of two
    launches on a new database fails on a table or a version row that now exists."""
    import sqlalchemy.exc

    text = str(exc)
    if isinstance(exc, sqlalchemy.exc.IntegrityError):  # the version row; PostgreSQL: a table's row type
        return "alembic_version" in text or "pg_type_typname_nsp_index" in text
    made = isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.ProgrammingError)
    return made and "already exists" in text


class Liveness:
    """One driver's heartbeats and its repair of the study (see the module docs)."""

    def __init__(self, grace: int = 30, say: Callable[[str], None] = print, max_retries: int = 2) -> None:
        self.grace = grace
        self.max_retries = max_retries  # a config is queued again at most this many times, across launches
        self.interval = max(1, grace // 6)
        self.driver = uuid.uuid4().hex[:12]
        self.say = say  # where "trial N was left running ..." goes (the terminal view once it is up)
        self.on_reap: list[Callable[[], object]] = []  # called after stale trials were failed, or a driver died
        self.study: optuna.Study | None = None
        self._mine: dict[int, int | None] = {}  # trial number -> trial id, of the trials this driver runs
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_reap = time.monotonic()
        self._reaped: list[int] = []
        self._warned = False
        self._live: set[str] = set()  # the drivers live at the last beat: one that drops out died

    def storage(self, url: str) -> optuna.storages.BaseStorage:
        """An Optuna RDB storage of ``url`` whose stale trials are queued again by this driver, and
        which keeps the trials this driver runs in memory (``tuner.hooks.driver_storage``: an ask
        does not read every trial in flight back from the database)."""
        engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}  # two drivers' writes wait
        for attempt in range(_MAKE_TRIES):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    backend = optuna.storages.RDBStorage(
                        url, engine_kwargs=engine, heartbeat_interval=self.interval, grace_period=self.grace,
                        heartbeat_stale_trial_callback=self._requeue,
                    )
                return hooks.driver_storage(backend)
            except Exception as exc:  # only the race of _made_meanwhile is retried
                if attempt == _MAKE_TRIES - 1 or not _made_meanwhile(exc):
                    raise
                log.debug("another launch made the storage's tables at the same time; opening it again: %s", exc)
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def attach(self, study: optuna.Study) -> None:
        """Start beating for this driver's trials of ``study``."""
        self.study = study
        self._beat_driver()
        self._thread = threading.Thread(target=self._beat_loop, name="tuner-heartbeat", daemon=True)
        self._thread.start()

    @property
    def _study(self) -> optuna.Study:
        """The study :meth:`attach` gave; AttributeError before it."""
        if self.study is None:
            raise AttributeError("Liveness.attach(study) was not called")
        return self.study

    def stop(self) -> None:
        """Stop the heartbeats (this driver's trials become stale after the grace period) and record
        that this driver is gone, so that the next launch or ``tuner report`` closes at once any MLflow
        run it could not close (an MLflow store that failed) instead of waiting out the grace period."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            try:
                self._study.set_user_attr(f"{DRIVER_BEAT}{self.driver}", 0)
            except Exception as exc:  # the storage is gone: the beat goes stale after the grace period
                log.debug("could not record that driver %s stopped: %s", self.driver, exc)

    def claim(self, trial: optuna.trial.Trial) -> None:
        """Mark a trial just asked as this driver's: its first heartbeat, then the owner tag (held by
        the driver's storage and written with the trial's parameters, ``tuner.hooks.flush_held``, as
        the search does after the suggestions; another driver spares a trial without the tag for the
        grace period)."""
        if self.study is not None:
            hooks.record_heartbeat(self.study, hooks.trial_id(trial))
        trial.set_user_attr(DRIVER, self.driver)
        with self._lock:
            self._mine[trial.number] = hooks.trial_id(trial)

    def release(self, number: int) -> None:
        """The trial was told: stop beating for it."""
        with self._lock:
            self._mine.pop(number, None)

    def mine(self) -> list[int]:
        """Numbers of the trials this driver is running."""
        with self._lock:
            return sorted(self._mine)

    def abandon(self, reason: str) -> list[int]:
        """Tell this driver's trials in flight FAIL (``reason``) and queue them again; their numbers.

        For a launch that stops (Ctrl-C, an error): the next launch reruns them at once instead of
        waiting out the grace period.
        """
        stopped = []
        for number in self.mine():
            trial = hooks.frozen_trial(self._study, number)
            try:
                if hooks.fail_trial(self._study, trial, {REASON: reason}):
                    if self._may_rerun(trial):
                        self._study.enqueue_trial(trial.params, user_attrs={RERUN_OF: number}, skip_if_exists=False)
                    stopped.append(number)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # told meanwhile (by another launch, as stale)
            self.release(number)
        return stopped

    def reap(self) -> list[int]:
        """Fail the stale trials of the study and queue their configs again; their numbers."""
        self._last_reap, self._reaped = time.monotonic(), []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self._study)  # calls _requeue for each trial it failed
        now = datetime.datetime.now()
        for trial in self._study.get_trials(deepcopy=False, states=(_RUNNING,)):
            started = trial.datetime_start or now
            if DRIVER in trial.user_attrs or (now - started).total_seconds() < self.grace:
                continue
            try:  # a trial of a tuner without heartbeats: its own grace period has passed
                if hooks.fail_trial(self._study, trial):
                    self._requeue(self._study, trial)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another launch failed it first
        if self._reaped:
            for hook in self.on_reap:
                hook()
        return self._reaped

    def maintain(self) -> None:
        """Reap stale trials if a heartbeat interval passed since the last time (from the search loop)."""
        if time.monotonic() - self._last_reap >= self.interval:
            self.reap()

    def open_trials(self, target: int) -> tuple[int, int]:
        """(trials the study still needs that nobody runs, trials other drivers are running)."""
        trials = self._study.get_trials(deepcopy=False)
        mine = set(self.mine())
        running = [t for t in trials if t.state == _RUNNING]
        others = sum(t.number not in mine for t in running)
        return target - counted(trials) - len(running), others

    def live_drivers(self) -> set[str]:
        """Ids of the drivers whose last beat on the study is within the grace period (this one too)."""
        return live_drivers(self._study, self.grace) | {self.driver}

    def _requeue(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        again = self._may_rerun(trial)
        if again:
            study.enqueue_trial(trial.params, user_attrs={RERUN_OF: trial.number}, skip_if_exists=False)
        self._reaped.append(trial.number)
        kept = "queued again" if again else f"not queued again: its config started {self.max_retries + 1} times"
        self.say(f"trial {trial.number} was left running by a stopped launch (no heartbeat for {self.grace} s): "
                 f"marked FAIL, {kept} (--max-retries)")

    def _may_rerun(self, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether the config of a trial that was stopped mid-run may be queued again: it was started
        at most ``max_retries`` times (the trial and the earlier trials it reran), so a config that
        hangs a launch, killed each time, is not queued for ever."""
        started, attrs = 1, trial.user_attrs
        while RERUN_OF in attrs and started <= self.max_retries:
            started += 1
            earlier = self.study.get_trials(deepcopy=False)[int(attrs[RERUN_OF])] if self.study is not None else None
            attrs = earlier.user_attrs if earlier is not None else {}
        return started <= self.max_retries

    def _beat_loop(self) -> None:
        self._live = self.live_drivers()
        while not self._stop.wait(self.interval):
            with self._lock:
                ids = list(self._mine.values())
            try:
                hooks.record_heartbeats(self._study, [i for i in ids if i is not None])
                self._beat_driver()
                self._notice_dead_drivers()
            except Exception as exc:  # the storage did not answer: try again at the next beat
                if not self._warned:
                    log.warning("could not record a heartbeat in the Optuna storage: %s", exc)
                    self._warned = True

    def _notice_dead_drivers(self) -> None:
        """Call the ``on_reap`` hooks when a driver that was live stopped beating: a driver killed
        during its verification leaves no trial to reap, but runs to close (tuner.driver.tracking)."""
        live = self.live_drivers()
        died, self._live = self._live - live, live
        for hook in self.on_reap if died else ():
            try:
                hook()
            except Exception as exc:  # MLflow did not answer: the next launch or `tuner report` closes them
                log.debug("could not close a dead driver's runs: %s", exc)

    def _beat_driver(self) -> None:
        self._study.set_user_attr(f"{DRIVER_BEAT}{self.driver}", time.time())
