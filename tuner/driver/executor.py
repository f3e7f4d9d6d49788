"""Runs seed runs on Ray: one long-lived actor per slot, records streamed back to the driver.

The driver calls :meth:`RayExecutor.submit` with a :class:`RunSpec`, :meth:`poll` for the records
streamed so far and :meth:`cancel` for a trial's remaining runs. Each run is one call of the
actor's streaming generator (``TrialWorker.run``). A worker that dies (killed process, lost node)
has its run retried on another actor up to ``max_retries`` times, then the run is FAILED.

:func:`listening` lets a benchmark follow every executor's events (created, a worker ready, a run
dispatched, each record returned) without reaching into the class.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tuner import environ

environ.prepare_process()  # before Ray is imported: it reads RAY_AUTH_MODE at import

import ray  # noqa: E402
from ray.exceptions import GetTimeoutError, RayActorError, TaskCancelledError, WorkerCrashedError  # noqa: E402

from tuner import atomic  # noqa: E402
from tuner.driver import embedded  # noqa: E402
from tuner.driver.watchdog import Watchdog  # noqa: E402
from tuner.errors import ClusterError  # noqa: E402
from tuner.hooks import ray_processes_in_own_group as _own_group  # noqa: E402  (a private-API hook)
from tuner.hooks import stop_ray_monitor as _stop_monitor  # noqa: E402  (a private-API hook)
from tuner.records import RunRecord, RunSpec, RunStatus  # noqa: E402
from tuner.worker.actor import GRAPHS_KEPT, TrialWorker  # noqa: E402

if TYPE_CHECKING:
    from ray import ObjectRefGenerator as Run  # one run's stream of records, from its worker's ``run``
    from ray.actor import ActorHandle

    Worker = ActorHandle[TrialWorker]  # a worker actor

log = logging.getLogger(__name__)
_DEATH = (RayActorError, WorkerCrashedError)

Listener = Callable[[str, "RunSpec | RunRecord | None"], None]
_listeners: list[Listener] = []


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """While in the block, every :class:`RayExecutor` calls ``listener(event, item)``: ``"created"``
    (None; as its ``__init__`` starts), ``"worker_ready"`` (None; a worker has imported TensorFlow),
    ``"dispatched"`` (the run's :class:`RunSpec`, as it starts on a worker) and ``"record"`` (each
    :class:`RunRecord` that :meth:`RayExecutor.poll` returns). For benchmarks (bench/benchlib.py's
    ``slot_clock``); the search never listens."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def _tell(event: str, item: RunSpec | RunRecord | None = None) -> None:
    for listener in _listeners:
        listener(event, item)


@dataclass(frozen=True)
class ClusterConfig:
    """Where and how big the seed runs are.

    Attributes:
        address: an existing cluster (``host:port``, ``auto``, ``ray://...``); None starts one.
        cpus_per_trial: CPUs of one seed run (its TF thread count is the ceiling of this).
        gpus_per_trial: GPUs of one seed run; fractions share a GPU.
        max_concurrent: at most this many seed runs at once (None: what the cluster fits).
        max_retries: times a run is retried after its worker died.
        num_cpus: CPUs of an embedded cluster (None: the machine's).
        num_gpus: GPUs of an embedded cluster (None: the machine's).
        runtime_env: Ray runtime env of the job (to ship a user's model code).
        graph_reuse: workers keep the graphs of their last model configs and reseed them for a
            run of the same config (tuner.worker.train.Graphs); False builds a fresh graph for every run.
        run_timeout: seconds a run may send no record before its worker is killed and the run
            FAILED (None: a deadline from the model's own pace, tuner.driver.watchdog).
    """

    address: str | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_concurrent: int | None = None
    max_retries: int = 2
    num_cpus: int | None = None
    num_gpus: int | None = None
    runtime_env: dict[str, object] = field(default_factory=dict)
    graph_reuse: bool = True
    run_timeout: float | None = None


