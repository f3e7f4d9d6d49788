"""The benchmark scripts keep working: each one's --smoke mode runs and prints its figure lines.

Timings are never asserted here (they belong in BENCHMARKS.md, measured on a quiet machine).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "bench"

# script -> the RESULT lines its smoke run must print
SCRIPTS = {
    "overhead.py": ["RESULT overhead tuner =", "RESULT overhead ray_tune_reuse ="],
    "scaling.py": ["RESULT scaling end_to_end =", "RESULT scaling steady ="],
    "pruning.py": ["RESULT pruning steps_fraction =", "RESULT pruning cancel_latency ="],
    "search_efficiency.py": ["RESULT efficiency tpe =", "RESULT efficiency ratio ="],
    "pruner_replay.py": ["RESULT pruner_replay 1.5x best from 150: saved ="],
    "robustness.py": ["RESULT robustness smoke worst_survival =", "RESULT robustness smoke compute_ratio ="],
    "driver_rate.py": ["RESULT driver_rate sqlite =", "RESULT driver_rate tensorflow_imported = no"],
    "driver_footprint.py": [
        "RESULT driver cpu_per_1000_records =", "RESULT driver peak_memory =", "RESULT driver tensorflow_imported = no",
        "RESULT driver record_cost =",
    ],
}


def _smoke(script: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_smoke_prints_its_figures(script: str) -> None:
    done = _smoke(script)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in SCRIPTS[script]:
        assert line in done.stdout, f"{line!r} missing from:\n{done.stdout[-3000:]}"
    assert "machine:" in done.stdout


def test_bench_scripts_are_all_smoke_tested() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")}
    helpers = {"benchlib.py", "bare_loop.py", "ray_tune_baseline.py", "reference_grid.py", "telemetry_overhead.py"}
    checked_elsewhere = {"ui_screenshots.py"}  # a browser check, not a timing: tests/test_ui.py runs it
    assert scripts - helpers - checked_elsewhere == set(SCRIPTS)
