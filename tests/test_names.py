"""Study names are data, not paths: file names built from them stay in their folder, and a name the
stores cannot hold (a control character, too long) is refused in one line saying what is wrong."""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna
import pytest

from tuner.cli import main
from tuner.config import LaunchConfig, load_launch
from tuner.driver.launch import write_study_plots
from tuner.driver.report import run_report
from tuner.errors import ConfigError
from tuner.names import MLFLOW_NAME_MAX, OPTUNA_NAME_MAX, file_safe


@pytest.mark.parametrize(("name", "safe"), [
    ("iterated_mlp", "iterated_mlp"),
    ("../../x", "_.._x"),
    ("..", "_"),
    (".hidden", "hidden"),
    ("/etc/passwd", "_etc_passwd"),
    ("a\nb", "a_b"),
    ("C:\\x y", "C_x_y"),
    ("étude", "_tude"),
])
def test_file_safe_makes_one_plain_file_name(name: str, safe: str) -> None:
    assert file_safe(name) == safe
    assert "/" not in safe and not safe.startswith(".")


def test_default_study_name_follows_the_same_rule() -> None:
    assert LaunchConfig(model="pkg.mod:..Evil Name").study_name == "Evil_Name"
    assert LaunchConfig(model="models/my model.py").study_name == file_safe("models/my model.py")


def _study(tmp_path: Path, name: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / 't.db'}")


def test_launch_plots_of_a_study_named_like_a_path_stay_beside_out(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "best.yaml"
    out.parent.mkdir(parents=True)
    paths = write_study_plots(_study(tmp_path, "../../x"), str(out), f"sqlite:///{tmp_path / 't.db'}")
    assert sorted(Path(p).name for p in paths) == ["_.._x_stability_map.png", "_.._x_survival.png"]
    assert all(Path(p).parent == out.parent for p in paths)
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == ["_.._x_stability_map.png", "_.._x_survival.png"]


def test_report_plots_of_a_study_named_like_a_path_stay_in_out_dir(tmp_path: Path) -> None:
    _study(tmp_path, "../x")
    out_dir = tmp_path / "plots" / "here"
    args = argparse.Namespace(study="../x", storage=f"sqlite:///{tmp_path / 't.db'}", tracking_uri=None,
                              no_tracking=True, out_dir=str(out_dir), model=None)
    assert run_report(args) == 0
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")) == [
        "plots/here/_x_stability_map.png", "plots/here/_x_survival.png"]


@pytest.mark.parametrize(("name", "message"), [
    ("a\nb", r"'a\\nb': holds the control character '\\n' at position 1"),
    ("x\x1b[31m", r"holds the control character '\\x1b' at position 1"),
    ("ab\u202e", r"holds the control character '\\u202e' at position 2"),
    ("x" * (MLFLOW_NAME_MAX + 1), rf"is {MLFLOW_NAME_MAX + 1} characters long; the MLflow tracking store holds at "
                                  rf"most {MLFLOW_NAME_MAX}: choose a shorter name"),
])
def test_load_launch_refuses_a_study_name_the_stores_cannot_hold(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^command line: --study .*{message}"):
        load_launch({"study": name})


def test_launch_yaml_study_key_with_a_newline_is_refused_naming_the_file(tmp_path: Path) -> None:
    file = tmp_path / "launch.yaml"
    file.write_text('study: "a\\nb"\n')
    with pytest.raises(ConfigError, match=rf"^{file}: --study 'a\\nb': holds the control character"):
        load_launch({}, str(file))


def test_study_name_length_limits_follow_the_stores() -> None:
    assert load_launch({"study": "x" * MLFLOW_NAME_MAX}).study_name == "x" * MLFLOW_NAME_MAX
    assert load_launch({"study": "x" * OPTUNA_NAME_MAX, "no_tracking": True}).study == "x" * OPTUNA_NAME_MAX
    with pytest.raises(ConfigError, match=f"Optuna's storage holds at most {OPTUNA_NAME_MAX}"):
        load_launch({"study": "x" * (OPTUNA_NAME_MAX + 1), "no_tracking": True})


def test_study_name_limits_are_the_installed_stores_columns() -> None:
    """The bet on the libraries' schemas: fails when Optuna or MLflow widen or narrow the columns."""
    from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlRun
    from optuna.storages._rdb.models import StudyModel

    assert StudyModel.__table__.c.study_name.type.length == OPTUNA_NAME_MAX
    assert SqlRun.__table__.c.name.type.length == MLFLOW_NAME_MAX + len("-launch")
    assert SqlExperiment.__table__.c.name.type.length >= MLFLOW_NAME_MAX


def test_a_600_character_study_is_one_line_naming_the_length_not_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "--study", "s" * 600, "--storage", "postgresql+psycopg2://u@127.0.0.1:1/optuna"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is 600 characters long" in err[0] and "cannot reach" not in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_report_refuses_a_study_name_with_a_control_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _study(tmp_path, "s")
    assert main(["report", "--study", "s\n", "--storage", f"sqlite:///{tmp_path / 't.db'}", "--no-tracking",
                 "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tuner: error: --study 's\\n': holds the control character '\\n' at position 1; a study name is "
                   "one line of printable text: choose another"]