class RayExecutor:
    """Seed runs on a pool of :class:`TrialWorker` actors (see module docs)."""

    def __init__(self, config: ClusterConfig) -> None:
        _tell("created")
        self.config = config
        joined = ray.is_initialized()  # this process's own ray.init() came first (a notebook's)
        self._embedded = _connect(config)  # None: joined a cluster that someone else owns
        self.slots = _slots(config)
        options: dict[str, Any] = {"num_cpus": config.cpus_per_trial, "num_gpus": config.gpus_per_trial,
                                   "max_restarts": 0, "max_task_retries": 0}
        if joined and config.runtime_env:
            # that call gave the job its runtime env, without the model: it travels with each worker
            options["runtime_env"] = config.runtime_env
        # Ray types what an actor class's ``remote`` returns as a union with the class itself
        self._actor_class: Any = ray.remote(TrialWorker).options(**options)
        self._starting: dict[ray.ObjectRef[dict[str, object]], Worker] = {}  # ready() ref -> actor importing TF
        self._idle: list[Worker] = []
        self._graphs: dict[Worker, deque[tuple[str, str]]] = {}  # actor -> graph keys it keeps, oldest first
        self._queue: deque[RunSpec] = deque()
        self._running: dict[Run, tuple[RunSpec, Worker]] = {}  # generator -> (spec, actor)
        self._last: dict[Run, RunRecord] = {}  # generator -> its latest progress record
        self._out: list[RunRecord] = []  # records made here (cancelled, failed) for the next poll
        self.workers: dict[int, dict[str, object]] = {}  # worker pid -> where it runs
        self._watchdog = Watchdog(config.run_timeout)  # runs silent past their deadline are ended
        for _ in range(self.slots):
            self._start_actor()

    def free(self) -> int:
        """Slots that a newly submitted run would not have to wait for."""
        return self.slots - len(self._running) - len(self._queue)

    def submit(self, spec: RunSpec) -> None:
        """Queue a seed run; it starts as soon as a worker is free."""
        self._queue.append(spec)
        self._dispatch()

    def cancel(self, trial: int) -> None:
        """Cancel the queued and running seed runs of ``trial`` (each ends CANCELLED).

        A run that has already streamed its divergence is left to send its final record.
        """
        for spec in [s for s in self._queue if s.trial == trial]:
            self._queue.remove(spec)
            self._out.append(_ended(spec, RunStatus.CANCELLED, "cancelled before it started"))
        for gen, (spec, _) in self._running.items():
            last = self._last.get(gen)
            diverged = last is not None and last.status is RunStatus.DIVERGED  # finishing its forensics
            if spec.trial == trial and not diverged:
                ray.cancel(gen)

    def poll(self, timeout: float) -> list[RunRecord]:
        """Records streamed since the last poll, waiting up to ``timeout`` seconds for one."""
        waitables = list(self._running) + list(self._starting)
        if waitables and not self._out:
            ready, _ = ray.wait(waitables, num_returns=1, timeout=timeout)
            if ready:
                ready, _ = ray.wait(waitables, num_returns=len(waitables), timeout=0)
            for item in ready:
                self._take(item)
        elif not waitables and not self._out:
            time.sleep(min(timeout, 0.05))
        for gen, reason in self._watchdog.overdue():
            self._time_out(gen, reason)
        self._dispatch()
        out, self._out = self._out, []
        if _listeners:
            for record in out:
                _tell("record", record)
        return out

    def close(self) -> None:
        """Stop the workers, and the embedded cluster if this executor started it."""
        try:
            for actor in [*self._idle, *self._starting.values(), *(a for _, a in self._running.values())]:
                ray.kill(actor)
        finally:  # a lost cluster may refuse the kills: its processes and folder still go
            if self._embedded is not None:
                _stop_monitor()
                self._embedded.close()

    def _start_actor(self) -> None:
        actor = self._actor_class.remote(self.config.graph_reuse)
        self._starting[_ready(actor)] = actor

    def _dispatch(self) -> None:
        """Start queued runs on idle workers, a run preferably where its model config's graph is kept."""
        while self._idle and self._queue:
            actor, spec = self._match()
            self._queue.remove(spec)
            self._idle.remove(actor)
            kept = self._graphs.setdefault(actor, deque(maxlen=GRAPHS_KEPT))
            key = graph_key(spec)
            if key in kept:
                kept.remove(key)
            kept.append(key)
            gen = _run(actor, spec)
            self._running[gen] = (spec, actor)
            self._watchdog.started(gen)
            _tell("dispatched", spec)

    def _match(self) -> tuple[Worker, RunSpec]:
        """An idle worker and a queued run whose graph it keeps; else the last idle one and the oldest run."""
        if self.config.graph_reuse:
            for spec in self._queue:
                key = graph_key(spec)
                for actor in self._idle:
                    if key in self._graphs.get(actor, ()):
                        return actor, spec
        return self._idle[-1], self._queue[0]

    def _take(self, item: ray.ObjectRef[dict[str, object]] | Run) -> None:
        if item in self._starting:
            self._actor_started(item)
        elif item in self._running:
            self._next_record(item)

    def _actor_started(self, ref: ray.ObjectRef[dict[str, object]]) -> None:
        actor = self._starting.pop(ref)
        try:
            where = ray.get(ref)
        except _DEATH as exc:
            log.warning("a worker died while starting: %s", exc)
            return
        self.workers[cast(int, where["pid"])] = where
        self._idle.append(actor)
        _tell("worker_ready")

    def _next_record(self, gen: Run) -> None:
        spec = self._running[gen][0]
        try:
            record = ray.get(next(gen))
        except StopIteration:  # ended without a final record: treat like a crash
            self._worker_lost(gen, "the worker ended the run without a result")
            return
        except TaskCancelledError:
            last = self._release(gen)
            self._out.append(_ended(spec, RunStatus.CANCELLED, "cancelled", last))
            return
        except _DEATH as exc:
            self._worker_lost(gen, f"worker died: {type(exc).__name__}")
            return
        self._out.append(record)
        if record.final:
            self._release(gen)
        else:
            self._last[gen] = record
            self._watchdog.heard(gen, record.step, diverged=record.status is RunStatus.DIVERGED)

    def _release(self, gen: Run) -> RunRecord | None:
        """Free the run's worker; return the run's latest progress record."""
        self._watchdog.forget(gen)
        _, actor = self._running.pop(gen)
        self._idle.append(actor)
        return self._last.pop(gen, None)

    def _worker_lost(self, gen: Run, reason: str) -> None:
        """Replace the dead worker; retry its run, or fail it after ``max_retries`` retries."""
        spec, _, last = self._replace_worker(gen)
        if spec.attempt < self.config.max_retries:
            log.warning("trial %d seed %d: %s; retrying", spec.trial, spec.seed, reason)
            self._queue.appendleft(replace(spec, attempt=spec.attempt + 1))
        else:
            detail = f"{reason} ({spec.attempt + 1} attempts, max_retries={self.config.max_retries})"
            self._out.append(_ended(spec, RunStatus.FAILED, detail, last))


    def _time_out(self, gen: Run, reason: str) -> None:
        """End a run silent past its deadline (tuner.driver.watchdog): kill its worker, start another,
        FAIL the run with ``reason``. Not retried: the same config would hang again."""
        spec, _, last = self._replace_worker(gen)
        log.warning("trial %d seed %d: %s: its worker was killed", spec.trial, spec.seed, reason)
        self._out.append(_ended(spec, RunStatus.FAILED, reason, last))

    def _replace_worker(self, gen: Run) -> tuple[RunSpec, Worker, RunRecord | None]:
        """Kill the worker of run ``gen`` and start another; the run's spec, worker and latest record."""
        self._watchdog.forget(gen)
        spec, actor = self._running.pop(gen)
        last = self._last.pop(gen, None)
        ray.kill(actor)
        self._graphs.pop(actor, None)
        self._start_actor()
        return spec, actor, last


