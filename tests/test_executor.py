"""The Ray executor on a real local cluster: streaming, cancellation, placement."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import PLANTED, wait_for_workers
from tuner.driver.executor import ClusterConfig, RayExecutor, listening
from tuner.records import RunRecord, RunSpec, RunStatus, TrainConfig

pytestmark = [pytest.mark.ray, pytest.mark.tf, pytest.mark.slow]

KNOBS = {"fault": "none", "bad_step": 0, "batch_size": 8, "width": 1}


@pytest.fixture(scope="module")
def executor(ray_cluster: None) -> Iterator[RayExecutor]:
    ex = RayExecutor(ClusterConfig(cpus_per_trial=1, max_concurrent=2))
    yield ex
    ex.close()


def collect(ex: RayExecutor, until_final: int, timeout: float = 120) -> list[RunRecord]:
    records: list[RunRecord] = []
    deadline = time.monotonic() + timeout
    while sum(r.final for r in records) < until_final and time.monotonic() < deadline:
        records += ex.poll(0.5)
    return records


def spec(trial: int, seed: int = 0, steps: int = 100, **knobs: object) -> RunSpec:
    return RunSpec(trial, seed, PLANTED, TrainConfig(1e-2, knobs={**KNOBS, **knobs}), steps, 10)


def test_executor_streams_progress_then_final_from_a_worker(executor: RayExecutor) -> None:
    events: list[tuple[str, object]] = []
    with listening(lambda event, item: events.append((event, item))):
        executor.submit(spec(0))
        records = collect(executor, 1)
    runs = [e for e in events if e[0] != "worker_ready"]  # what benchmarks time (bench/benchlib.py)
    assert runs == [("dispatched", spec(0))] + [("record", r) for r in records]
    assert events.index(("worker_ready", None)) < events.index(("dispatched", spec(0)))  # a worker came up first
    assert [r.step for r in records if not r.final] == list(range(10, 101, 10))
    final = records[-1]
    assert final.final and final.status is RunStatus.SURVIVED
    assert final.info["node_id"] and final.info["pid"]


def test_executor_cancel_stops_a_running_seed_within_a_report(executor: RayExecutor) -> None:
    executor.submit(spec(1, steps=10_000_000))
    records: list[RunRecord] = []
    while not records:
        records = executor.poll(0.5)
    executor.cancel(1)
    records += collect(executor, 1, timeout=30)
    final = records[-1]
    assert final.status is RunStatus.CANCELLED
    assert final.steps_survived < 10_000_000


def test_executor_diverged_run_reports_exact_step(executor: RayExecutor) -> None:
    executor.submit(spec(2, fault="loss", bad_step=42))
    final = collect(executor, 1)[-1]
    assert (final.status, final.step, final.steps_survived) == (RunStatus.DIVERGED, 42, 41)


def test_executor_model_error_fails_run_with_message(executor: RayExecutor) -> None:
    executor.submit(RunSpec(3, 0, "no_such_module:Model", TrainConfig(1e-2), 10, 5))
    final = collect(executor, 1)[-1]
    assert final.status is RunStatus.FAILED
    assert "cannot import module 'no_such_module'" in (final.error or "")


def test_executor_runs_two_seeds_at_once_on_two_slots(executor: RayExecutor) -> None:
    assert executor.slots == 2
    wait_for_workers(executor)
    executor.submit(spec(4, seed=0, steps=2000))
    executor.submit(spec(4, seed=1, steps=2000))
    records = collect(executor, 2)
    pids = {r.info["pid"] for r in records if r.final}
    assert len(pids) == 2  # two different worker processes


def test_stop_monitor_kills_the_embedded_clusters_monitor() -> None:
    """``_stop_monitor`` (which close() calls before ray.shutdown) kills the autoscaler monitor.

    Fails if Ray's private node internals move and ``_stop_monitor`` silently does nothing.
    (Through close() alone the two paths look alike: Ray too ends the monitor with SIGKILL, a
    second later.)
    Run in a fresh process: the embedded cluster must be the executor's own.
    """
    import subprocess
    import sys

    script = (
        "from tuner.driver.executor import ClusterConfig, RayExecutor, _stop_monitor\n"
        "import ray\n"
        "ex = RayExecutor(ClusterConfig(num_cpus=1))\n"
        "node = ray._private.worker._global_node\n"
        "monitors = [i.process for i in node.all_processes[ray._private.ray_constants.PROCESS_TYPE_MONITOR]]\n"
        "alive = [p.poll() is None for p in monitors]\n"
        "_stop_monitor()\n"
        "print('alive before', alive, 'after', [p.poll() is None for p in monitors])\n"
        "ex.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alive before [True] after [False]" in done.stdout, done.stdout + done.stderr[-2000:]


def test_executor_reuses_a_workers_graph_for_the_same_model_config(executor: RayExecutor) -> None:
    """Four runs of one config on two workers: at most one build per worker, and a reused graph
    gives a seed the very run a fresh build gave it."""
    for seed in (5, 6, 5, 6):
        executor.submit(spec(7, seed=seed, steps=30, width=3))
    finals = [r for r in collect(executor, 4) if r.final]
    assert all(r.status is RunStatus.SURVIVED for r in finals)
    graphs = [r.info["graph"] for r in finals]
    assert graphs.count("built") <= 2 and graphs.count("reused") == 4 - graphs.count("built") >= 2
    for seed in (5, 6):
        runs = {(r.loss, r.val_loss, r.init_val_loss) for r in finals if r.seed == seed}
        assert len(runs) == 1  # built or reused, the same numbers
