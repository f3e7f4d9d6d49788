"""Errors that stop a launch with a message saying what is wrong and how to fix it.

A diverged trial is not an error: it is an outcome (see ``tuner.records``). These exceptions are
for input the user can fix (a search space, a model spec, a flag) and for services that cannot be
reached. The CLI prints their message without a traceback and exits non-zero.
"""

from __future__ import annotations


class TunerError(Exception):
    """Base of every error tuner reports to the user as a one-line message."""

    exit_code = 2  # the CLI's exit status: 2 is bad input


class NoTrialFinished(TunerError):
    """Every trial of the study failed: nothing to export (the study and its runs are kept)."""

    exit_code = 4


class ConfigError(TunerError, ValueError):
    """A flag, a launch YAML or a search-space YAML is invalid."""


class ModelError(TunerError, ValueError):
    """A model spec cannot be loaded, or the model breaks the contract."""


class DataError(TunerError):
    """The preflight found broken training data."""


class ClusterError(TunerError):
    """The Ray cluster cannot be reached or cannot host the requested resources."""


class TrackingError(TunerError):
    """The MLflow tracking server cannot be reached."""


class OutputError(TunerError):
    """A file tuner writes (best_config.yaml, a plot) could not be written: a full disk, a folder
    that went away or became read-only. The earlier file is unchanged (``tuner.atomic``) and the
    study is kept: the same command, or ``tuner report``, writes it again."""

    exit_code = 6


class Interrupted(TunerError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) stopped a launch; the message says what the study kept
    and what will be rerun. The exit status is 128 + the signal: 130, 143, 129."""

    exit_code = 130

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code
