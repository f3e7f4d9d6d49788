"""Launch config: flags, launch YAML and environment merged and validated once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config import load_launch, redact
from tuner.errors import ConfigError


def test_load_launch_defaults_are_the_embedded_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = load_launch({})
    assert config.model == "iterated_mlp"
    assert config.storage == "sqlite:///tuner.db"
    assert config.tracking_uri == "sqlite:///mlflow.db"
    assert config.out == "best_config.yaml"
    assert config.address is None
    assert config.space_path is not None and config.space_path.name == "iterated_mlp.yaml"


def test_load_launch_env_tracking_uri_is_honoured_and_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert load_launch({}).tracking_uri == "http://127.0.0.1:5999"
    assert load_launch({"tracking_uri": "sqlite:///x.db"}).tracking_uri == "sqlite:///x.db"


def test_load_launch_yaml_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "launch.yaml"
    file.write_text("trials: 5\nsteps: 50\ncpus-per-trial: 2\n")
    config = load_launch({"steps": 70, "trials": None}, str(file))
    assert (config.trials, config.steps, config.threads) == (5, 70, 2)


def test_load_launch_unknown_key_is_rejected(tmp_path: Path) -> None:
    file = tmp_path / "launch.yaml"
    file.write_text("trails: 5\n")
    with pytest.raises(ConfigError, match=r"launch\.yaml: trails: Extra inputs are not permitted"):
        load_launch({}, str(file))


def test_load_launch_bad_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="seeds: Input should be greater than or equal to 1"):
        load_launch({"seeds": 0})


def test_redact_hides_passwords_only() -> None:
    assert redact("postgresql://tuner:s3cret@db:5432/optuna") == "postgresql://tuner:***@db:5432/optuna"
    assert redact("sqlite:///tuner.db") == "sqlite:///tuner.db"
    assert "s3cret" not in redact("http://u:s3cret@host/")


def test_load_launch_unknown_pruner_names_the_choices(tmp_path: Path) -> None:
    """A launch file's misspelt pruner says which names it takes (the flag's argparse choices do the same)."""
    file = tmp_path / "launch.yaml"
    file.write_text("pruner: firstseed\n")
    choices = r"'none', 'behind', 'first-seed', 'median' or 'asha'"
    with pytest.raises(ConfigError, match=rf"pruner: Input should be {choices}"):
        load_launch({}, str(file))
    assert load_launch({}).pruner == "first-seed"
