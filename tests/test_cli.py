"""CLI parsing on its own, and bad input stopping a launch before anything is created."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from tests.conftest import FIXTURES, run_tuner
from tuner.cli import LAUNCH_FLAGS, add_options, launch_flags, main, parser
from tuner.config import CheckModelOptions, LaunchConfig, ReportOptions, VerifyOptions, load_options


def test_parser_launch_flags_map_to_config_fields() -> None:
    args = parser().parse_args([
        "launch", "--model", "counting_cnn", "--trials", "3", "--steps", "50", "--seeds", "3",
        "--study", "s", "--storage", "sqlite:///a.db", "--tracking-uri", "sqlite:///b.db",
        "--address", "127.0.0.1:6379", "--cpus-per-trial", "0.5", "--gpus-per-trial", "0.25",
        "--max-concurrent", "4", "--sampler", "random", "--seed", "7", "--out", "x.yaml",
    ])
    flags = launch_flags(args)
    config = LaunchConfig(**{k: v for k, v in flags.items() if v is not None})
    assert (config.model, config.trials, config.steps, config.seeds) == ("counting_cnn", 3, 50, 3)
    assert (config.gpus_per_trial, config.cpus_per_trial, config.max_concurrent) == (0.25, 0.5, 4)
    assert (config.sampler, config.seed, config.out, config.address) == ("random", 7, "x.yaml", "127.0.0.1:6379")


def test_parser_flags_not_given_are_none() -> None:
    flags = launch_flags(parser().parse_args(["launch"]))
    assert set(flags) == set(LAUNCH_FLAGS)
    assert all(v is None for v in flags.values())


def test_parser_every_launch_flag_is_a_config_field() -> None:
    assert set(LAUNCH_FLAGS) <= set(LaunchConfig.model_fields)


def test_parser_help_explains_each_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["launch", "--help"])
    out = capsys.readouterr().out
    for flag in ("--model", "--space", "--trials", "--steps", "--seeds", "--study", "--storage",
                 "--tracking-uri", "--address", "--cpus-per-trial", "--gpus-per-trial",
                 "--max-concurrent", "--sampler", "--seed", "--out"):
        assert flag in out


def test_main_unknown_model_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["launch", "--model", "resnet", "--storage", f"sqlite:///{tmp_path / 't.db'}", "--no-tracking"])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown model 'resnet': use one of ['counting_cnn', 'iterated_mlp']" in err
    assert not (tmp_path / "t.db").exists()


def test_main_bad_launch_yaml_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "launch.yaml"
    bad.write_text("trials: many\n")
    assert main(["launch", "--config", str(bad)]) == 2
    assert "launch.yaml: trials: Input should be a valid integer" in capsys.readouterr().err


def test_launch_broken_space_exits_with_one_message_and_no_study(tmp_path: Path) -> None:
    """Through a real subprocess, as a user runs it."""
    result = run_tuner(
        ["launch", "--space", str(FIXTURES / "spaces" / "low_above_high.yaml"),
         "--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"],
        cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "low_above_high.yaml: params.learning_rate: low (0.1) must be below high (0.01)" in lines[0]
    assert not (tmp_path / "t.db").exists() and not (tmp_path / "m.db").exists()


def _bad_launch(tmp_path: Path, *extra: str) -> str:
    result = run_tuner(
        ["launch", "--storage", f"sqlite:///{tmp_path / 't.db'}", "--num-cpus", "2", *extra],
        cwd=tmp_path, timeout=180,
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t.db").exists()  # no study was created
    return result.stderr


def test_launch_unreachable_ray_address_is_a_clear_error(tmp_path: Path) -> None:
    err = _bad_launch(tmp_path, "--address", "127.0.0.1:1", "--no-tracking")
    assert "no Ray cluster answers at '127.0.0.1:1'" in err


@pytest.mark.slow
@pytest.mark.ray
def test_launch_unreachable_tracking_server_is_a_clear_error(tmp_path: Path) -> None:
    from tests.cluster import free_port

    err = _bad_launch(tmp_path, "--tracking-uri", f"http://127.0.0.1:{free_port()}")
    assert "cannot reach the MLflow tracking store at http://127.0.0.1:" in err
    assert "--no-tracking" in err


@pytest.mark.slow
@pytest.mark.ray
def test_launch_more_gpus_than_the_cluster_is_a_clear_error(tmp_path: Path) -> None:
    err = _bad_launch(tmp_path, "--gpus-per-trial", "1", "--num-gpus", "0", "--no-tracking")
    assert "--gpus-per-trial 1 asks for more GPUs than any node has" in err


def test_parser_launch_racing_and_verification_flags() -> None:
    args = parser().parse_args([
        "launch", "--race-seeds", "4", "--verify-seeds", "32", "--verify-steps", "900", "--min-survival", "0.9",
        "--verify-candidates", "2", "--no-margin",
    ])
    config = LaunchConfig(**{k: v for k, v in launch_flags(args).items() if v is not None})
    assert (config.race_seeds, config.verify_seeds, config.verification_steps) == (4, 32, 900)
    assert (config.min_survival, config.verify_candidates, config.margin) == (0.9, 2, False)
    defaults = LaunchConfig()
    assert (defaults.race_seeds, defaults.verify_seeds, defaults.verification_steps) == (8, 16, 1200)
    assert (defaults.min_survival, defaults.margin, defaults.pruner) == (0.8, True, "first-seed")


def test_parser_verify_flags() -> None:
    args = parser().parse_args(["verify", "best.yaml", "--seeds", "32", "--steps", "900", "--model", "counting_cnn",
                                "--min-survival", "0.9", "--seed", "3"])
    assert (args.config, args.seeds, args.steps, args.model) == ("best.yaml", 32, 900, "counting_cnn")
    assert (args.min_survival, args.seed, args.fail_fast) == (0.9, 3, False)
    defaults = parser().parse_args(["verify", "best.yaml"])
    assert (defaults.seeds, defaults.steps, defaults.min_survival) == (16, None, 0.8)
    assert not defaults.trust_file_model
    assert parser().parse_args(["verify", "b.yaml", "--trust-file-model"]).trust_file_model


CONFIGS = FIXTURES / "configs"


@pytest.mark.parametrize(("text", "flags", "message"), [
    (None, [], "cannot read the config"),
    ("learning_rate: 0.1\n", [], "expected a mapping with a 'config:' mapping"),
    ("config: {learning_rate: 0.001}\n", [], "no stability.steps to double; give --steps N"),
    ("config: {learning_rate: 0.001, widht: 3}\n", ["--steps", "10"], "'widht' is not a knob of model 'iterated_mlp'"),
    ("config: {learning_rate: -1}\n", ["--steps", "10"], "learning_rate"),
    ("config: {learning_rate: 0.001}\n", ["--steps", "10", "--seeds", "4"], "cannot reach --min-survival 0.8"),
    ("config: {learning_rate: 0.001}\n", ["--steps", "10", "--model", "resnet"], "unknown model 'resnet'"),
])
def test_main_verify_bad_input_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, flags: list[str], message: str
) -> None:
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    assert main(["verify", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--seeds", "100000000"], "--seeds 100000000: input should be less than or equal to 10000"),
    (["--seeds", "0"], "--seeds 0: input should be greater than or equal to 1"),
    (["--steps", "0"], "--steps 0: input should be greater than or equal to 1"),
    (["--steps", "100000000"], "--steps 100000000: input should be less than or equal to 10000000"),
    (["--min-survival", "1.5"], "--min-survival 1.5: input should be less than or equal to 1"),
    (["--min-survival", "nan"], "--min-survival nan: input should be a finite number"),
    (["--cpus-per-trial", "0"], "--cpus-per-trial 0.0: input should be greater than 0"),
    (["--gpus-per-trial", "-1"], "--gpus-per-trial -1.0: input should be greater than or equal to 0"),
    (["--gpus-per-trial", "1.5"], "--gpus-per-trial above 1 must be a whole number"),
    (["--num-cpus", "0"], "--num-cpus 0: input should be greater than or equal to 1"),
])
def test_main_verify_out_of_range_counts_are_refused_before_the_file_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["verify", str(tmp_path / "missing.yaml"), *flags]) == 2  # the missing file is never read
    err = capsys.readouterr().err
    assert err == f"tuner: error: {message}\n"


@pytest.mark.parametrize(("steps", "message"), [
    ("0", "--steps 0: input should be greater than or equal to 1"),
    ("100000", "--steps 100000: input should be less than or equal to 10000"),
])
def test_main_check_model_steps_out_of_range_are_refused(
    capsys: pytest.CaptureFixture[str], steps: str, message: str
) -> None:
    assert main(["check-model", "no_such_model", "--steps", steps]) == 2
    assert capsys.readouterr().err == f"tuner: error: {message}\n"


def test_parser_verify_help_shows_percent_signs_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["verify", "--help"])
    out = capsys.readouterr().out
    assert "95% Wilson lower bound" in " ".join(out.split()) and "%%" not in out
    assert "--trust-file-model" in out and "10000" in out


def test_parser_grace_period_flag_and_its_bounds() -> None:
    from tuner.config import load_launch
    from tuner.errors import ConfigError

    config = load_launch(launch_flags(parser().parse_args(["launch", "--grace-period", "5"])))
    assert config.grace_period == 5 and LaunchConfig().grace_period == 30
    with pytest.raises(ConfigError, match="grace_period: Input should be greater than or equal to 2"):
        load_launch(launch_flags(parser().parse_args(["launch", "--grace-period", "1"])))


def test_parser_placement_timeout_flag_and_its_bounds() -> None:
    from tuner.config import load_launch
    from tuner.errors import ConfigError

    config = load_launch(launch_flags(parser().parse_args(["launch", "--placement-timeout", "7.5"])))
    assert config.placement_timeout == 7.5 and LaunchConfig().placement_timeout == 120.0
    with pytest.raises(ConfigError, match="placement_timeout: Input should be greater than or equal to 1"):
        load_launch(launch_flags(parser().parse_args(["launch", "--placement-timeout", "0.5"])))


COMMANDS = {"launch": LaunchConfig, "report": ReportOptions, "verify": VerifyOptions, "check-model": CheckModelOptions}


def _subparser(command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


@pytest.mark.parametrize("command", COMMANDS)
def test_parser_each_option_is_one_field_of_its_model_and_each_field_one_option(command: str) -> None:
    """The one definition: a field of the command's model is exactly one argument (its name, dashes for
    underscores), with the field's description as its help, and no argument is not a field (but launch's
    ``--config``, the YAML the fields are read from)."""
    model = COMMANDS[command]
    not_fields = {"help", "config"} if command == "launch" else {"help"}
    actions = [a for a in _subparser(command)._actions if a.dest not in not_fields]
    assert [a.dest for a in actions] == list(model.model_fields)
    for action in actions:
        field = model.model_fields[action.dest]
        flag = "--" + action.dest.replace("_", "-")
        assert action.option_strings in ([flag], [flag, "--no-" + flag[2:]]) if not field.is_required() \
            else action.option_strings == []
        assert field.description and action.help and action.help.replace("%%", "%").startswith(field.description)
        if field.default not in (None, False) and not field.is_required():
            assert "default" in action.help, f"{command} {flag}: its help does not say its default"
        default = None if command == "launch" else field.default
        assert action.default == default or field.is_required(), f"{command} {flag}"


def test_parser_defaults_parse_into_the_models_defaults() -> None:
    def parsed(*argv: str) -> dict[str, object]:
        return vars(parser().parse_args(argv))

    assert load_options(VerifyOptions, parsed("verify", "b.yaml")) == VerifyOptions(config="b.yaml")
    assert load_options(ReportOptions, parsed("report")) == ReportOptions()
    assert load_options(CheckModelOptions, parsed("check-model", "m")) == CheckModelOptions(spec="m")


def test_add_options_a_new_field_is_a_flag_with_its_type_choices_and_default_in_its_help() -> None:
    class Options(BaseModel):
        path: str = Field(description="a file")
        batch_size: int = Field(64, ge=1, description="samples a step")
        rate: float = Field(0.5, description="a rate (default: half)")
        mode: Literal["a", "b"] = Field("b", description="the mode")
        warm: bool = Field(True, description="start warm")
        dry_run: bool = Field(False, description="print only")
        limit: int | None = Field(None, description="at most this many (default: no limit)")

    p = argparse.ArgumentParser()
    add_options(p, Options)
    args = p.parse_args(["x.yaml", "--batch-size", "8", "--mode", "a", "--no-warm", "--dry-run", "--limit", "3"])
    assert vars(args) == {"path": "x.yaml", "batch_size": 8, "rate": 0.5, "mode": "a", "warm": False,
                          "dry_run": True, "limit": 3}
    helps = {a.dest: a.help for a in p._actions}
    assert helps["batch_size"] == "samples a step (default 64)" and helps["rate"] == "a rate (default: half)"
    assert helps["mode"] == "the mode (default b)" and helps["warm"] == "start warm (default: on)"
    assert helps["dry_run"] == "print only" and helps["path"] == "a file"
    with pytest.raises(SystemExit):
        p.parse_args(["x.yaml", "--mode", "c"])
    given_only = argparse.ArgumentParser()
    add_options(given_only, Options, given_only=True)
    unset = dict.fromkeys(list(Options.model_fields)[1:])
    assert vars(given_only.parse_args(["x.yaml"])) == {"path": "x.yaml", **unset}
