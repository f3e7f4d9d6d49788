"""Driver rate: the highest progress-record rate the driver sustains, and that nothing is lost.

A simulated executor (``SimExecutor``: no TensorFlow, no Ray) stands in for a large cluster: it
keeps ``--slots`` seed runs going and produces their progress records at ``--rate`` records/s in
all, each with the telemetry of a real record (loss, gradient norm and ``--metrics`` more values:
per-weight gradient norms, watched values, clip statistics), ``--steps`` / ``--report-every``
records per run and a final one: by default a launch's run length (600 steps, a record every 25),
so that N slots at N records/s end about N/24 runs a second, as a cluster of N GPUs would with runs
of 24 s. About 10 % of the trials diverge on their first seed; a trial's losses are scaled by a
quality drawn for it, so that the pruner stops some and racing runs others on more seeds.
Everything else is the real driver: ``tuner.driver.search.Search`` with a launch's defaults (TPE,
the ``first-seed`` pruner, racing to 8 seeds) on an Optuna SQLite storage with heartbeats
(``tuner.driver.liveness``), the MLflow tracker (``tuner.driver.tracking.Tracker``) and the terminal
view, on iterated_mlp's shipped space; after the window, the end-of-launch verification
(``tuner.driver.verify.verify_study``: 16 fresh seeds at twice the steps, the learning-rate margin).

A measurement produces records for ``--window`` seconds, then stops the search and closes the
tracker. The driver *sustains* the rate when
- it keeps up: the lag of a record (due -> handled by every callback) stays under ``--max-lag``
  seconds, its median over the window's second half is not above its first half's + 0.5 s, and it
  handles at least 90 % of the rate over the window's second half (a driver slow to ask trials
  leaves slots empty, whose records are never due: with short runs that, not the lag, is how it
  falls behind; the first half holds the fill of a large cluster, an ask per slot);
- MLflow keeps up: the metric points queued for the tracker's sender and not yet sent do not grow
  (the median of the window's last quarter is not above that of its second quarter by more than
  the points one second of records carries, ``rate x (2 + --metrics)``: points against points;
  points a run buffers until its next call do not count), and its last writes take under
  ``--max-drain`` seconds once the records stop. A run's points wait up to 10 s to be sent in one
  call, so the queue fills over the first 10 s: at low rates use a window of 30 s or more;
- nothing is lost: every record handled is in MLflow: its ``s<i>/loss`` (i the seed's position in
  the ``seeds`` param of its run: the trial's own, or the race run that trained it) as a metric
  point at its step, its ``grad_norm`` and telemetry values
  each as a metric point or in a row of the run's ``telemetry.json`` (where the tracker puts them
  while its queue is long), each exactly once
  (checked for ``grad_norm`` and one telemetry key, ``grad_norm/layer0/kernel``, on every run);
  and every trial is terminal in Optuna but those the window's end left in flight.

It also reports the trials ended per second, the driver's CPU in cores, and the median ask (ask,
suggestions and the parameters' write) once the cluster is (nearly) full, against the runs in flight.

The search for the highest rate doubles from ``--start`` until a rate is not sustained, then
bisects once between the last two. Backends: MLflow on SQLite (``sqlite``), and an ``mlflow server``
on 127.0.0.1 over HTTP with a PostgreSQL backend store (``http-postgres``: the database URL from
``--postgres`` or ``$TUNER_BENCH_POSTGRES``; it is never printed).

``--cluster`` instead starts a 4-node local Ray cluster (``ray start`` head + 3 nodes, ``--node-cpus``
each, token authentication on), runs a real launch with a launch's defaults on it with ``--address``
and prints where each seed run ran, the records per second the driver received, the driver
process's CPU, and the trials' states in Optuna.

    .venv/bin/python bench/driver_rate.py [--backend sqlite|http-postgres|both] [--repeats 3] [--window 30]
                                          [--slots 200] [--rate R] [--steps 600] [--report-every 25] [--metrics 30]
                                          [--pruner first-seed] [--race-seeds 8] [--no-verify]
    .venv/bin/python bench/driver_rate.py --cluster [--trials 8] [--cluster-steps 300] [--node-cpus 1]
    .venv/bin/python bench/driver_rate.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import BENCH, MODEL, ROOT, median, pre_create_stores, print_header, table, write_json

BIN = Path(sys.executable).parent
KEY = "grad_norm/layer0/kernel"  # the telemetry key checked on every run


def telemetry_keys(count: int) -> list[str]:
    """Names like a real record's telemetry (iterated_mlp at max_iter 12 has about 30)."""
    keys = ["loss_mean", "clipped", "clip_fraction", "loss_spikes"]
    keys += [f"grad_norm/layer{i}/{w}" for i in range(3) for w in ("kernel", "bias", "gamma", "beta")]
    keys += ["grad_norm/output/kernel", "grad_norm/output/bias"]
    keys += [f"iter_{i}/input_absmax" for i in range(1, 100)]
    return keys[:count]


