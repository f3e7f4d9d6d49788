"""The launch config: CLI flags and an optional launch YAML, validated once into LaunchConfig;
the flags of ``verify`` and ``check-model`` likewise (:class:`VerifyOptions`,
:class:`CheckModelOptions`: every count in range before anything is read or started).

Precedence: a flag given on the command line beats the launch YAML, which beats the environment
(``TUNER_STORAGE``, ``MLFLOW_TRACKING_URI``), which beats the defaults below. Environment
variables are read here and nowhere else.

Credentials never need to be on the command line (where ``ps`` shows them): a storage URL can come
from ``TUNER_STORAGE``; libpq reads a PostgreSQL password from ``PGPASSWORD`` or a mode-600
``~/.pgpass`` (``PGPASSFILE``) for a URL without one; MLflow's HTTP client reads
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (or ``~/.mlflow/credentials``, or
``MLFLOW_TRACKING_TOKEN``). :func:`environment_secrets` lists every such password, for masking.
"""

from __future__ import annotations

import configparser
import contextlib
import re
import sys
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner import environ
from tuner.errors import ConfigError
from tuner.names import file_safe, study_name_problem


def _spaces_dir() -> Path:
    """The shipped search spaces: the repo's folder, or their copy inside an installed wheel."""
    repo = Path(__file__).resolve().parent.parent / "search_spaces"
    return repo if repo.is_dir() else Path(__file__).resolve().parent / "search_spaces"


SPACES_DIR = _spaces_dir()
# the --pruner names, in the order they are listed; tuner.driver.pruning.PRUNERS gives each its entry
PrunerName = Literal["none", "behind", "first-seed", "median", "asha"]


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
    pruner: PrunerName = "first-seed"
    grace_period: int = Field(30, ge=2, le=86400)
    placement_timeout: float = Field(120.0, ge=1.0, le=86400.0)
    graph_reuse: bool = True
    run_timeout: float | None = Field(None, gt=0, le=7 * 86400)
    allow_steps_change: bool = False  # continue a study searched at another --steps (best_config.yaml records both)

    @model_validator(mode="after")
    def _check(self) -> LaunchConfig:
        if self.gpus_per_trial > 1 and not float(self.gpus_per_trial).is_integer():
            raise ValueError("gpus_per_trial above 1 must be a whole number")
        problem = study_name_problem(self.study, tracking=not self.no_tracking) if self.study else None
        if problem:
            raise ValueError(f"--study {problem}")
        return self

    @property
    def study_name(self) -> str:
        """The study's name: ``--study``, or the model's name."""
        return self.study or file_safe(self.model.rpartition(":")[2] or self.model)

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


def load_launch(flags: dict[str, Any], config_file: str | None = None, where: str = "command line") -> LaunchConfig:
    """Merge the launch YAML, the environment and the flags given; validate once. ``where`` names
    the flags' source in a message (``tuner.launch()`` for the Python API).

    Raises:
        ConfigError: naming the file (or flag) and the key that is wrong.
    """
    values: dict[str, Any] = {}
    if config_file:
        values.update(_read_yaml(config_file))
        where = config_file
    if "tracking_uri" not in values and environ.tracking_uri():
        values["tracking_uri"] = environ.tracking_uri()
    if "storage" not in values and environ.storage():
        values["storage"] = environ.storage()
    values.update({k: v for k, v in flags.items() if v is not None})
    try:
        config = LaunchConfig(**values)
    except ValidationError as exc:
        problems = "; ".join(_launch_problem(e) for e in exc.errors())
        raise ConfigError(f"{where}: {problems}") from None
    if config.tracking_uri is None and not config.no_tracking:
        config = config.model_copy(update={"tracking_uri": "sqlite:///mlflow.db"})
    return config


def _launch_problem(error: Any) -> str:
    """``key: message`` from a pydantic error (a whole-config check's message alone)."""
    msg = str(error["msg"]).removeprefix("Value error, ")
    return f"{'.'.join(map(str, error['loc']))}: {msg}" if error["loc"] else msg


