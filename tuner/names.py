"""Study names are data, not paths.

A study name comes from the user (``--study``, the launch YAML) or from a model's name, and it is
used in two ways: as a key in the stores (Optuna's study, MLflow's experiment and launch run), and
in file names (the plots ``<study>_stability_map.png``). :func:`file_safe` makes any name one plain
file name, so "../../x" cannot write two folders up; :func:`study_name_problem` says why a name the
stores cannot hold (a control character, too many characters) is refused, before anything is made.
"""

from __future__ import annotations

import re
import unicodedata


def file_safe(name: str) -> str:
    """``name`` (a study or model name: data) as one plain file name: every run of characters
    other than letters, digits, ``_``, ``.`` and ``-`` becomes ``_``, and leading dots go, so that
    no name is hidden, ``.`` or ``..``, or holds a separator ("../../x" -> "_.._x")."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).lstrip(".") or "_"


# The longest study name the stores hold, in characters (PostgreSQL and MySQL refuse a longer one,
# SQLite stores it): Optuna's studies.study_name is String(MAX_INDEXED_STRING_LENGTH = 512)
# (optuna/storages/_rdb/models.py); MLflow's experiments.name is String(256) and its runs.name
# String(250) (mlflow/store/tracking/dbmodels/models.py), which holds the launch run "<study>-launch".
OPTUNA_NAME_MAX = 512
MLFLOW_NAME_MAX = 250 - len("-launch")
_CONTROL = ("Cc", "Cf", "Zl", "Zp")  # Unicode categories: control, invisible format, line/paragraph separators


def study_name_problem(name: str, tracking: bool = True) -> str | None:
    """What makes ``name`` unusable as a study name (None: nothing): a control character (a
    newline, an escape, a bidi override), or more characters than the stores hold (Optuna's study
    name; MLflow's experiment and launch-run names when ``tracking``)."""
    bad = next((i for i, c in enumerate(name) if unicodedata.category(c) in _CONTROL), None)
    if bad is not None:
        return (f"{_shown(name)}: holds the control character {name[bad]!a} at position {bad}; a study name "
                "is one line of printable text: choose another")
    limit, store = (MLFLOW_NAME_MAX, "the MLflow tracking store") if tracking else (OPTUNA_NAME_MAX, "Optuna's storage")
    if len(name) > limit:
        return f"{_shown(name)}: is {len(name)} characters long; {store} holds at most {limit}: choose a shorter name"
    return None


def _shown(name: str) -> str:
    return ascii(name if len(name) <= 40 else name[:40] + "...")
