"""Shared fixtures: one real Ray cluster per test session, temporary stores, the fixture models."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tuner.worker.actor import use_legacy_keras

if TYPE_CHECKING:
    from tuner.driver.executor import RayExecutor

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PLANTED = f"{FIXTURES / 'planted.py'}:Planted"

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
use_legacy_keras()  # before any test imports TensorFlow: tf.compat.v1.layers need Keras 2

# launch flags for tests whose subject is not racing or verification: they keep to the search
NO_VERIFY = ["--race-seeds", "0", "--verify-seeds", "0"]
# a launch that ran to its end: 0 (a stable config exported) or 3 (exported, but not shown stable)
FINISHED = (0, 3)
# Optuna state name -> the MLflow status tags that match it (a pruner-stopped trial is PRUNED too)
STATUSES = {"COMPLETE": ("survived",), "PRUNED": ("diverged", "stopped"), "FAIL": ("failed",)}


def made_study(storage: str, name: str) -> Any:
    """Study ``name`` of the Optuna ``storage`` URL a launch is writing, or None before the launch
    has created it. A SQLite file is first read with sqlite3, read-only: a reader that opens Optuna's
    storage while the launch is still making its tables stamps Optuna's schema version too, and one of
    the two fails (UNIQUE constraint failed: alembic_version)."""
    import optuna

    if storage.startswith("sqlite:///"):
        try:
            with contextlib.closing(sqlite3.connect(f"file:{storage[len('sqlite:///'):]}?mode=ro", uri=True,
                                                    timeout=5)) as conn:
                if conn.execute("SELECT 1 FROM studies WHERE study_name = ?", (name,)).fetchone() is None:
                    return None
        except sqlite3.Error:  # no file yet, or no table yet
            return None
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def training(storage: str, name: str = "s1") -> bool:
    """A trial of the launch's study ``name`` is RUNNING and has reported a step (a run is training)."""
    import optuna

    made = made_study(storage, name)
    return made is not None and any(
        t.state == optuna.trial.TrialState.RUNNING and t.intermediate_values for t in made.trials)


def expected_status(trial: Any) -> str:
    """The MLflow ``status`` tag an Optuna trial's run must have (checked against its state)."""
    from tuner.driver.trialrecord import read

    record = read(trial)
    status = record.state.value if record is not None else STATUSES[trial.state.name][0]
    assert status in STATUSES[trial.state.name], (trial.number, trial.state, status)
    return status


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray cluster (2 CPUs, 4 logical GPUs), started once per session."""
    from tuner.environ import prepare_process

    prepare_process()
    from tuner.driver import embedded
    from tuner.driver.executor import _ensure_token

    _ensure_token()
    # as a launch starts its cluster: on the loopback, in a private folder, ended with this process
    cluster = embedded.start(num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False)
    yield
    cluster.close()


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, str]:
    """Fresh Optuna and MLflow SQLite stores in a temp folder."""
    return {
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "dir": str(tmp_path),
    }


def bench_module(name: str) -> types.ModuleType:
    """The bench script ``bench/NAME.py``, imported as a module (its ``from benchlib import ...`` too)."""
    bench = str(ROOT / "bench")
    sys.path.insert(0, bench)
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(name, module)  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(bench)


def terminal_sigint() -> None:
    """A ``preexec_fn``: the child gets SIGINT as a terminal gives it. A shell starts its background
    jobs (``cmd &`` without job control: nohup'd runs, some CI steps) with SIGINT ignored, and
    children inherit that; a Python started so installs no KeyboardInterrupt handler at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_tuner(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tuner ARGS`` in a subprocess, as a user would."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=timeout,
    )


def wait_for_workers(executor: RayExecutor, count: int = 2, timeout: float = 120) -> None:
    """Poll ``executor`` until ``count`` workers have started (else one worker may run two runs in turn)."""
    deadline = time.monotonic() + timeout
    while len(executor.workers) < count and time.monotonic() < deadline:
        executor.poll(0.5)
    assert len(executor.workers) >= count, f"{count} workers did not start within {timeout:.0f} s"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with the most slow tests first: two files run at a time (``-n 2 --dist loadfile``), so a
    long file started last would leave one core idle at the end; quick files fill the tail instead.
    The order within a file is kept."""
    slow: dict[Path, int] = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    first = {path: place for place, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first[item.path]))
