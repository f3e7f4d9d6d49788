"""What a study keeps beyond its trials: its seed stream, verifications, margin, choice, compute.

Stored as Optuna study user attrs (JSON), written only by the driver, read by export and report.
A finished Optuna trial cannot take new user attrs, and a config is verified after its trial was
told, so the verification of trial ``n`` lives on the study under ``tuner.verified.<n>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.driver.evidence import Choice, Margin, SeedStream, Verification

SEED_BASE = "tuner.seed_base"
VERIFIED = "tuner.verified."
MARGIN = "tuner.margin."
CHOICE = "tuner.choice"
COMPUTE = "tuner.compute"


def seed_stream(study: Any, seed: int | None) -> SeedStream:
    """The study's seed stream: the recorded one, or a new one recorded now."""
    base = study.user_attrs.get(SEED_BASE)
    if base is None:
        stream = SeedStream.new(seed)
        study.set_user_attr(SEED_BASE, stream.base)
        return stream
    return SeedStream(int(base))


def save_verification(study: Any, trial: int, verification: Verification) -> None:
    """Record the verification of ``trial``'s config."""
    study.set_user_attr(f"{VERIFIED}{trial}", verification.to_dict())


def verifications(study: Any) -> dict[int, Verification]:
    """Trial number -> its config's verification."""
    return {int(k.removeprefix(VERIFIED)): Verification.from_dict(v)
            for k, v in study.user_attrs.items() if k.startswith(VERIFIED)}


def save_margin(study: Any, trial: int, margin: Margin) -> None:
    """Record the learning-rate margin of ``trial``'s config."""
    study.set_user_attr(f"{MARGIN}{trial}", margin.to_dict())


def margins(study: Any) -> dict[int, Margin]:
    """Trial number -> its config's margin."""
    return {int(k.removeprefix(MARGIN)): Margin.from_dict(v)
            for k, v in study.user_attrs.items() if k.startswith(MARGIN)}


def save_choice(study: Any, choice: Choice) -> None:
    """Record which trial the selection rule chose, and the rule."""
    study.set_user_attr(CHOICE, {"trial": choice.trial, "met": choice.met, "rule": choice.rule})


def choice(study: Any) -> Choice | None:
    """The recorded choice, if a launch made one."""
    doc = study.user_attrs.get(CHOICE)
    return None if doc is None else Choice(int(doc["trial"]), bool(doc["met"]), str(doc["rule"]))


def add_compute(study: Any, compute: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Add a launch's runs and steps per phase to the study's totals; return the totals."""
    total: dict[str, dict[str, float]] = {k: dict(v) for k, v in study.user_attrs.get(COMPUTE, {}).items()}
    for phase, counts in compute.items():
        into = total.setdefault(phase, {})
        for key, value in counts.items():
            into[key] = into.get(key, 0) + value
    study.set_user_attr(COMPUTE, total)
    return total
