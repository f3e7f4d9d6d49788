"""Search spaces: every shipped space loads; every kind of bad space gets a clear error."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.errors import ConfigError
from tuner.models import BUILTIN, load_model
from tuner.models.base import Knob
from tuner.spaces import TUNER_KNOBS, default_space, load_space, space_from

ROOT = Path(__file__).resolve().parent.parent
BAD = Path(__file__).resolve().parent / "fixtures" / "spaces"


@pytest.mark.parametrize("model", sorted(BUILTIN))
def test_load_space_every_shipped_space_loads(model: str) -> None:
    space = load_space(ROOT / "search_spaces" / f"{model}.yaml", model, load_model(model).knobs)
    assert set(space.params) == set(TUNER_KNOBS) | set(load_model(model).knobs)
    assert "learning_rate" in space.searched()


@pytest.mark.parametrize(
    ("file", "match"),
    [
        ("unknown_key.yaml", r"unknown_key\.yaml: params\.learning_rate: unknown or mixed keys.*step"),
        ("unknown_knob.yaml", r"params\.dropout: 'dropout' is not a knob of model 'iterated_mlp'; valid knobs"),
        ("low_above_high.yaml", r"params\.learning_rate: low \(0\.1\) must be below high \(0\.01\)"),
        ("log_through_zero.yaml", r"params\.l2_weight: a log range needs low > 0"),
        ("wrong_type.yaml", r"params\.max_iter\.low: expected a number, got 'four'"),
        ("not_yaml.yaml", r"not_yaml\.yaml: not valid YAML"),
        ("top_level_typo.yaml", r"unknown key\(s\) \['parms'\]"),
        ("bad_choice.yaml", r"params\.bn_order: choice 'layer_norm': expected one of"),
        ("bad_fixed.yaml", r"params\.max_iter: fixed value 500: outside the valid range"),
        ("not_nullable.yaml", r"params\.lr_decay\.nullable: this knob cannot be null \(valid: float in"),
        ("log_not_bool.yaml", r"params\.clip_norm\.log: expected true or false, got 'yes'"),
        ("range_of_choices_knob.yaml", r"params\.bn_order: a categorical knob takes choices, not a range"),
        ("not_a_mapping.yaml", r"not_a_mapping\.yaml: expected a mapping with a 'params' key"),
    ],
)
def test_load_space_bad_file_names_file_and_key(file: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_space(BAD / file, "iterated_mlp", load_model("iterated_mlp").knobs)


def test_load_space_several_problems_one_line_each_naming_file_and_key() -> None:
    with pytest.raises(ConfigError) as caught:
        load_space(BAD / "several_problems.yaml", "iterated_mlp", load_model("iterated_mlp").knobs)
    lines = str(caught.value).splitlines()
    assert [line.partition(": ")[2].partition(":")[0] for line in lines] == [
        "params.learning_rate.high", "params.max_iter.low", "params.bn_order"]
    assert all(line.startswith(f"{BAD / 'several_problems.yaml'}: ") for line in lines)
    assert "a range needs both low and high" in lines[0] and "outside the valid range [2, 30]" in lines[1]


def test_space_from_knobs_named_like_pydantic_members() -> None:
    knobs = {"copy": Knob("int", 1, 1, 4), "model_config": Knob("categorical", "a", choices=("a", "b"))}
    space = space_from({"copy": {"low": 1, "high": 3}, "model_config": "b"}, "odd", knobs, "<test>")
    assert space.params["copy"].high == 3 and space.params["model_config"].value == "b"
    with pytest.raises(ConfigError, match=r"<test>: params\.copy\.high: 9: outside the valid range \[1, 4\]"):
        space_from({"copy": {"low": 1, "high": 9}}, "odd", knobs, "<test>")


def test_load_space_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the search space"):
        load_space(tmp_path / "nope.yaml", "iterated_mlp", load_model("iterated_mlp").knobs)


def test_load_space_other_models_space_is_refused() -> None:
    with pytest.raises(ConfigError, match="the space is for 'iterated_mlp' but the launch uses 'counting_cnn'"):
        load_space(ROOT / "search_spaces" / "iterated_mlp.yaml", "counting_cnn", load_model("counting_cnn").knobs)


def test_suggest_fixed_knob_is_not_searched() -> None:
    space = load_space(BAD / "lr_one.yaml", "iterated_mlp", load_model("iterated_mlp").knobs)
    trial = optuna.create_study().ask()
    config = space.suggest(trial)
    assert config.learning_rate == 1.0
    assert "learning_rate" not in trial.params
    assert 6 <= config.knobs["max_iter"] <= 12
    assert config.clip_norm is None and config.l2_weight == 0.0  # defaults of knobs left out


def test_suggest_nullable_range_gives_none_or_a_value_in_range() -> None:
    space = load_space(ROOT / "search_spaces" / "iterated_mlp.yaml", "iterated_mlp",
                       load_model("iterated_mlp").knobs)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    clips = [space.suggest(study.ask()).clip_norm for _ in range(40)]
    assert None in clips
    assert all(0.1 <= c <= 10.0 for c in clips if c is not None)


def test_default_space_from_knob_ranges_covers_every_knob() -> None:
    knobs = load_model("iterated_mlp").knobs
    space = default_space("iterated_mlp", knobs)
    assert set(knobs) <= set(space.searched())
    assert space.params["bn_order"].choices == knobs["bn_order"].choices
