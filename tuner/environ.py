"""Every environment variable tuner reads or sets, in one place (no other module touches
``os.environ``; tests/test_layout.py checks it).

What tuner reads:

- ``TUNER_STORAGE``, ``MLFLOW_TRACKING_URI``: the Optuna storage and MLflow tracking URI when no flag
  gives them (:func:`storage`, :func:`tracking_uri`), so a password can stay out of argv.
- ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN`` and libpq's ``PGPASSWORD``: only to know
  which secrets to mask in what tuner prints (:func:`tracking_credentials`, :func:`pgpassword`).
- ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH`` (:func:`ray_token_given`), ``RAY_TMPDIR``
  (:func:`ray_tmpdir`), ``CUDA_VISIBLE_DEVICES`` on a worker (:func:`cuda_visible_devices`).
- tuner's own ``TUNER_*`` variables that ship a model to the workers in Ray's runtime env
  (:func:`shipping_object`, :func:`shipped_object`, :func:`shipping_file`, :func:`shipped_file`).

What tuner sets, each only as a default (a value already in the environment is kept):
:func:`prepare_process` (Ray's token authentication on; TF, Ray quiet), :func:`quiet_mlflow`,
:func:`mlflow_fail_fast` and :func:`worker_tensorflow`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

LEGACY_KERAS = "TF_USE_LEGACY_KERAS"  # read by TensorFlow once, at import (tuner.worker.actor.use_legacy_keras)
SHIPPED_FILE = "TUNER_SHIPPED_MODEL"  # a worker's model file came in Ray's runtime env (its path)
OBJECT_SPEC, OBJECT_MODEL = "TUNER_OBJECT_SPEC", "TUNER_OBJECT_MODEL"  # a model class/instance shipped pickled

# Ray reads these at import: token authentication on; an embedded cluster without usage-stats
# reporting and metrics collection (it starts sooner and its agents use less CPU beside the trials,
# BENCHMARKS.md); every worker's log line kept; TensorFlow's C++ INFO/WARNING lines off.
PROCESS_DEFAULTS: Mapping[str, str] = {
    "RAY_AUTH_MODE": "token",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_enable_metrics_collection": "0",
}


def _defaults(values: Mapping[str, str]) -> None:
    for name, value in values.items():
        os.environ.setdefault(name, value)


def _get(name: str) -> str | None:
    """``$name``, None if unset or empty."""
    return os.environ.get(name) or None


def prepare_process() -> None:
    """Set :data:`PROCESS_DEFAULTS`: call it before Ray or TensorFlow is imported."""
    _defaults(PROCESS_DEFAULTS)


def quiet_mlflow() -> None:
    """No lines from MLflow's loggers (it reads ``MLFLOW_LOGGING_LEVEL`` when imported) nor its
    "View run ... at: URL" lines, which it prints itself for each run that ends over HTTP."""
    _defaults({"MLFLOW_LOGGING_LEVEL": "CRITICAL", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"})


def mlflow_fail_fast() -> None:
    """MLflow's HTTP client without retries and with a 10 s timeout (its defaults retry for minutes)."""
    _defaults({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"})


def worker_tensorflow() -> None:
    """Before a process imports TensorFlow: Keras 2 (``tf-keras``, which ``tf.compat.v1.layers``
    needs) and TF's C++ logging quiet."""
    _defaults({LEGACY_KERAS: "1", "TF_CPP_MIN_LOG_LEVEL": "2"})


def storage() -> str | None:
    """``$TUNER_STORAGE``: the Optuna storage URL, kept out of argv."""
    return _get("TUNER_STORAGE")


def tracking_uri() -> str | None:
    """``$MLFLOW_TRACKING_URI``."""
    return _get("MLFLOW_TRACKING_URI")


def tracking_credentials() -> tuple[str | None, str | None, str | None]:
    """``(username, password, token)`` from ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``."""
    return _get("MLFLOW_TRACKING_USERNAME"), _get("MLFLOW_TRACKING_PASSWORD"), _get("MLFLOW_TRACKING_TOKEN")


def pgpassword() -> str | None:
    """libpq's ``$PGPASSWORD``."""
    return _get("PGPASSWORD")


def ray_token_given() -> bool:
    """Whether Ray's token comes from the environment (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``)."""
    return bool(_get("RAY_AUTH_TOKEN") or _get("RAY_AUTH_TOKEN_PATH"))


def ray_tmpdir() -> str | None:
    """``$RAY_TMPDIR``: where Ray's session folders go."""
    return _get("RAY_TMPDIR")


def cuda_visible_devices() -> str:
    """The GPUs a worker sees (Ray sets ``CUDA_VISIBLE_DEVICES`` per actor); "" when none."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def shipping_object(spec: str, pickled: str) -> dict[str, str]:
    """The runtime env variables that carry a pickled model (base64 text) to the workers."""
    return {OBJECT_SPEC: spec, OBJECT_MODEL: pickled}


def shipped_object(spec: str) -> str | None:
    """On a worker: the pickled model (base64 text) shipped for ``spec``, if any."""
    return _get(OBJECT_MODEL) if os.environ.get(OBJECT_SPEC) == spec else None


def shipping_file(where: str) -> dict[str, str]:
    """The runtime env variable that tells a worker its model file ``where`` came with the job."""
    return {SHIPPED_FILE: where}


def shipped_file(where: str) -> bool:
    """On a worker: whether model file ``where`` came in Ray's runtime env."""
    return os.environ.get(SHIPPED_FILE) == where
