"""The launch config: CLI flags and an optional launch YAML, validated once into LaunchConfig.

Precedence: a flag given on the command line beats the launch YAML, which beats the environment
(``MLFLOW_TRACKING_URI``), which beats the defaults below. Environment variables are read here
and nowhere else.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.errors import ConfigError


def _spaces_dir() -> Path:
    """The shipped search spaces: the repo's folder, or their copy inside an installed wheel."""
    repo = Path(__file__).resolve().parent.parent / "search_spaces"
    return repo if repo.is_dir() else Path(__file__).resolve().parent / "search_spaces"


SPACES_DIR = _spaces_dir()


class LaunchConfig(BaseModel):
    """Everything one ``launch`` needs; unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str = "iterated_mlp"
    space: str | None = None
    trials: int = Field(30, ge=1)
    steps: int = Field(600, ge=1)
    seeds: int = Field(2, ge=1)
    report_every: int = Field(25, ge=1)
    study: str | None = None
    storage: str = "sqlite:///tuner.db"
    tracking_uri: str | None = None
    no_tracking: bool = False
    address: str | None = None
    cpus_per_trial: float = Field(1.0, gt=0)
    gpus_per_trial: float = Field(0.0, ge=0)
    max_concurrent: int | None = Field(None, ge=1)
    max_retries: int = Field(2, ge=0)
    num_cpus: int | None = Field(None, ge=1)
    num_gpus: int | None = Field(None, ge=0)
    sampler: Literal["tpe", "random"] = "tpe"
    seed: int | None = Field(0, ge=0, le=2**32 - 1)  # numpy's seed range
    out: str = "best_config.yaml"
    allow_bad_data: bool = False
    live: bool | None = None
    race_seeds: int = Field(8, ge=0)
    verify_seeds: int = Field(16, ge=0)
    verify_steps: int | None = Field(None, ge=1)
    min_survival: float = Field(0.8, ge=0.0, le=1.0)
    verify_candidates: int = Field(3, ge=1)
    margin: bool = True
    pruner: Literal["none", "behind", "first-seed", "median", "asha"] = "first-seed"
    grace_period: int = Field(30, ge=2, le=86400)
    placement_timeout: float = Field(120.0, ge=1.0, le=86400.0)
    graph_reuse: bool = True

    @model_validator(mode="after")
    def _check(self) -> LaunchConfig:
        if self.gpus_per_trial > 1 and not float(self.gpus_per_trial).is_integer():
            raise ValueError("gpus_per_trial above 1 must be a whole number")
        return self

    @property
    def study_name(self) -> str:
        """The study's name: ``--study``, or the model's name."""
        return self.study or re.sub(r"[^A-Za-z0-9_.-]+", "_", self.model.rpartition(":")[2] or self.model)

    @property
    def space_path(self) -> Path | None:
        """The space file: ``--space``, or the shipped one for a built-in model (None if none)."""
        if self.space:
            return Path(self.space)
        shipped = SPACES_DIR / f"{self.model}.yaml"
        return shipped if shipped.is_file() else None

    @property
    def verification_steps(self) -> int:
        """Steps of a verification run: ``--verify-steps``, else twice ``--steps``."""
        return self.verify_steps or 2 * self.steps

    @property
    def threads(self) -> int:
        """TF threads of one seed run: its CPU share, rounded up."""
        return max(1, int(-(-self.cpus_per_trial // 1)))


def load_launch(flags: dict[str, Any], config_file: str | None = None) -> LaunchConfig:
    """Merge the launch YAML, the environment and the flags given; validate once.

    Raises:
        ConfigError: naming the file (or flag) and the key that is wrong.
    """
    values: dict[str, Any] = {}
    where = "command line"
    if config_file:
        values.update(_read_yaml(config_file))
        where = config_file
    if "tracking_uri" not in values and os.environ.get("MLFLOW_TRACKING_URI"):
        values["tracking_uri"] = os.environ["MLFLOW_TRACKING_URI"]
    values.update({k: v for k, v in flags.items() if v is not None})
    try:
        config = LaunchConfig(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: {problems}") from None
    if config.tracking_uri is None and not config.no_tracking:
        config = config.model_copy(update={"tracking_uri": "sqlite:///mlflow.db"})
    return config


def read_yaml(path: str | Path, what: str) -> Any:
    """A YAML file, loaded safely.

    Raises:
        ConfigError: the file cannot be read, or is not YAML (``what`` names it in the message).
    """
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the {what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc


def _read_yaml(path: str) -> dict[str, Any]:
    raw = read_yaml(path, "launch config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of launch settings")
    return {k.replace("-", "_"): v for k, v in raw.items()}


def prepare_environment() -> None:
    """Environment the libraries read: Ray token auth on; TF's C++ logging quiet.

    An embedded cluster also runs without Ray's usage-stats reporting and metrics collection
    (set either variable to override): with them off it starts about 1 s sooner on 2 cores and
    its agents use less CPU beside the trials (bench/overhead.py, BENCHMARKS.md).
    """
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_enable_metrics_collection", "0")


def redact(url: str | None) -> str:
    """A URL with its password (``user:secret@``) replaced, safe to print or write."""
    if url is None:
        return "none"
    return re.sub(r"(//[^/:@]+:)[^/@]+@", r"\1***@", url)
