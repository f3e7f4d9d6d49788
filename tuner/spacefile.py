"""The search-space YAML as pydantic models, and its validation errors as one line per problem.

A space file is checked against the launch's knobs (tuner's and the model's), so its models are
made per set of knobs (:func:`space_file_model`, cached): ``params`` has one optional field per
knob, each a range (:class:`RangeSpec`), a list of choices (:class:`ChoiceSpec`) or a fixed value,
told apart by their keys, and each checked against its :class:`~tuner.models.base.Knob`. Unknown
keys are refused at every level. :func:`problems` turns pydantic's errors into lines that name the
key (``params.learning_rate.low: ...``), say what is wrong and what is valid.
"""

from __future__ import annotations

import functools
import math
import reprlib
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from tuner.models.base import Knob

TOP_KEYS = ("model", "params", "description")
RANGE_KEYS = ("low", "high", "log", "nullable")
CHOICE_KEYS = ("choices",)
_TAGS = ("range", "choices", "fixed")  # the kinds of a knob's entry (pydantic puts the tag in an error's loc)
_CACHED = 32  # knob sets whose models are kept (a process sees one or two)


def _problem(text: str) -> PydanticCustomError:
    """A validation error whose message is ``text`` as is."""
    return PydanticCustomError("space", "{text}", {"text": text})


def _shown(value: object) -> str:
    """``repr(value)``, cut short (a YAML int may have hundreds of digits)."""
    return reprlib.repr(value)


def _number(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise _problem(f"expected a number, got {_shown(value)}")
    return value


Number = Annotated[int | float, BeforeValidator(_number)]  # an int stays an int (an int knob's range)


class _Spec(BaseModel):
    """A knob's entry: made per knob (:meth:`of`), so its checks know the knob."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    KEYS: ClassVar[tuple[str, ...]]
    knob: ClassVar[Knob]

    @classmethod
    def of(cls, name: str, knob: Knob) -> type[Self]:
        """This kind of entry for knob ``name``."""
        return type(f"{cls.__name__}[{name}]", (cls,), {"knob": knob, "__module__": __name__})

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: object) -> object:
        if isinstance(data, dict) and set(data) - set(cls.KEYS):
            raise _problem(f"unknown or mixed keys {sorted(map(str, data))}; use {'/'.join(RANGE_KEYS)} "
                           "for a range or choices for a list")
        return data


class RangeSpec(_Spec):
    """``{low, high, log, nullable}``: a range of a float or int knob."""

    KEYS = RANGE_KEYS
    low: Number
    high: Number
    log: StrictBool = False
    nullable: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _kind(cls, data: object) -> object:
        if cls.knob.kind not in ("float", "int"):
            raise _problem(f"a {cls.knob.kind} knob takes choices, not a range (valid: {cls.knob.describe()})")
        return data

    @field_validator("low", "high")
    @classmethod
    def _valid(cls, value: int | float) -> int | float:
        problem = cls.knob.problem(value)
        if problem:
            raise _problem(f"{_shown(value)}: {problem} (valid: {cls.knob.describe()})")
        return value

    @field_validator("nullable")
    @classmethod
    def _nullable(cls, value: bool) -> bool:
        if value and not cls.knob.nullable:
            raise _problem(f"this knob cannot be null (valid: {cls.knob.describe()})")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low >= self.high:
            raise _problem(f"low ({self.low}) must be below high ({self.high}); to fix a value, write it alone")
        if self.log and self.low <= 0:
            raise _problem(f"a log range needs low > 0 (got {self.low}); use nullable: true for 'none'")
        return self


class ChoiceSpec(_Spec):
    """``{choices: [...]}``: a list of values, each valid for the knob."""

    KEYS = CHOICE_KEYS
    choices: list[object] = Field(min_length=1)

    @model_validator(mode="after")
    def _valid(self) -> Self:
        for choice in self.choices:
            problem = self.knob.problem(choice)
            if problem:
                raise _problem(f"choice {_shown(choice)}: {problem} (valid: {self.knob.describe()})")
        return self


def _fixed(knob: Knob, value: object) -> object:
    problem = knob.problem(value)
    if problem:
        raise _problem(f"fixed value {_shown(value)}: {problem} (valid: {knob.describe()})")
    return value


def _tag(spec: object) -> str:
    if isinstance(spec, dict):
        return "choices" if "choices" in spec else "range"
    return "fixed"


class _Params(BaseModel):
    """One optional field per knob, named ``k<i>`` with the knob's name as its alias (a knob may be
    named like a BaseModel member); a knob left out is not in ``model_fields_set``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    NAMES: ClassVar[dict[str, str]]  # field -> knob name

    def specs(self) -> dict[str, object]:
        """Knob name -> its validated entry (a RangeSpec, a ChoiceSpec or a fixed value), as given."""
        return {self.NAMES[f]: getattr(self, f) for f in self.model_fields_set}


