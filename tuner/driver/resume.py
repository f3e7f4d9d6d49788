"""A launch that finds its study in the storage: is it this launch's to continue, is it done already,
does ``--out`` hold another study's answer. Every check here reads and creates nothing, and runs
before the cluster, the study or any MLflow run is made (tuner.driver.launch).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.config import LaunchConfig, redact
from tuner.driver.liveness import counted
from tuner.errors import ConfigError
from tuner.spaces import SearchSpace

if TYPE_CHECKING:
    import optuna


def existing_study(config: LaunchConfig) -> optuna.Study | None:
    """The study of ``config`` if its storage holds it, else None; read only: nothing is created."""
    import optuna

    if config.storage.startswith("sqlite:///") and not Path(config.storage.removeprefix("sqlite:///")).is_file():
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        if config.study_name not in optuna.study.get_all_study_names(config.storage):
            return None
        return optuna.load_study(study_name=config.study_name, storage=config.storage)
    except Exception:  # the launch opens the storage itself and says what is wrong
        return None


def check_owner(config: LaunchConfig, space: SearchSpace) -> None:
    """Refuse to continue a study that was created for another model or space, or searched at
    another ``--steps`` (unless ``--allow-steps-change``): TPE would mix them, and best_config.yaml
    would label one model's config with another's name. Read only.

    Raises:
        ConfigError: naming what differs and the flag that starts a new study.
    """
    from tuner.driver import studyrecord

    study = existing_study(config)
    recorded = studyrecord.owner(study) if study is not None else None
    if recorded is None:
        return
    differs = studyrecord.mismatch(recorded, config.model, studyrecord.space_signature(space), config.steps,
                                   config.allow_steps_change)
    if differs:
        raise ConfigError(f"--study {config.study_name}: the study on {redact(config.storage)} {differs}; "
                          "pass --study NEW_NAME to start a new study for this launch")


def finished_study(config: LaunchConfig) -> optuna.Study | None:
    """The study of ``config`` if it already holds ``--trials`` finished trials, none running, and
    its export chosen (or no verification asked): the same command run again; else None. Read
    only: nothing is created."""
    import optuna

    from tuner.driver import studyrecord
    from tuner.driver.verify import candidates

    study = existing_study(config)
    if study is None:
        return None
    trials = study.get_trials(deepcopy=False)
    if counted(trials) < config.trials or any(t.state == optuna.trial.TrialState.RUNNING for t in trials):
        return None
    if config.verify_seeds <= 0 or not candidates(study, 0):
        return study
    chosen = studyrecord.choice(study)  # verified as this command asks, margin included?
    verified = studyrecord.verifications(study).get(chosen.trial) if chosen else None
    if chosen is None or verified is None or (len(verified.seeds), verified.steps, verified.min_survival) != (
            config.verify_seeds, config.verification_steps, config.min_survival):
        return None
    return None if config.margin and chosen.met and chosen.trial not in studyrecord.margins(study) else study


def warn_overwrite(config: LaunchConfig, say: Callable[[str], object] = print) -> None:
    """Warn before this launch's best config overwrites the one another study wrote to ``--out``."""
    from tuner.config import read_yaml

    path = Path(config.out)
    try:
        held = read_yaml(path, "best config") if path.is_file() else None
        other = held["study"]["name"] if isinstance(held, dict) else None
    except (ConfigError, KeyError, TypeError):
        return
    if other and other != config.study_name:
        say(f"warning: {path} holds study {other!r}'s best config; this launch of study "
            f"{config.study_name!r} will overwrite it (pass --out to keep both)")
