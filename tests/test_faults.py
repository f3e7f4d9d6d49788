"""Worker faults on a real Ray cluster: a worker killed with SIGKILL mid-run is retried, then FAILED."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from tests.conftest import PLANTED
from tuner.driver.executor import ClusterConfig, RayExecutor
from tuner.records import RunRecord, RunSpec, RunStatus, TrainConfig

pytestmark = [pytest.mark.ray, pytest.mark.tf, pytest.mark.slow]

KNOBS = {"fault": "none", "bad_step": 0, "batch_size": 8, "width": 1}


def wait_for(condition: Callable[[], bool], executor: RayExecutor, out: list[RunRecord], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        out += executor.poll(0.2)


def running_pids(executor: RayExecutor) -> set[int]:
    return set(executor.workers)


def test_executor_killed_worker_run_is_retried_and_finishes(ray_cluster: None) -> None:
    executor = RayExecutor(ClusterConfig(cpus_per_trial=1, max_concurrent=1, max_retries=2))
    try:
        out: list[RunRecord] = []
        executor.submit(RunSpec(0, 0, PLANTED, TrainConfig(1e-2, knobs=KNOBS), 30_000, 500))
        wait_for(lambda: any(not r.final for r in out), executor, out)
        (victim,) = running_pids(executor)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: any(r.final for r in out), executor, out, timeout=180)
        final = out[-1]
        assert final.status is RunStatus.SURVIVED and final.steps_survived == 30_000
        assert final.info["pid"] != victim
    finally:
        executor.close()


def test_executor_run_fails_with_reason_after_max_retries(ray_cluster: None) -> None:
    executor = RayExecutor(ClusterConfig(cpus_per_trial=1, max_concurrent=1, max_retries=1))
    try:
        out: list[RunRecord] = []
        executor.submit(RunSpec(7, 1, PLANTED, TrainConfig(1e-2, knobs=KNOBS), 10_000_000, 500))
        killed: set[int] = set()
        for _ in range(2):  # the first attempt and its one retry
            wait_for(lambda: bool(running_pids(executor) - killed) and any(not r.final for r in out),
                     executor, out, timeout=180)
            victim = next(iter(running_pids(executor) - killed))
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            out.clear()
        wait_for(lambda: any(r.final for r in out), executor, out, timeout=180)
        final = out[-1]
        assert (final.trial, final.seed, final.status) == (7, 1, RunStatus.FAILED)
        assert "worker died" in (final.error or "") and "2 attempts, max_retries=1" in (final.error or "")
        assert final.steps_survived > 0  # the last progress the driver saw is kept
    finally:
        executor.close()