class SpaceFile(BaseModel):
    """The top level of a space file (``params`` is added per set of knobs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: object = None
    description: object = None

    @field_validator("model", mode="before")
    @classmethod
    def _same_model(cls, value: object, info: ValidationInfo) -> object:
        launched = (info.context or {}).get("model")
        if value is not None and value != launched:
            raise _problem(f"the space is for {_shown(value)} but the launch uses {launched!r}")
        return value


def _entry(name: str, knob: Knob) -> object:
    """The type of knob ``name``'s entry: a range, choices or a fixed value, told apart by :func:`_tag`."""
    return Annotated[
        Annotated[RangeSpec.of(name, knob), Tag("range")]
        | Annotated[ChoiceSpec.of(name, knob), Tag("choices")]
        | Annotated[object, AfterValidator(functools.partial(_fixed, knob)), Tag("fixed")],
        Discriminator(_tag),
    ]


_models: dict[str, type[SpaceFile]] = {}  # repr of a knob set -> its model (a knob's default may be unhashable)


def space_file_model(knobs: Mapping[str, Knob]) -> type[SpaceFile]:
    """The pydantic model of a space file for these knobs (tuner's and the model's)."""
    key = repr(tuple(knobs.items()))
    if key not in _models:
        if len(_models) >= _CACHED:
            _models.clear()
        names = {f"k{i}": name for i, name in enumerate(knobs)}
        fields: dict[str, Any] = {f: (_entry(name, knobs[name]), Field(None, alias=name)) for f, name in names.items()}
        params = create_model("Params", __base__=_Params, **fields)
        params.NAMES = names
        params_type: Any = params | None
        _models[key] = create_model("SpaceFile", __base__=SpaceFile, params=(params_type, None))
    return _models[key]


def problems(exc: ValidationError, model: str, knobs: Mapping[str, Knob]) -> list[str]:
    """One line per problem of a space file: the key's path, what is wrong and what is valid."""
    lines, unknown = [], []
    for error in exc.errors(include_url=False):
        loc = _path(error["loc"])
        if error["type"] == "extra_forbidden" and len(loc) == 1:
            unknown.append(loc[0])
            continue
        message = _message(error, loc, model, knobs)
        lines.append(f"{'.'.join(map(str, loc))}: {message}" if loc else message)
    if unknown:
        lines.insert(0, f"unknown key(s) {sorted(map(str, unknown))}; valid: {', '.join(TOP_KEYS)}")
    return lines


def _path(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's loc without the tag of a knob's entry: ``params.lr.range.low`` -> ``params.lr.low``."""
    if len(loc) >= 3 and loc[0] == "params" and loc[2] in _TAGS:
        return (*loc[:2], *loc[3:])
    return loc


def _message(error: ErrorDetails, loc: tuple[int | str, ...], model: str, knobs: Mapping[str, Knob]) -> str:
    """Pydantic's message for ``error``, in the words of a space file."""
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden" and len(loc) == 2:
        return f"{_shown(loc[1])} is not a knob of model {model!r}; valid knobs: {', '.join(knobs)}"
    if kind == "missing" and loc[-1] in ("low", "high"):
        return "missing: a range needs both low and high"
    if kind in ("model_type", "dict_type"):
        if not loc:
            return "expected a mapping with a 'params' key"
        if loc == ("params",):
            return "expected a mapping of knob name -> a range {low, high}, {choices: [...]} or a fixed value"
    if kind == "bool_type":
        return f"expected true or false, got {_shown(value)}"
    if loc and loc[-1] == "choices" and kind in ("list_type", "too_short"):
        return f"expected a non-empty list, got {_shown(value)}"
    return str(error["msg"])
