"""A study belongs to its model: continuing it with another model, space or ``--steps`` is refused
in one line before anything is created (issue 27, item 7)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import FINISHED, NO_VERIFY, run_tuner
from tuner.driver.studyrecord import mismatch, model_id

SPACE = {"learning_rate": "log range [0.0001, 0.01]", "max_iter": "range [4, 16]"}


def test_model_id_names_a_file_model_without_its_folder() -> None:
    assert model_id("iterated_mlp") == "iterated_mlp"
    assert model_id("pkg.models:Mine") == "pkg.models:Mine"
    assert model_id("/home/me/models/mine.py:Mine") == model_id("models/mine.py:Mine") == "mine.py:Mine"


def test_mismatch_names_the_model_the_knob_or_the_budget_that_differs() -> None:
    recorded = {"model": "iterated_mlp", "space": SPACE, "steps": [600]}
    assert mismatch(recorded, "iterated_mlp", SPACE, 600, False) is None
    assert "created for model 'iterated_mlp', and this launch's --model is 'counting_cnn'" in str(
        mismatch(recorded, "counting_cnn", SPACE, 600, False))
    other = {**SPACE, "max_iter": "range [4, 20]"}
    assert "1 knob(s) differ (max_iter; max_iter: range [4, 16] in the study, range [4, 20] now)" in str(
        mismatch(recorded, "iterated_mlp", other, 600, False))
    assert "searched at --steps 600, and this launch asks --steps 300" in str(
        mismatch(recorded, "iterated_mlp", SPACE, 300, False))
    assert mismatch(recorded, "iterated_mlp", SPACE, 300, True) is None
    assert mismatch({**recorded, "steps": [600, 300]}, "iterated_mlp", SPACE, 300, False) is None


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_launch_refuses_another_model_or_steps_on_a_study_and_allows_a_steps_change_it_records(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    common = ["launch", "--seeds", "1", *NO_VERIFY, "--no-margin", "--no-live", "--storage", storage,
              "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--num-cpus", "2", "--study", "s1",
              "--out", str(tmp_path / "best.yaml")]
    first = run_tuner([*common, "--trials", "1", "--steps", "20"], cwd=tmp_path, timeout=300)
    assert first.returncode in FINISHED, first.stdout[-2000:] + first.stderr[-2000:]
    before = (tmp_path / "best.yaml").read_bytes()

    for args, says in (
        (["--model", "counting_cnn", "--trials", "2", "--steps", "20"],
         "created for model 'iterated_mlp', and this launch's --model is 'counting_cnn'"),
        (["--trials", "2", "--steps", "30"], "searched at --steps 20, and this launch asks --steps 30"),
    ):
        refused = run_tuner([*common, *args], cwd=tmp_path, timeout=120)
        assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tuner: error: --study s1: the study on "), lines
        assert says in lines[0] and "pass --study NEW_NAME" in lines[0]
        assert "Traceback" not in refused.stderr
    assert len(optuna.load_study(study_name="s1", storage=storage).trials) == 1  # nothing trained
    assert (tmp_path / "best.yaml").read_bytes() == before

    allowed = run_tuner([*common, "--trials", "2", "--steps", "30", "--allow-steps-change"], cwd=tmp_path,
                        timeout=300)
    assert allowed.returncode in FINISHED, allowed.stdout[-2000:] + allowed.stderr[-2000:]
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["study"]["searched_at_steps"] == [20, 30]