def _ready(actor: Worker) -> ray.ObjectRef[dict[str, object]]:
    """Ask a new worker where it runs: the ref is ready once it has imported TensorFlow. (Ray types an
    actor's methods as ``Never``: the calls are made here, so that mypy checks the code around them.)"""
    return actor.ready.remote()


def _run(actor: Worker, spec: RunSpec) -> Run:
    """Start ``spec`` on ``actor``; its records stream back, one ref each."""
    return actor.run.options(num_returns="streaming").remote(spec)


def graph_key(spec: RunSpec) -> tuple[str, str]:
    """What a worker's graph depends on: the model, its knob values, the optimizer and the clip mode."""
    return spec.model, spec.config.graph_key()


def _ended(spec: RunSpec, status: RunStatus, reason: str, last: RunRecord | None = None) -> RunRecord:
    """A final record made by the executor for a run whose worker could not send one."""
    step = last.step if last else 0
    loss = last.loss if last else None
    return RunRecord(spec.trial, spec.seed, step, status, loss=loss, final=True,
                     steps_survived=step, last_finite_loss=loss, error=reason, phase=spec.phase)


def _connect(config: ClusterConfig) -> embedded.Embedded | None:
    """Join the cluster at ``config.address``, or start an embedded one (``tuner.driver.embedded``,
    returned: its owner closes it)."""
    if ray.is_initialized():
        return None
    common: dict[str, Any] = {
        "include_dashboard": False, "log_to_driver": False,
        "logging_level": logging.WARNING, "runtime_env": config.runtime_env or None,
    }
    if config.address is None:
        _ensure_token()
        _own_group()  # a signal to the launch's process group reaches the driver alone (tuner.driver.signals)
        # "local": always a new cluster, never one that `ray start` left on this machine
        return embedded.start(config.num_cpus, config.num_gpus, **common)
    _check_reachable(config.address)
    try:
        ray.init(address=config.address, **common)
    except (ConnectionError, RuntimeError, GetTimeoutError) as exc:
        raise ClusterError(
            f"cannot join the Ray cluster at {config.address!r}: {exc}. Check the address "
            "(ray status on the head node prints it), and that RAY_AUTH_MODE=token is set "
            "with the cluster's token in ~/.ray/auth_token"
        ) from exc
    return None


