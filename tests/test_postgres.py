"""A real PostgreSQL as the Optuna storage and as MLflow's backend store.

``.ci/run`` starts PostgreSQL and sets TUNER_TEST_POSTGRES (``postgresql+psycopg2://user:pw@host:port``).
Without it the test is skipped locally, but in CI (CI=true) its absence is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest

from tests.conftest import NO_VERIFY, run_tuner

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]

BASE = os.environ.get("TUNER_TEST_POSTGRES")


@pytest.fixture
def postgres() -> str:
    if not BASE:
        if os.environ.get("CI"):
            pytest.fail("CI must start PostgreSQL and set TUNER_TEST_POSTGRES (see .ci/run)")
        pytest.skip("no PostgreSQL: run `export TUNER_TEST_POSTGRES=$(bash .ci/postgres.sh)` (as root)")
    return BASE


def test_launch_on_postgres_storage_and_tracking(postgres: str, tmp_path: Path) -> None:
    storage, tracking = f"{postgres}/tuner_optuna", f"{postgres}/tuner_mlflow"
    study_name = f"pg-{os.getpid()}"
    result = run_tuner(
        ["launch", "--trials", "2", "--steps", "60", "--seeds", "2", "--study", study_name,
         "--storage", storage, "--tracking-uri", tracking, "--out", str(tmp_path / "best.yaml"),
         "--num-cpus", "2", *NO_VERIFY],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    password = postgres.split(":")[2].split("@")[0]
    assert password not in result.stdout + result.stderr + (tmp_path / "best.yaml").read_text()

    study = optuna.load_study(study_name=study_name, storage=storage)
    assert sum(t.state.is_finished() for t in study.trials) == 2

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(study_name)
    runs = client.search_runs([experiment.experiment_id])
    assert len([r for r in runs if "trial" in r.data.tags]) == 2


def test_two_launches_on_one_postgres_study_both_finish_none_failed(postgres: str, tmp_path: Path) -> None:
    from tests.test_fault_matrix import two_launches

    two_launches(tmp_path, f"{postgres}/tuner_optuna", f"{postgres}/tuner_mlflow", f"pg2-{os.getpid()}")
