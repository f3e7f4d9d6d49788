"""Faults end to end, as a user meets them: each leaves the study and its runs in a known state.

The table in README.md ("What a fault does to a study") lists each fault with the test here (or
elsewhere) that checks it.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.conftest import FIXTURES, NO_VERIFY, run_tuner

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]

FAILING = f"{FIXTURES / 'failing.py'}:Failing"


def _stores(tmp_path: Path) -> list[str]:
    return ["--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
            "--out", str(tmp_path / "best.yaml"), "--num-cpus", "2", "--study", "s1"]


def test_fault_every_trial_fails_one_line_exit_4_study_and_runs_kept(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    result = run_tuner(["launch", "--model", FAILING, "--trials", "2", "--steps", "20", *NO_VERIFY,
                        *_stores(tmp_path)], cwd=tmp_path, timeout=300)
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("tuner: error")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "all 2 trial(s) of study 's1' failed" in lines[0]
    assert "2 x RuntimeError: planted build failure" in lines[0]
    study = optuna.load_study(study_name="s1", storage=f"sqlite:///{tmp_path / 't.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    assert sorted(r.info.status for r in runs if "trial" in r.data.tags) == ["FAILED", "FAILED"]
    assert [r.info.status for r in runs if r.data.tags.get("tuner.role") == "study"] == ["FAILED"]
    assert not (tmp_path / "best.yaml").exists()