def _ensure_token() -> None:
    """Give a new local cluster a token if none exists: token authentication stays on."""
    if environ.ray_token_given():
        return
    path = Path.home() / ".ray" / "auth_token"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, secrets.token_hex(32), mode=0o600)  # never a half-written token


def _check_reachable(address: str) -> None:
    """Fail fast with a clear message when a ``host:port`` address does not answer."""
    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return
    except (OSError, ValueError) as exc:
        raise ClusterError(
            f"no Ray cluster answers at {address!r} ({exc}). Start one with "
            "'RAY_AUTH_MODE=token ray start --head --port PORT', or leave out --address to "
            "run on an embedded local cluster"
        ) from exc


def _slots(config: ClusterConfig) -> int:
    """How many seed runs fit on the cluster's alive nodes at once."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    cpus, gpus = config.cpus_per_trial, config.gpus_per_trial
    if gpus > 0 and not any(r.get("GPU", 0) >= gpus for r in nodes):
        have = sum(r.get("GPU", 0) for r in nodes)
        raise ClusterError(
            f"--gpus-per-trial {gpus:g} asks for more GPUs than any node has (the cluster has "
            f"{have:g} GPU(s) in all); lower --gpus-per-trial or add GPU nodes"
        )
    fits = sum(min(_fit(r.get("CPU", 0), cpus), _fit(r.get("GPU", 0), gpus)) for r in nodes)
    if fits < 1:
        raise ClusterError(
            f"no node can host a seed run of {cpus:g} CPU(s) and {gpus:g} GPU(s); "
            "lower --cpus-per-trial/--gpus-per-trial"
        )
    return min(fits, config.max_concurrent) if config.max_concurrent else fits


def _fit(have: float, need: float) -> int:
    return 10**6 if need <= 0 else int(have // need + 1e-9)
