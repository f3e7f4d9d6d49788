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


class Interrupted(TunerError):
    """Ctrl-C stopped a launch; the message says what the study kept and what will be rerun."""

    exit_code = 130