class WindowOver(Exception):
    """The measurement window ended: the search loop stops here."""


@dataclass
class _Run:
    spec: Any
    step: int  # the last step reported
    diverge_at: int | None  # the report step at which this seed diverges, if it does
    cancelled: bool = False
    alarmed: bool = False


@dataclass
class SimExecutor:
    """An Executor (tuner.driver.outcome) whose seed runs are simulated: records at a fixed total rate.

    The records of run r are due every ``slots / rate`` seconds; ``poll`` returns every record due
    by now (as Ray would hand over what the workers streamed meanwhile). A record's lag is measured
    at the next ``poll``, when the search loop has handled it: now - the time it was due.
    """

    slots: int
    rate: float
    metrics: int = 30
    diverge: float = 0.1
    window: float = 15.0
    seed: int = 0
    rng: random.Random = field(init=False)
    runs: dict[tuple[int, int], _Run] = field(default_factory=dict)
    heap: list[tuple[float, int, tuple[int, int]]] = field(default_factory=list)
    # (trial, seed) -> (step, carried a loss?, carried telemetry?) of each record the driver handled
    handled: dict[tuple[int, int], list[tuple[int, bool, bool]]] = field(default_factory=dict)
    lags: list[tuple[float, float]] = field(default_factory=list)  # (seconds into the window, lag)
    batches: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the window, records handled)
    started: float | None = None
    cpu_started: float = 0.0
    writer: Any = None  # the MLflow client process (tuner.driver.mlflow_process), whose CPU is counted too
    writer_cpu_started: float = 0.0
    _seq: int = 0
    _oldest: float | None = None
    _batch: int = 0
    _trial_plan: dict[int, tuple[int, int | None, int]] = field(default_factory=dict)  # trial -> _plan()
    _quality: dict[int, float] = field(default_factory=dict)  # trial -> its losses' factor (1: the best)
    _keys: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._keys = telemetry_keys(self.metrics)

    @property
    def period(self) -> float:
        return self.slots / self.rate

    def free(self) -> int:
        return self.slots - len(self.runs)

    def submit(self, spec: Any) -> None:
        now = time.perf_counter() if self.started is not None else 0.0  # the first runs: due from the first poll
        from tuner.records import Phase

        fresh = spec.trial not in self._trial_plan
        first, diverge_at, _ = self._plan(spec)
        new = fresh and spec.phase is Phase.SEARCH  # a trial's first run: it may start part-way, and diverge
        run = _Run(spec, first if new else 0, diverge_at if new else None)
        self.runs[(spec.trial, spec.seed)] = run
        self._push(now + self.rng.uniform(0, self.period), (spec.trial, spec.seed))

    def _plan(self, spec: Any) -> tuple[int, int | None, int]:
        """Per trial: the step its first run starts from (the first trials start part-way, as on a
        cluster that was already busy), the step at which that run diverges (10 % of trials), and its
        quality: the factor of its losses, drawn once (1 + Exp(2): most trials near the best, some far
        behind, for the pruner and racing to act on; each seed's final value varies by up to 20 %)."""
        if spec.trial not in self._trial_plan:
            reports = spec.steps // spec.report_every
            first = self.rng.randrange(reports) * spec.report_every if spec.trial < self.slots // 2 else 0
            diverge_at = None
            if self.rng.random() < self.diverge and first // spec.report_every + 1 < reports:
                diverge_at = self.rng.randrange(first // spec.report_every + 1, reports) * spec.report_every + 3
            self._trial_plan[spec.trial] = (first, diverge_at, 0)
            self._quality[spec.trial] = 1.0 + self.rng.expovariate(2.0)  # most near the best, a tail far behind
        return self._trial_plan[spec.trial]

    def _push(self, due: float, key: tuple[int, int]) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (due, self._seq, key))

    def cancel(self, trial: int) -> None:
        now = time.perf_counter()
        for key, run in self.runs.items():
            if key[0] == trial and not (run.diverge_at is not None and run.alarmed):
                run.cancelled = True
                self._push(now, key)

    def poll(self, timeout: float) -> list[Any]:
        now = time.perf_counter()
        if self.started is None:  # the window starts once the search has filled the slots
            self.started, self.cpu_started = now, time.process_time()
            self.writer_cpu_started = self.writer.cpu_seconds() if self.writer else 0.0
            self.heap = [(due + now, seq, key) for due, seq, key in self.heap]
            heapq.heapify(self.heap)
        if self._oldest is not None:
            self.lags.append((now - (self.started or now), now - self._oldest))
            self.batches.append((now - (self.started or now), self._batch))
            self._oldest = None
        if self.started is not None and now - self.started > self.window:
            raise WindowOver
        if not self.heap or self.heap[0][0] > now:
            wait = min(timeout, self.heap[0][0] - now) if self.heap else timeout
            time.sleep(max(0.0, wait))
            now = time.perf_counter()
        out = []
        while self.heap and self.heap[0][0] <= now:
            due, _, key = heapq.heappop(self.heap)
            run = self.runs.get(key)
            if run is None:
                continue  # a stale entry of a run that ended
            record = self._next(run, due)
            if record is None:
                continue
            if self._oldest is None:
                self._oldest = due
            out.append(record)
            self._batch = len(out)
            self.handled.setdefault(key, []).append(
                (record.step, _finite(record.loss), bool(record.metrics) and not record.final))
        return out

    def _next(self, run: _Run, due: float) -> Any:
        """The run's next record, scheduling the one after it; None for a duplicate heap entry."""
        from tuner.records import DivergedOn, RunRecord, RunStatus

        spec, key = run.spec, (run.spec.trial, run.spec.seed)
        if run.cancelled:
            del self.runs[key]
            return RunRecord(spec.trial, spec.seed, run.step, RunStatus.CANCELLED, final=True,
                             steps_survived=run.step, phase=spec.phase)
        if run.alarmed:  # its forensics done: the final record of the divergence
            del self.runs[key]
            at = run.diverge_at or 0
            return RunRecord(spec.trial, spec.seed, at, RunStatus.DIVERGED, final=True, steps_survived=at - 1,
                             last_finite_loss=0.5, diverged_on=DivergedOn.GRADIENT, phase=spec.phase,
                             init_val_loss=3.0, info={"run_seconds": 1.0})
        nxt = run.step + spec.report_every
        if run.diverge_at is not None and nxt > run.diverge_at:
            run.alarmed = True
            self._push(due + self.period, key)
            return RunRecord(spec.trial, spec.seed, run.diverge_at, RunStatus.DIVERGED,
                             steps_survived=run.diverge_at - 1, diverged_on=DivergedOn.GRADIENT, loss=float("nan"),
                             phase=spec.phase)
        if nxt > spec.steps:
            del self.runs[key]
            value = self._quality[spec.trial] * (0.1 + 0.02 * self.rng.random())  # a seed's noise: 20 %
            return RunRecord(spec.trial, spec.seed, spec.steps, RunStatus.SURVIVED, final=True, loss=value,
                             grad_norm=1.0, steps_survived=spec.steps, val_loss=value, phase=spec.phase,
                             init_val_loss=3.0, info={"run_seconds": 1.0},
                             metrics={"grad_norm_max": 3.0, "clip_fraction": 0.0})
        run.step = nxt
        self._push(due + self.period, key)
        x = nxt / spec.steps
        values = {k: 1.0 + x + 0.001 * n for n, k in enumerate(self._keys)}
        loss = self._quality[spec.trial] * (3.0 - 2.0 * x)
        return RunRecord(spec.trial, spec.seed, nxt, RunStatus.RUNNING, loss=loss, grad_norm=1.0 + x,
                         steps_survived=nxt, metrics=values, phase=spec.phase)


