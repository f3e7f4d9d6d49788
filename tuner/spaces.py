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
no guard) to a range: Optuna then also suggests ``use_<name>`` (true/false) first, and the value
only when it is true (define-by-run), so a trial's params hold no value it never had. Trials of
studies written before that hold both (``use_clip_norm: false, clip_norm: 0.337``); their config
records (``tuner.driver.trialrecord``) say null, as they always did.

The file is read by ``tuner.config.read_yaml`` (as the launch YAML) and validated by pydantic
models made for the launch's knobs (``tuner.spacefile``); a bad space stops the launch with one
line per problem, each naming the file and the key (``params.max_iter.low: 1: outside the valid
range [2, 30] ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tuner.config import read_yaml
from tuner.errors import ConfigError
from tuner.knobs import TUNER_KNOBS
from tuner.models.base import Knob
from tuner.records import TrainConfig
from tuner.spacefile import ChoiceSpec, RangeSpec, problems, space_file_model

if TYPE_CHECKING:
    import optuna

__all__ = ["TUNER_KNOBS", "Param", "SearchSpace", "config_from_flat", "default_space", "load_space", "space_from"]


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

    def suggest(self, trial: optuna.trial.Trial) -> object:
        """The value of this knob for an Optuna trial (fixed values are not suggested)."""
        if self.fixed:
            return self.value
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        # define-by-run: a switched-off knob has no value, so a trial's params are its effective config
        # (multivariate TPE with ``group=True`` models each set of params that occur together: make_sampler)
        if self.nullable and not trial.suggest_categorical(f"use_{self.name}", [True, False]):
            return None
        assert self.low is not None and self.high is not None  # a range always has both (tuner.spacefile.RangeSpec)
        if self.knob.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)


@dataclass(frozen=True)
class SearchSpace:
    """Every knob of a launch (tuner's and the model's), each with its :class:`Param`."""

    model: str
    params: Mapping[str, Param]

    def suggest(self, trial: optuna.trial.Trial) -> TrainConfig:
        """Ask Optuna for one point of the space."""
        return self.config({name: p.suggest(trial) for name, p in self.params.items()})

    def config(self, values: Mapping[str, object]) -> TrainConfig:
        """Turn one value per knob into a TrainConfig (null L2 weight means 0)."""
        return config_from_flat(values)

    def searched(self) -> list[str]:
        """Names of the knobs that are searched (not fixed)."""
        return [name for name, p in self.params.items() if not p.fixed]


def config_from_flat(values: Mapping[str, object]) -> TrainConfig:
    """A TrainConfig from one flat mapping of knob values (tuner's knobs default when left out)."""
    return TrainConfig.from_flat(values)


def load_space(path: str | Path, model: str, knobs: Mapping[str, Knob]) -> SearchSpace:
    """Read and validate a space file for ``model`` (whose own knobs are ``knobs``).

    Raises:
        ConfigError: naming the file and the key (``params.learning_rate.low``), one line per
            problem, for anything that is not a valid space.
    """
    return _validated(read_yaml(path, "search space"), model, knobs, str(path))


def space_from(
    params: Mapping[str, object], model: str, knobs: Mapping[str, Knob], where: str
) -> SearchSpace:
    """Validate ``params`` (knob name -> spec) and fill the knobs left out with their defaults."""
    return _validated({"params": params}, model, knobs, where)


def default_space(model: str, knobs: Mapping[str, Knob]) -> SearchSpace:
    """A space from the knobs' own ranges, for a model that ships no space file."""
    params: dict[str, object] = {"learning_rate": {"low": 1e-5, "high": 1e-1, "log": True}}
    for name, knob in knobs.items():
        if knob.kind == "categorical":
            params[name] = {"choices": list(knob.choices)}
        elif knob.kind == "bool":
            params[name] = {"choices": [True, False]}
        else:
            wide = knob.low is not None and knob.low > 0 and knob.high / knob.low >= 100  # type: ignore[operator]
            params[name] = {"low": knob.low, "high": knob.high, "log": wide, "nullable": knob.nullable}
    return space_from(params, model, knobs, f"<knob ranges of {model}>")


def _validated(doc: object, model: str, knobs: Mapping[str, Knob], where: str) -> SearchSpace:
    """A space document validated by its pydantic model (``tuner.spacefile``) into a SearchSpace."""
    all_knobs = {**TUNER_KNOBS, **knobs}
    schema = space_file_model(all_knobs)
    try:
        parsed = schema.model_validate(doc, context={"model": model})
    except ValidationError as exc:
        raise ConfigError(";\n".join(f"{where}: {line}" for line in problems(exc, model, all_knobs))) from None
    given = getattr(parsed, "params", None)
    specs = given.specs() if given is not None else {}
    return SearchSpace(model, {name: _param(name, knob, specs[name]) if name in specs
                               else Param(name, knob, fixed=True, value=knob.default)
                               for name, knob in all_knobs.items()})


def _param(name: str, knob: Knob, spec: object) -> Param:
    """One knob's validated entry as a Param: a range, a list of choices, or a fixed value."""
    if isinstance(spec, RangeSpec):
        return Param(name, knob, low=spec.low, high=spec.high, log=spec.log, nullable=spec.nullable)
    if isinstance(spec, ChoiceSpec):
        # one choice is a fixed value: not searched, and the preflight checks it
        if len(set(map(repr, spec.choices))) == 1:
            return Param(name, knob, fixed=True, value=spec.choices[0])
        return Param(name, knob, choices=tuple(spec.choices))
    return Param(name, knob, fixed=True, value=spec)
