"""GPU placement with Ray's logical GPUs (the session cluster declares 4): ids, sharing, refusal."""

from __future__ import annotations

import time

import pytest

from tests.conftest import PLANTED, wait_for_workers
from tuner.driver.executor import ClusterConfig, RayExecutor
from tuner.errors import ClusterError
from tuner.records import RunRecord, RunSpec, TrainConfig

pytestmark = [pytest.mark.ray, pytest.mark.tf, pytest.mark.slow]

KNOBS = {"fault": "none", "bad_step": 0, "batch_size": 8, "width": 1}


def run_two(config: ClusterConfig) -> list[RunRecord]:
    """Two seed runs at once, on two distinct workers of a fresh executor; their final records.

    Both runs are submitted only once two workers are up, so that neither can run after the other
    on the same worker (which would give both the same GPU whatever the placement).
    """
    executor = RayExecutor(config)
    try:
        wait_for_workers(executor)
        for seed in (0, 1):
            executor.submit(RunSpec(0, seed, PLANTED, TrainConfig(1e-2, knobs=KNOBS), 3000, 100))
        finals: list[RunRecord] = []
        deadline = time.monotonic() + 120
        while len(finals) < 2 and time.monotonic() < deadline:
            finals += [r for r in executor.poll(0.5) if r.final]
        assert len(finals) == 2
        assert finals[0].info["pid"] != finals[1].info["pid"], "the two runs shared a worker"
        return finals
    finally:
        executor.close()


def test_executor_one_gpu_per_trial_gives_distinct_gpu_ids(ray_cluster: None) -> None:
    finals = run_two(ClusterConfig(cpus_per_trial=1, gpus_per_trial=1))
    ids = [tuple(r.info["gpu_ids"]) for r in finals]
    assert all(len(i) == 1 for i in ids) and ids[0] != ids[1]
    # the TF session sees only the GPUs Ray gave the worker
    assert all(r.info["cuda_visible_devices"] == ",".join(r.info["gpu_ids"]) for r in finals)


def test_executor_half_gpu_per_trial_shares_one_gpu(ray_cluster: None) -> None:
    finals = run_two(ClusterConfig(cpus_per_trial=1, gpus_per_trial=0.5, max_concurrent=2))
    ids = [tuple(r.info["gpu_ids"]) for r in finals]
    assert ids[0] == ids[1] and len(ids[0]) == 1


def test_executor_more_gpus_than_cluster_is_a_clear_error(ray_cluster: None) -> None:
    with pytest.raises(ClusterError, match=r"--gpus-per-trial 8 asks for more GPUs than any node has .*4 GPU"):
        RayExecutor(ClusterConfig(cpus_per_trial=1, gpus_per_trial=8))


def test_executor_slots_follow_gpus(ray_cluster: None) -> None:
    executor = RayExecutor(ClusterConfig(cpus_per_trial=0.5, gpus_per_trial=2))
    try:
        assert executor.slots == 2  # 4 GPUs / 2 per run, though 4 runs would fit the CPUs
    finally:
        executor.close()