FULL = 0.9  # the share of the asked rate a driver that keeps up handles (its slots kept full)


def _finite(value: float | None) -> bool:
    return value is not None and value == value and abs(value) != float("inf")


# ---------------------------------------------------------------- one measurement

def measure(rate: float, uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run the real driver on a SimExecutor at ``rate`` for ``args.window`` s, then (``args.verify``)
    the end-of-launch verification of its best trials; the figures."""
    import optuna

    from tuner.driver import studyrecord
    from tuner.driver.launch import PROCESS_SLOTS
    from tuner.driver.liveness import Liveness
    from tuner.driver.mlflow_process import ClientProcess
    from tuner.driver.progress import ProgressView
    from tuner.driver.pruning import make_pruner, prune_end, prune_start
    from tuner.driver.search import Budget, make_sampler
    from tuner.driver.tracking import Tracker
    from tuner.models import load_model
    from tuner.spaces import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    model = load_model(MODEL)
    space = load_space(ROOT / "search_spaces" / f"{MODEL}.yaml", MODEL, model.knobs)
    name = f"rate-{int(rate)}-{os.getpid()}-{time.time_ns() % 10**9}"
    with tempfile.TemporaryDirectory(prefix="tuner-driver-rate-") as tmp, _chdir(tmp):
        storage = f"sqlite:///{tmp}/optuna.db"
        uri = f"sqlite:///{tmp}/mlflow.db" if uri == "sqlite" else uri  # MLflow keeps one engine per URI
        pre_create_stores(storage, uri if uri.startswith("sqlite") else None)
        liveness = Liveness(30)
        study = optuna.create_study(study_name=name, storage=liveness.storage(storage), direction="minimize",
                                    sampler=make_sampler("tpe", 0, len(space.searched())),
                                    pruner=make_pruner(args.pruner, args.steps))
        liveness.attach(study)
        process = args.mlflow_process == "on" or (args.mlflow_process == "auto" and args.slots >= PROCESS_SLOTS)
        writer = ClientProcess(uri) if process else None  # as a launch on a cluster of this many slots
        tracker = Tracker(uri, name, {"model": MODEL, "bench": "driver_rate"}, writer, driver=liveness.driver)
        executor = SimExecutor(args.slots, rate, args.metrics, window=args.window, writer=writer)
        budget = Budget(10**6, args.steps, 2, args.report_every, race_seeds=args.race_seeds,
                        prune_from=prune_start(args.pruner, args.steps), prune_to=prune_end(study.pruner))
        backlog: list[tuple[float, int]] = []
        with ProgressView(10**6, live=False, console=_null_console()) as view:
            search = timed_search(study, space, MODEL, executor, budget, [tracker, view],
                                  stream=studyrecord.seed_stream(study, 0), liveness=liveness)
            watch = _watch_backlog(tracker, backlog)
            with contextlib.suppress(WindowOver):
                search.run()
            cpu = time.process_time() - executor.cpu_started  # the driver process over the window
            writer_cpu = writer.cpu_seconds() - executor.writer_cpu_started if writer else 0.0
            watch()
            stop = time.perf_counter()
            tracker.flush()  # the window's last writes, before the verification queues its own
            drain = time.perf_counter() - stop
            verified = verification(study, executor, search, [tracker, view], budget) if args.verify else {}
        tracker.close("FINISHED", wait=300.0)
        liveness.stop()
        handled = sum(len(v) for v in executor.handled.values())
        lost = check_nothing_lost(tracker, executor)
        unfinished = [t.number for t in study.get_trials(deepcopy=False)
                      if t.state is optuna.trial.TrialState.RUNNING and t.number not in search.in_flight()]
    lags = [lag for _, lag in executor.lags]
    half = [lag for at, lag in executor.lags if at > args.window / 2]
    first = [lag for at, lag in executor.lags if at <= args.window / 2]
    states = Counter(o.state.name.lower() for o in search.outcomes)
    row = {
        "rate": rate, "slots": args.slots, "handled": handled, "handled_per_s": handled / args.window,
        # the steady state: a large cluster fills during the window's first part (an ask per slot)
        "handled_per_s_late": sum(n for at, n in executor.batches if args.window / 2 < at <= args.window)
        / (args.window / 2),
        "trials": len(search.outcomes), "trials_per_s": len(search.outcomes) / args.window, "states": dict(states),
        "race_runs": search.compute.by_phase().get("race", {}).get("runs", 0),
        "max_lag": max(lags, default=0.0), "lag_first_half": median(first), "lag_second_half": median(half),
        "drain": drain, "cpu_per_1000": 1000 * cpu / max(handled, 1), "cpu_cores": cpu / args.window,
        "mlflow_process": process, "writer_cores": writer_cpu / args.window,
        "peak_backlog": max((b for _, b in backlog), default=0), "unfinished": len(unfinished),
        **search.ask_figures(), **verified, **lost,
    }
    row["backlog_growth"] = _growth(backlog, executor.started or 0.0, args.window)
    # the driver keeps up: records handled soon after they are due, and the slots kept full (a driver
    # slow to ask leaves them empty: the records of the runs it did not start are never due)
    row["kept_up"] = (row["max_lag"] <= args.max_lag and row["lag_second_half"] <= row["lag_first_half"] + 0.5
                      and row["handled_per_s_late"] >= FULL * rate)
    # like with like: the unsent points' growth against the points one second of records carries
    row["points_per_s"] = rate * (2 + args.metrics)
    row["mlflow_kept_up"] = row["backlog_growth"] <= row["points_per_s"] and drain <= args.max_drain
    row["sustained"] = (row["kept_up"] and row["mlflow_kept_up"] and row["lost"] == 0 and row["extra"] == 0
                        and row["unfinished"] == 0)
    return row


def _search_class() -> type:
    from tuner.driver.search import Search

    class Timed(Search):
        """The search loop, timing each ask (ask + suggestions + the parameters' write: what
        ``Search._ask`` spends, for a free slot or ahead) against the seed runs in flight."""

        asks: list[tuple[int, float]]

        def _ask(self) -> Any:
            started = time.perf_counter()
            inflight = self.executor.slots - self.executor.free()
            try:
                return super()._ask()
            finally:
                self.asks.append((inflight, time.perf_counter() - started))

        def in_flight(self) -> set[int]:
            """The trials the window's end left running, started or asked ahead (a launch's stop
            would fail them; here they stay RUNNING, and every other trial must be terminal)."""
            return set(self._active) | {trial.number for trial, _ in self._ready}

        def ask_figures(self) -> dict[str, float]:
            top = max((n for n, _ in self.asks), default=0)
            late = [s for n, s in self.asks if n >= 0.9 * top]  # asked with the cluster (nearly) full
            return {"asks": len(self.asks), "ask_median": median([s for _, s in self.asks]),
                    "ask_full_median": median(late), "ask_inflight": top}

    return Timed


def timed_search(*args: Any, **kwargs: Any) -> Any:
    """A ``Search`` that times its asks (its class is made once tuner is imported)."""
    search = _search_class()(*args, **kwargs)
    search.asks = []
    return search


def verification(study: Any, executor: SimExecutor, search: Any, callbacks: list[Any], budget: Any) -> dict[str, Any]:
    """The end-of-launch verification of the window's best trials (at most 3, 16 fresh seeds at twice
    the steps each, until one meets the bar) and the winner's learning-rate margin, as a launch
    runs them (``tuner.driver.verify.verify_study``), on the simulated cluster with its runs left
    over from the window dropped, at one record per run every 0.05 s. The driver's CPU and wall."""
    from tuner.driver.verify import Plan, Runner, verify_study

    window = (executor.handled, executor.lags, executor.batches)  # the window's: what the figures count
    executor.handled, executor.lags, executor.batches = {}, [], []
    executor.runs.clear()
    executor.heap.clear()
    executor.window, executor.rate = float("inf"), executor.slots / 0.05
    runner = Runner(executor, MODEL, callbacks, budget.report_every)
    cpu, wall = time.process_time(), time.perf_counter()
    raced = budget.race_seeds if budget.race_levels() else 0
    choice = verify_study(study, runner, Plan(steps=2 * budget.steps), search.stream, raced, say=lambda _: None)
    executor.handled, executor.lags, executor.batches = window
    return {"verify_runs": runner.compute.by_phase().get("verify", {}).get("runs", 0),
            "margin_runs": runner.compute.by_phase().get("margin", {}).get("runs", 0),
            "verify_cpu": time.process_time() - cpu, "verify_wall": time.perf_counter() - wall,
            "verified_trial": choice.trial if choice else None}