def read_yaml(path: str | Path, what: str) -> Any:
    """A YAML file, loaded safely.

    Every way the parser can fail is one :class:`ConfigError`: a file nested deeper than Python's
    recursion limit (PyYAML's loader recurses per level: 50,000 ``[`` was a 2,992-line traceback),
    and a value its constructors refuse (``2001-13-45`` as a date: ``ValueError``).

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
    except RecursionError:
        raise ConfigError(f"{path}: the {what} is nested too deeply to read (over "
                          f"{sys.getrecursionlimit()} levels); write it flat") from None
    except Exception as exc:  # a constructor's own error: a date out of range, an odd tag's value
        raise ConfigError(f"{path}: not valid YAML: {type(exc).__name__}: {' '.join(str(exc).split())}") from exc


def _read_yaml(path: str) -> dict[str, Any]:
    raw = read_yaml(path, "launch config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of launch settings")
    return {k.replace("-", "_"): v for k, v in raw.items()}


def redact(url: str | None) -> str:
    """A URL with its password (``user:secret@``) replaced, safe to print or write."""
    if url is None:
        return "none"
    return re.sub(r"(//[^/:@]+:)[^/@]+@", r"\1***@", url)


DEFAULT_STORAGE = "sqlite:///tuner.db"


def storage_url(flag: str | None) -> str:
    """The storage of a command without a launch YAML: ``--storage``, else ``$TUNER_STORAGE``, else the default."""
    return flag or environ.storage() or DEFAULT_STORAGE


def tracking_credentials() -> tuple[str | None, str | None, str | None]:
    """The credentials MLflow's HTTP client sends when the tracking URI holds none, as it finds
    them (``mlflow.utils.credentials``): ``(username, password, token)``, each from
    ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``, the first two else from the
    ``[mlflow]`` section of ``~/.mlflow/credentials``."""
    file_user = file_password = None
    path = Path("~/.mlflow/credentials").expanduser()
    if path.is_file():
        parser = configparser.ConfigParser(interpolation=None)
        with contextlib.suppress(configparser.Error, OSError, UnicodeDecodeError):  # MLflow's own read fails too
            parser.read(path, encoding="utf-8")
        if parser.has_section("mlflow"):
            file_user = parser["mlflow"].get("mlflow_tracking_username")
            file_password = parser["mlflow"].get("mlflow_tracking_password")
    user, password, token = environ.tracking_credentials()
    return user or file_user, password or file_password, token


def environment_secrets() -> list[str]:
    """Every password tuner or the libraries it drives may take from the environment: libpq's
    ``PGPASSWORD``, MLflow's tracking password and token, and the passwords inside
    ``$TUNER_STORAGE`` and ``$MLFLOW_TRACKING_URI`` (registered with ``tuner.masking``)."""
    from tuner.masking import password_of

    _, password, token = tracking_credentials()
    found = [environ.pgpassword(), password, token,
             password_of(environ.storage()), password_of(environ.tracking_uri())]
    return [secret for secret in found if secret]


MAX_VERIFY_SEEDS = 10_000  # 10,000/10,000 survivors bound the rate above 0.9996: more seeds change no verdict
MAX_STEPS = 10_000_000  # steps of one run: months of training at a few ms a step
MAX_CHECK_STEPS = 10_000  # check-model checks the contract; a few steps suffice


class VerifyOptions(BaseModel):
    """``tuner verify``'s flags, validated at once, before any file is read or cluster started."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    config: str
    seeds: int = Field(16, ge=1, le=MAX_VERIFY_SEEDS)
    steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    model: str | None = None
    trust_file_model: bool = False
    min_survival: float = Field(0.8, ge=0.0, le=1.0)
    seed: int | None = None
    fail_fast: bool = False
    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)
    cpus_per_trial: float = Field(1.0, gt=0)
    gpus_per_trial: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> VerifyOptions:
        if self.gpus_per_trial > 1 and not float(self.gpus_per_trial).is_integer():
            raise ValueError("--gpus-per-trial above 1 must be a whole number")
        return self


class CheckModelOptions(BaseModel):
    """``tuner check-model``'s arguments, validated at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: str
    steps: int = Field(5, ge=1, le=MAX_CHECK_STEPS)


Options = TypeVar("Options", bound=BaseModel)


def load_options(kind: type[Options], flags: dict[str, Any]) -> Options:
    """``flags`` (a command's parsed arguments; those ``kind`` lacks are ignored) as ``kind``.

    Raises:
        ConfigError: one line naming each flag that is out of range and its bound.
    """
    try:
        return kind(**{name: value for name, value in flags.items() if name in kind.model_fields})
    except ValidationError as exc:
        raise ConfigError("; ".join(_flag_problem(error) for error in exc.errors())) from None


def _flag_problem(error: Any) -> str:
    """``--seeds 100000000: input should be less than or equal to 10000`` from a pydantic error."""
    msg = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return msg
    flag = "--" + str(error["loc"][0]).replace("_", "-")
    return f"{flag} {error['input']}: {msg[:1].lower()}{msg[1:]}"
