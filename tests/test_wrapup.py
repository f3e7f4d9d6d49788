"""The end of a launch: the exported trial with its evidence, and the commands and URLs that open it."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
from rich.console import Console

from tuner.driver.evidence import Margin, Verification
from tuner.driver.wrapup import print_best, study_id, where_to_look

DOC = {
    "config": {"learning_rate": 0.004},
    "stability": {"steps": 600, "seeds": [1, 2, 3, 4, 5, 6, 7, 8], "steps_survived": [600] * 8, "diverged": False,
                  "learned": True,
                  "verified": Verification(tuple(range(16)), 1200, 16, 16, 0.8).to_dict(),
                  "margin": Margin(3.0, 1200, 16).to_dict()},
    "study": {"name": "s", "trial": 4, "storage": "sqlite:///tuner.db", "mlflow_run_id": "abc123"},
}


def test_the_end_names_the_exported_trial_its_evidence_and_where_it_was_written(tmp_path: Path) -> None:
    buffer = io.StringIO()
    print_best(Console(file=buffer, width=80), DOC, str(tmp_path / "best.yaml"))
    lines = buffer.getvalue().splitlines()
    assert lines[0] == ("best config: trial 4, verified 16/16 fresh seeds x 1200 steps, 95% lower bound 0.81 "
                        ">= bar 0.8")  # one line, never wrapped at 80 columns
    assert lines[1:3] == ["  survives 3x its learning rate", f"written to {tmp_path / 'best.yaml'}:"]
    assert lines[3:5] == ["config:", "  learning_rate: 0.004"]


def test_where_to_look_gives_both_uis_commands_and_urls_with_passwords_masked(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    optuna.create_study(study_name="other", storage=storage)
    optuna.create_study(study_name="s", storage=storage)
    sid = study_id(storage, "s")
    assert sid is not None and sid == optuna.storages.get_storage(storage).get_study_id_from_name("s") != \
        study_id(storage, "other")
    assert study_id(storage, "missing") is None  # a link is a convenience: no error
    lines = where_to_look(DOC, "postgresql://u:secret@db/optuna", "http://u:hunter2@mlflow:5000", "7", sid)
    assert lines == [  # an mlflow server: its own UI, the login left out of the links
        "see it in MLflow:",
        "  open http://mlflow:5000/#/experiments/7/runs/abc123?workflowType=machine_learning",
        "  all trials: http://mlflow:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=tuner",
        "see it in optuna-dashboard:",
        "  optuna-dashboard 'postgresql://u:***@db/optuna'",
        f"  then open http://127.0.0.1:8080/dashboard/studies/{sid}/trials?numbers=4",
    ]
    local = where_to_look(DOC, storage, "sqlite:///m.db", "7", sid)[:4]
    assert local == ["see it in MLflow:", "  mlflow ui --backend-store-uri sqlite:///m.db",
                     "  then open http://127.0.0.1:5000/#/experiments/7/runs/abc123?workflowType=machine_learning",
                     "  all trials: http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
                     "&viewStateShareKey=tuner"]
    untracked = where_to_look(DOC, storage, None, None, None)
    assert untracked == ["see it in optuna-dashboard:", f"  optuna-dashboard {storage}"]  # no MLflow lines


def test_the_summary_marks_the_incumbent_and_counts_the_whole_study_saying_so(tmp_path: Path) -> None:
    from tests.test_report import table_rows, verified_study
    from tuner.driver.wrapup import print_summary

    study = verified_study(f"sqlite:///{tmp_path / 't.db'}")  # 4 trials, trial 0 exported
    buffer = io.StringIO()
    print_summary(Console(file=buffer, width=100), study, {0, 1, 2, 3}, ["learning_rate"])
    text = buffer.getvalue()
    assert [n for n, row in table_rows(text).items() if "*" in row] == [0]
    assert text.splitlines()[-1].startswith("4 trials finished: 3 survived, 1 diverged")
    buffer = io.StringIO()
    print_summary(Console(file=buffer, width=100), study, {2, 3}, ["learning_rate"])  # a continued study
    assert sorted(table_rows(buffer.getvalue())) == [2, 3]
    assert buffer.getvalue().splitlines()[-1].startswith("the study (earlier launches too): 4 trials finished")