def _growth(samples: list[tuple[float, int]], start: float, window: float) -> float:
    """How much the tracker's unsent points grew over the window's second half: the median of its last
    quarter minus that of its second quarter (0 if the tracker does not tell its backlog)."""
    def part(lo: float, hi: float) -> float:
        return median([b for at, b in samples if start + lo * window <= at < start + hi * window])

    grown = part(0.75, 1.0) - part(0.25, 0.5)
    return grown if grown == grown else 0.0


def _watch_backlog(tracker: Any, samples: list[tuple[float, int]]) -> Any:
    """Sample the tracker's queued and unsent metric points every 0.5 s (if it tells them); returns a stop
    function."""
    import threading

    done = threading.Event()
    backlog = getattr(tracker, "behind", None)

    def loop() -> None:
        while not done.wait(0.5):
            if backlog is not None:
                samples.append((time.perf_counter(), int(backlog())))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join()

    return stop


def check_nothing_lost(tracker: Any, executor: SimExecutor) -> dict[str, int]:
    """Compare every record the driver handled with what MLflow holds (see the module docs).

    Returns:
        ``expected`` points, ``lost`` (a record's point missing), ``extra`` (a point twice, or one
        no record made), ``spilled`` (telemetry found in telemetry.json instead of metric points).
    """
    client = tracker.client
    runs = client.search_runs([tracker.experiment_id], max_results=50000)
    # (trial, seed) -> (its run, its position there): a trial's own run holds its search seeds, a race
    # run (tagged phase=race) the seeds it raced; each run's ``seeds`` param lists them in position order
    where: dict[tuple[int, int], tuple[Any, int]] = {}
    for run in runs:
        if run.data.tags.get("trial") is not None and run.data.tags.get("phase", "search") in ("search", "race"):
            for position, seed in enumerate(run.data.params.get("seeds", "").split(",")):
                if seed:
                    where[(int(run.data.tags["trial"]), int(seed))] = (run, position)
    expected = lost = extra = spilled = 0
    tables: dict[str, dict[str, Any]] = {}
    for key, items in executor.handled.items():
        run, position = where.get(key, (None, 0))
        run_id = run.info.run_id if run else None
        if run_id and run_id not in tables:
            tables[run_id] = _telemetry_table(client, run_id)
        table_doc = tables.get(run_id or "", {})
        name = f"s{position}" if run else None
        for metric, flag in (("loss", 1), ("grad_norm", 1), (KEY, 2)):  # grad_norm: finite whenever loss is
            want = [item[0] for item in items if item[flag]]  # the steps whose records carried it
            got = [m.step for m in client.get_metric_history(run_id, f"{name}/{metric}")] if name else []
            if metric != "loss":
                in_table = [row["step"] for row in table_doc.get(name, []) if metric in row] if name else []
                spilled += len(in_table) if metric == KEY else 0
                got += in_table
            expected += len(want)
            lost += sum((Counter(want) - Counter(got)).values())
            extra += sum((Counter(got) - Counter(want)).values())
    return {"expected": expected, "lost": lost, "extra": extra, "spilled": spilled}


