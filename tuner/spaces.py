"""Search spaces: a YAML file, validated once against the model's knobs, suggested via Optuna.

A space file looks like this (every key but ``params`` is optional)::

    model: iterated_mlp
    params:
      learning_rate: {low: 1.0e-5, high: 1.0e-2, log: true}
      clip_norm: {low: 0.5, high: 50.0, log: true, nullable: true}   # may also be "no clipping"
      max_iter: {low: 4, high: 20}
      bn_order: {choices: [relu_bn, bn_relu]}
      hidden: 32                                                       # fixed, not searched

A knob left out keeps its default. ``nullable: true`` adds the null value (no clipping, no L2,
no guard) to a range: Optuna then also suggests ``use_<name>`` (true/false).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.config import read_yaml
from tuner.errors import ConfigError
from tuner.knobs import TUNER_KNOBS
from tuner.models.base import Knob
from tuner.records import TrainConfig

__all__ = ["TUNER_KNOBS", "Param", "SearchSpace", "config_from_flat", "default_space", "load_space", "space_from"]

_RANGE_KEYS = {"low", "high", "log", "nullable"}
_CHOICE_KEYS = {"choices"}


@dataclass(frozen=True)
class Param:
    """How one knob is searched: a range, a set of choices, or a fixed value."""

    name: str
    knob: Knob
    low: float | None = None
    high: float | None = None
    log: bool = False
    nullable: bool = False
    choices: tuple[Any, ...] = ()
    fixed: bool = False
    value: Any = None

    def suggest(self, trial: Any) -> Any:
        """The value of this knob for an Optuna trial (fixed values are not suggested)."""
        if self.fixed:
            return self.value
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        # both parts are always suggested, so the space stays static for multivariate TPE
        use = trial.suggest_categorical(f"use_{self.name}", [True, False]) if self.nullable else True
        assert self.low is not None and self.high is not None  # a range always has both (see _range)
        if self.knob.kind == "int":
            number: Any = trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        else:
            number = trial.suggest_float(self.name, self.low, self.high, log=self.log)
        return number if use else None


@dataclass(frozen=True)
class SearchSpace:
    """Every knob of a launch (tuner's and the model's), each with its :class:`Param`."""

    model: str
    params: Mapping[str, Param]

    def suggest(self, trial: Any) -> TrainConfig:
        """Ask Optuna for one point of the space."""
        return self.config({name: p.suggest(trial) for name, p in self.params.items()})

    def config(self, values: Mapping[str, Any]) -> TrainConfig:
        """Turn one value per knob into a TrainConfig (null L2 weight means 0)."""
        return config_from_flat(values)

    def searched(self) -> list[str]:
        """Names of the knobs that are searched (not fixed)."""
        return [name for name, p in self.params.items() if not p.fixed]


def config_from_flat(values: Mapping[str, Any]) -> TrainConfig:
    """A TrainConfig from one flat mapping of knob values (tuner's knobs default when left out)."""
    return TrainConfig.from_flat(values)


def load_space(path: str | Path, model: str, knobs: Mapping[str, Knob]) -> SearchSpace:
    """Read and validate a space file for ``model`` (whose own knobs are ``knobs``).

    Raises:
        ConfigError: naming the file and the key, for anything that is not a valid space.
    """
    where = str(path)
    raw = read_yaml(path, "search space")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with a 'params' key")
    unknown = set(raw) - {"model", "params", "description"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid: model, params, description")
    if raw.get("model") not in (None, model):
        raise ConfigError(
            f"{where}: model: the space is for {raw['model']!r} but the launch uses {model!r}"
        )
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: params: expected a mapping of knob name -> range")
    return space_from(params, model, knobs, where)


def space_from(
    params: Mapping[str, Any], model: str, knobs: Mapping[str, Knob], where: str
) -> SearchSpace:
    """Validate ``params`` (knob name -> spec) and fill the knobs left out with their defaults."""
    all_knobs = {**TUNER_KNOBS, **knobs}
    for name in params:
        if name not in all_knobs:
            raise ConfigError(
                f"{where}: params.{name}: {name!r} is not a knob of model {model!r}; "
                f"valid knobs: {', '.join(all_knobs)}"
            )
    parsed = {
        name: _param(f"{where}: params.{name}", name, knob, params[name])
        if name in params
        else Param(name, knob, fixed=True, value=knob.default)
        for name, knob in all_knobs.items()
    }
    return SearchSpace(model, parsed)


def default_space(model: str, knobs: Mapping[str, Knob]) -> SearchSpace:
    """A space from the knobs' own ranges, for a model that ships no space file."""
    params: dict[str, Any] = {"learning_rate": {"low": 1e-5, "high": 1e-1, "log": True}}
    for name, knob in knobs.items():
        if knob.kind == "categorical":
            params[name] = {"choices": list(knob.choices)}
        elif knob.kind == "bool":
            params[name] = {"choices": [True, False]}
        else:
            wide = knob.low is not None and knob.low > 0 and knob.high / knob.low >= 100  # type: ignore[operator]
            params[name] = {"low": knob.low, "high": knob.high, "log": wide, "nullable": knob.nullable}
    return space_from(params, model, knobs, f"<knob ranges of {model}>")


def _param(where: str, name: str, knob: Knob, spec: Any) -> Param:
    """Validate one knob's entry: a fixed value, a range or a list of choices."""
    if not isinstance(spec, dict):
        problem = knob.problem(spec)
        if problem:
            raise ConfigError(f"{where}: fixed value {spec!r}: {problem} (valid: {knob.describe()})")
        return Param(name, knob, fixed=True, value=spec)
    keys = set(spec)
    if keys - (_RANGE_KEYS | _CHOICE_KEYS) or (keys & _CHOICE_KEYS and keys & _RANGE_KEYS):
        raise ConfigError(
            f"{where}: unknown or mixed keys {sorted(keys)}; use low/high/log/nullable "
            "for a range or choices for a list"
        )
    if "choices" in spec:
        return _choices(where, name, knob, spec["choices"])
    return _range(where, name, knob, spec)


def _choices(where: str, name: str, knob: Knob, choices: Any) -> Param:
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}: choices: expected a non-empty list")
    for choice in choices:
        problem = knob.problem(choice)
        if problem:
            raise ConfigError(f"{where}: choice {choice!r}: {problem} (valid: {knob.describe()})")
    if len(set(map(repr, choices))) == 1:  # one choice is a fixed value: not searched, and the preflight checks it
        return Param(name, knob, fixed=True, value=choices[0])
    return Param(name, knob, choices=tuple(choices))


def _range(where: str, name: str, knob: Knob, spec: Mapping[str, Any]) -> Param:
    if knob.kind not in ("float", "int"):
        raise ConfigError(f"{where}: a {knob.kind} knob takes choices, not a range")
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"{where}: a range needs both low and high")
    low, high = spec["low"], spec["high"]
    for key, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
        problem = knob.problem(value)
        if problem:
            raise ConfigError(f"{where}.{key}: {value!r} is {problem} (valid: {knob.describe()})")
    if low >= high:
        raise ConfigError(f"{where}: low ({low}) must be below high ({high}); to fix a value, write it alone")
    log, nullable = spec.get("log", False), spec.get("nullable", False)
    if not isinstance(log, bool) or not isinstance(nullable, bool):
        raise ConfigError(f"{where}: log and nullable must be true or false")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0 (got {low}); use nullable: true for 'none'")
    if nullable and not knob.nullable:
        raise ConfigError(f"{where}.nullable: knob {name!r} cannot be null")
    return Param(name, knob, low=low, high=high, log=log, nullable=nullable)
