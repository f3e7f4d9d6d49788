"""A damaged store or a YAML the parser cannot take: one line, exit 2, before anything is created."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.test_targets import _KILLED_WRITER  # a writer SIGKILLed mid-transaction
from tuner.cli import MAX_MESSAGE, main, one_line
from tuner.config import read_yaml
from tuner.driver.targets import check_database, check_sqlite_intact
from tuner.errors import ConfigError


def optuna_db(path: Path, trials: int = 40) -> Path:
    """A real Optuna SQLite storage holding study 's' with ``trials`` finished trials."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{path}")
    for _ in range(trials):
        trial = study.ask()
        study.tell(trial, trial.suggest_float("x", 0.0, 1.0))
    return path


def truncated(good: Path, path: Path) -> Path:
    """``good`` cut to half its size: SQLite's header intact, its pages gone."""
    shutil.copy(good, path)
    with path.open("r+b") as file:
        file.truncate(path.stat().st_size // 2)
    return path


def corrupted(good: Path, path: Path) -> Path:
    """``good`` with its third page overwritten: the size and header as they were."""
    shutil.copy(good, path)
    with path.open("r+b") as file:
        file.seek(2 * 4096)
        file.write(b"\xa5" * 4096)
    return path


@pytest.fixture(scope="module")
def good_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return optuna_db(tmp_path_factory.mktemp("good") / "t.db")


@pytest.mark.parametrize("damage", [truncated, corrupted])
def test_check_database_refuses_a_damaged_sqlite_file_and_changes_nothing(
    good_db: Path, tmp_path: Path, damage: object
) -> None:
    bad = damage(good_db, tmp_path / "t.db")  # type: ignore[operator]
    before = (sorted(tmp_path.iterdir()), bad.read_bytes())
    damaged = r"^--storage sqlite:///.*t\.db is damaged \(SQLite's quick_check: "
    with pytest.raises(ConfigError, match=damaged) as raised:
        check_database(f"sqlite:///{bad}", "--storage")
    assert "restore it from a backup, or point --storage at a new file" in str(raised.value)
    assert (sorted(tmp_path.iterdir()), bad.read_bytes()) == before  # read only: no journal, no change
    check_database(f"sqlite:///{good_db}", "--storage")  # an intact one passes


def test_launch_on_a_damaged_storage_or_tracking_db_one_line_exit_2_nothing_created(
    good_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = truncated(good_db, tmp_path / "bad.db")
    monkeypatch.chdir(tmp_path)
    for flags, flag in ((["--storage", f"sqlite:///{bad}"], "--storage"),
                        (["--tracking-uri", f"sqlite:///{bad}"], "--tracking-uri")):
        assert main(["launch", "--no-live", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"tuner: error: {flag} sqlite:///") and "is damaged" in err[0]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.db"]  # no tuner.db, no mlflow.db


def test_report_on_a_damaged_storage_is_one_line_exit_2(
    good_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = truncated(good_db, tmp_path / "bad.db")
    assert main(["report", "--study", "s", "--storage", f"sqlite:///{bad}", "--no-tracking",
                 "--out-dir", str(tmp_path / "plots")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tuner: error: --storage" in err[0] and "is damaged" in err[0]
    assert not (tmp_path / "plots").exists()


def test_check_sqlite_intact_passes_a_file_a_killed_writer_left_with_a_hot_journal(tmp_path: Path) -> None:
    """The journal is the next writer's to roll back; a read-only check must not call the file damaged."""
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "t.db")], check=False)
    assert (tmp_path / "t.db-journal").stat().st_size > 0
    check_sqlite_intact(f"sqlite:///{tmp_path / 't.db'}", "--storage")
    check_database(f"sqlite:///{tmp_path / 't.db'}", "--storage")
    with sqlite3.connect(tmp_path / "t.db") as db:
        assert db.execute("select count(*) from t").fetchone() == (0,)


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 50_000 + "]" * 50_000, "is nested too deeply to read"),
    ("".join(" " * i + "a:\n" for i in range(3000)), "is nested too deeply to read"),
    ("x: 2001-13-45\n", "not valid YAML: ValueError: month must be in 1..12"),
    ("x: !!binary 'not base64 !'\n", "not valid YAML"),
    ("a: [1, 2\n", "not valid YAML"),
])
def test_read_yaml_every_parser_failure_is_one_config_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "launch.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_yaml(path, "launch config")


def test_launch_yaml_nested_50000_deep_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "launch.yaml"
    path.write_text("[" * 50_000 + "]" * 50_000)
    assert main(["launch", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tuner: error: {path}: the launch config is nested too deeply to read (over "
                   f"{sys.getrecursionlimit()} levels); write it flat"]


ALIAS_BOMB = "x: {a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"   , {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcde", "bcdef", strict=True)
) + "}\nparams: {learning_rate: {low: *f}}\n"


def test_a_yaml_alias_bomb_is_refused_in_one_capped_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(ALIAS_BOMB)
    assert main(["launch", "--space", str(space), "--no-tracking", "--storage", f"sqlite:///{tmp_path / 't.db'}",
                 "--out", str(tmp_path / "best.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and len(err[0]) <= len("tuner: error: ") + MAX_MESSAGE, len(err[0])
    assert err[0].startswith(f"tuner: error: {space}: ") and " ... " in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


def test_one_line_caps_a_message_keeping_its_head_and_tail() -> None:
    text = "what is wrong: " + "x" * 400_000 + " the fix: do this"
    shown = one_line(text)
    assert len(shown) == MAX_MESSAGE
    assert shown.startswith("what is wrong: ") and shown.endswith(" the fix: do this") and " ... " in shown
    assert one_line("short\nmessage") == "short message"