def _telemetry_table(client: Any, run_id: str) -> dict[str, Any]:
    """The run's telemetry.json (the tracker's spill of telemetry it did not send as metric points)."""
    names = {a.path for a in client.list_artifacts(run_id)}
    if "telemetry.json" not in names:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, "telemetry.json", tmp)
        return dict(json.loads(Path(path).read_text()))


@contextlib.contextmanager
def _chdir(path: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _null_console() -> Any:
    from rich.console import Console

    return Console(file=io.StringIO(), width=120)


# ---------------------------------------------------------------- the search for the highest rate

def highest_rate(uri: str, args: argparse.Namespace, say: Any) -> tuple[float, list[dict[str, Any]]]:
    """Double from ``args.start`` until a rate is not sustained (or halve until one is), then bisect
    once between the last two; the highest sustained."""
    rows, rate, best, failed = [], args.start, 0.0, None
    while rate >= 30 and best == 0.0:  # the start not sustained: halve until a rate is
        row = measure(rate, uri, args)
        rows.append(row)
        say(_line(row))
        if row["sustained"]:
            best, rate = rate, rate * 2
        else:
            failed, rate = rate, rate / 2
    while best > 0 and failed is None and rate <= args.ceiling:
        row = measure(rate, uri, args)
        rows.append(row)
        say(_line(row))
        if not row["sustained"]:
            failed = rate
            break
        best, rate = rate, rate * 2
    if failed is not None and best > 0 and not args.no_bisect:
        mid = (best + failed) / 2 if failed > best else best * 1.5
        row = measure(mid, uri, args)
        rows.append(row)
        say(_line(row))
        if row["sustained"]:
            best = mid
    return best, rows


def _line(row: dict[str, Any]) -> str:
    verdict = "sustained" if row["sustained"] else "NOT sustained"
    states = ", ".join(f"{n} {k}" for k, n in sorted(row["states"].items()))
    verified = (f"; verification: {row['verify_runs']} + {row['margin_runs']} margin runs, driver CPU "
                f"{row['verify_cpu']:.1f} s in {row['verify_wall']:.1f} s" if "verify_runs" in row else "")
    writer = f" + MLflow's process {row['writer_cores']:.2f}" if row.get("mlflow_process") else ""
    return (f"  {row['rate']:.0f} records/s at {row['slots']} slots: {verdict}; handled {row['handled']} "
            f"({row['handled_per_s']:.0f}/s; {row['handled_per_s_late']:.0f}/s in its second half), "
            f"{row['trials']} trials ended ({row['trials_per_s']:.1f}/s: {states}; "
            f"{row['race_runs']} race runs), asks {row['asks']}: median {row['ask_median']:.3f} s, "
            f"{row['ask_full_median']:.3f} s at {row['ask_inflight']} in flight; driver {row['cpu_cores']:.2f} "
            f"cores{writer}; {row['unfinished']} trials left RUNNING{verified};\n"
            f"    lag max {row['max_lag']:.2f} s (median {row['lag_first_half']:.2f} -> "
            f"{row['lag_second_half']:.2f}), MLflow backlog +{row['backlog_growth']:.0f} points, drain "
            f"{row['drain']:.1f} s (peak backlog {row['peak_backlog']}), lost {row['lost']} / "
            f"{row['expected']}, twice {row['extra']}, telemetry in telemetry.json {row['spilled']}, "
            f"driver CPU {row['cpu_per_1000']:.2f} s / 1000 records")


@contextlib.contextmanager
def mlflow_server(backend: str) -> Iterator[str]:
    """An ``mlflow server`` on 127.0.0.1 with ``backend`` as its store, in its own process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory(prefix="tuner-driver-rate-server-") as tmp:
        process = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri", backend, "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--artifacts-destination", f"{tmp}/artifacts"],
            cwd=tmp, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            _wait_port(port, 120)
            yield f"http://127.0.0.1:{port}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


# ---------------------------------------------------------------- a 4-node local Ray cluster

def cluster_run(args: argparse.Namespace) -> dict[str, Any]:
    """A real launch (iterated_mlp) on a 4-node local Ray cluster, ``--node-cpus`` per node; placement and rate."""
    from tuner.driver.executor import _ensure_token

    _ensure_token()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_enable_metrics_collection": "0"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cpus = f"--num-cpus={args.node_cpus}"
    nodes = [_ray_node(["--head", f"--port={port}", cpus, "--include-dashboard=false"], env)]
    try:
        _wait_port(port, 60)
        _wait_nodes(port, 1, env)
        for n in range(3):
            nodes.append(_ray_node([f"--address=127.0.0.1:{port}", cpus], env))
            _wait_nodes(port, n + 2, env)
        with tempfile.TemporaryDirectory(prefix="tuner-driver-rate-cluster-") as tmp:
            return _cluster_launch(f"127.0.0.1:{port}", tmp, env, args)
    finally:
        for process in reversed(nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def _ray_node(extra: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *extra], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_nodes(port: int, count: int, env: dict[str, str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run([str(BIN / "ray"), "status", f"--address=127.0.0.1:{port}"], env=env,
                             capture_output=True, text=True, timeout=60).stdout
        active = out.split("Active:")[1].split("Pending:")[0] if "Active:" in out else ""
        if active.count("node_") >= count:
            return
        time.sleep(1)
    raise TimeoutError(f"the cluster did not reach {count} alive node(s)")


def _cluster_launch(address: str, tmp: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """``python -m tuner launch --address`` on the cluster with a launch's defaults (the first-seed
    pruner, racing, verification and margin); then placement from MLflow's tags, the driver
    process's CPU, and the trials' states in Optuna."""
    import resource

    storage, uri = f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db"
    argv = [sys.executable, "-m", "tuner", "launch", "--address", address, "--trials", str(args.trials),
            "--steps", str(args.cluster_steps), "--seeds", "2", "--report-every", str(args.report_every),
            "--study", "cluster", "--storage", storage, "--tracking-uri", uri, "--out", f"{tmp}/best.yaml"]
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, cwd=tmp, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=1800)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the launch process (the driver): workers are the nodes'
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode not in (0, 3):
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise RuntimeError(f"the launch on the cluster exited {done.returncode}")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name("cluster")
    if found is None:
        raise RuntimeError("the launch on the cluster logged no MLflow experiment")
    experiment = found.experiment_id
    runs = [r for r in client.search_runs([experiment], max_results=5000) if r.data.tags.get("trial") is not None]
    placement: dict[str, int] = {}
    records = 0
    for run in runs:
        seeds = [s for s in run.data.tags.get("seeds", "").split(",") if s]
        for position in range(len(seeds)):  # a seed's metrics and tags are named by its position: s0, s1, ...
            node = run.data.tags.get(f"s{position}.node_id", "unknown")
            placement[node] = placement.get(node, 0) + 1
            records += len(client.get_metric_history(run.info.run_id, f"s{position}/loss"))
    import optuna

    trials = optuna.load_study(study_name="cluster", storage=storage).get_trials(deepcopy=False)
    return {"wall": wall, "runs": sum(placement.values()), "placement": placement, "records": records,
            "records_per_s": records / wall, "mlflow_runs": len(runs), "trials": len(trials), "driver_cpu": cpu,
            "states": dict(Counter(t.state.name for t in trials)), "exit": done.returncode}


# ---------------------------------------------------------------- main

def main() -> None:
    from tuner.config import LaunchConfig

    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backend", choices=["sqlite", "http-postgres", "both"], default="both")
    p.add_argument("--postgres", default=os.environ.get("TUNER_BENCH_POSTGRES"),
                   help="a PostgreSQL database URL for the MLflow server (default: $TUNER_BENCH_POSTGRES)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--window", type=float, default=30.0,
                   help="seconds of records per measurement (at 1000 slots longer than the fill: 90 s)")
    p.add_argument("--slots", type=int, default=200, help="seed runs at once (trials x 2 seeds)")
    p.add_argument("--steps", type=int, default=LaunchConfig.model_fields["steps"].default,
                   help="steps per seed run (default: a launch's; N runs at N records/s: a run lasts 24 s)")
    p.add_argument("--report-every", type=int, default=25)
    p.add_argument("--metrics", type=int, default=30, help="telemetry values per record besides loss and grad_norm")
    p.add_argument("--pruner", default=LaunchConfig.model_fields["pruner"].default, help="default: a launch's")
    p.add_argument("--race-seeds", type=int, default=LaunchConfig.model_fields["race_seeds"].default,
                   help="default: a launch's (0: no racing)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="no end-of-launch verification after the window")
    p.add_argument("--start", type=float, default=250.0, help="the first rate tried (records/s)")
    p.add_argument("--ceiling", type=float, default=8000.0, help="the highest rate tried")
    p.add_argument("--rate", type=float, help="measure this one rate only (no search)")
    p.add_argument("--max-lag", type=float, default=2.0)
    p.add_argument("--no-bisect", action="store_true", help="stop at the first rate not sustained")
    p.add_argument("--max-drain", type=float, default=15.0,
                   help="seconds MLflow may take for the last writes (a run's points wait up to 10 s to be sent "
                        "in one call)")
    p.add_argument("--cluster", action="store_true", help="the 4-node local Ray cluster run instead")
    p.add_argument("--trials", type=int, default=8, help="trials of the --cluster launch")
    p.add_argument("--cluster-steps", type=int, default=300, help="steps per seed run of the --cluster launch")
    p.add_argument("--node-cpus", type=int, default=1, help="CPUs (slots) per node of the --cluster run")
    p.add_argument("--mlflow-process", choices=["auto", "on", "off"], default="auto",
                   help="MLflow's writes through a process of their own (auto: as a launch, from PROCESS_SLOTS slots)")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    if args.cluster:
        print_header(f"driver on a 4-node local Ray cluster ({args.node_cpus} CPU per node): {args.trials} trials x "
                     f"{args.cluster_steps} steps x 2 seeds, report every {args.report_every}")
        doc = cluster_run(args)
        placed = {node[:12]: n for node, n in sorted(doc["placement"].items()) if node != "unknown"}
        unplaced = doc["placement"].get("unknown", 0)  # cancelled before a worker took it
        print(table(["node", "seed runs"], [*placed.items(), ("(none: cancelled before it started)", unplaced)]))
        print(f"RESULT cluster placement = {len(placed)} nodes, {doc['runs']} seed runs "
              f"({', '.join(str(v) for v in placed.values())}; {unplaced} without a node)")
        print(f"RESULT cluster records = {doc['records']} progress records in MLflow in {doc['wall']:.1f} s "
              f"({doc['records_per_s']:.1f} records/s); the driver process {doc['driver_cpu']:.1f} CPU s "
              f"({1000 * doc['driver_cpu'] / max(doc['records'], 1):.1f} s / 1000 records, its start and "
              f"imports included); Optuna's trials: {doc['states']}; exit {doc['exit']}")
        write_json(args.json, doc)
        return
    if args.smoke:
        args.repeats, args.window, args.slots, args.steps, args.backend = 1, 3.0, 8, 200, "sqlite"
        args.rate = args.rate or 200.0
    backends = ["sqlite", "http-postgres"] if args.backend == "both" else [args.backend]
    if "http-postgres" in backends and not args.postgres:
        p.error("http-postgres needs --postgres URL or $TUNER_BENCH_POSTGRES (a database the bench may write to)")
    print_header(f"driver rate: {args.slots} seed runs at once, {args.steps} steps, a record every "
                 f"{args.report_every} steps with {args.metrics + 2} metrics, windows of {args.window:g} s, "
                 f"{args.repeats} repeat(s), backends {', '.join(backends)}")
    results: dict[str, Any] = {}
    for backend in backends:
        best_rates, all_rows = [], []
        for n in range(args.repeats):
            print(f"{backend}, repeat {n + 1}:", flush=True)
            with _backend_uri(backend, args) as uri:
                if args.rate:
                    row = measure(args.rate, uri, args)
                    print(_line(row), flush=True)
                    rows, best = [row], (args.rate if row["sustained"] else 0.0)
                else:
                    best, rows = highest_rate(uri, args, lambda s: print(s, flush=True))
            best_rates.append(best)
            all_rows += [{**r, "repeat": n + 1} for r in rows]
        results[backend] = {"highest": best_rates, "median": median(best_rates), "rows": all_rows}
        print(table(["repeat", "slots", "rate", "sustained", "handled/s (2nd half)", "trials/s", "ask s (full)",
                     "max lag s", "driver cores", "MLflow process cores", "drain s", "lost", "twice", "in table"],
                    [[r["repeat"], r["slots"], r["rate"], r["sustained"], r["handled_per_s_late"], r["trials_per_s"],
                      r["ask_full_median"], r["max_lag"], r["cpu_cores"],
                      r["writer_cores"] if r["mlflow_process"] else "-", r["drain"], r["lost"], r["extra"],
                      r["spilled"]] for r in all_rows]))
        lost = sum(r["lost"] + r["extra"] for r in all_rows)
        print(f"RESULT driver_rate {backend} = {median(best_rates):.0f} records/s sustained (median of "
              f"{len(best_rates)}: {', '.join(f'{b:.0f}' for b in best_rates)}); points lost or twice: {lost}")
    print(f"RESULT driver_rate tensorflow_imported = {'YES (a defect)' if 'tensorflow' in sys.modules else 'no'}")
    write_json(args.json, results)


@contextlib.contextmanager
def _backend_uri(backend: str, args: argparse.Namespace) -> Iterator[str]:
    """The tracking URI of a backend: a SQLite file in each measurement's folder, or a fresh server."""
    if backend == "sqlite":
        yield "sqlite"  # a file in each measurement's own temporary folder
        return
    with mlflow_server(args.postgres) as uri:
        yield uri


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
