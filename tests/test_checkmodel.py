"""``check-model``: passes on the built-in models and the example; names each contract violation."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, run_tuner
from tuner.models import BUILTIN, Knob, load_model
from tuner.worker.checkmodel import run_check

BAD = FIXTURES / "bad_models"
EXAMPLE = "examples/my_iterated_model.py:MyIteratedModel"
NAN_LABELS = f"{FIXTURES / 'faulty_cnn.py'}:NanLabels"


def check(spec: str, capsys: pytest.CaptureFixture[str], steps: int = 3) -> tuple[int, list[str]]:
    """Run check-model in this process; return its exit status and its report lines."""
    status = run_check(argparse.Namespace(spec=spec, steps=steps))
    return status, capsys.readouterr().out.splitlines()


def line(lines: list[str], name: str) -> str:
    """The report line of check ``name``."""
    found = [entry for entry in lines if entry[:4] in ("PASS", "WARN", "FAIL") and entry[6:30].strip() == name]
    assert len(found) == 1, lines
    return found[0]


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("spec", sorted(BUILTIN))
def test_check_model_passes_on_builtin_models(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = check(spec, capsys)
    assert status == 0, "\n".join(lines)
    assert lines[-1].endswith("all checks passed")
    names = ["contract", "knob names", "data", "build", "loss", "gradients", "validation loss", "training"]
    knobs = load_model(spec).knobs
    names += [f"knob {knob}" for knob in knobs]
    assert all(line(lines, name).startswith("PASS") for name in names)
    assert all(f"({k.help})" in line(lines, f"knob {name}") for name, k in knobs.items() if k.help)  # shown


@pytest.mark.tf
@pytest.mark.slow
def test_check_model_passes_on_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = check(str(ROOT / EXAMPLE), capsys)
    assert status == 0, "\n".join(lines)
    for knob in ("max_iter", "bn_order", "hidden", "epsilon", "input_clip", "batch_size"):
        assert line(lines, f"knob {knob}").startswith("PASS")
    assert line(lines, "training").startswith("PASS")


def test_check_model_missing_method_names_model_member_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = check(f"{BAD / 'no_data.py'}:NoData", capsys)
    assert status == 2
    assert line(lines, "contract").startswith("FAIL")
    assert "no_data.py:NoData" in lines[1] and "missing data: add a method `data(self, knobs) -> Dataset`" in lines[1]


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("bad_range.py:BadRange", r'bad_range.py:15 \(`"depth": Knob\("int", 5, 10, 1\),`\): ValueError: knob range '
         r"low=10 is above high=1; fix this Knob: low <= high"),
        ("default_outside.py:DefaultOutside", r"default_outside.py:13 .*\"dropout\".*knob default 1.5: outside the "
         r"valid range \[0.0, 0.9\]; fix this Knob"),
    ],
)
def test_check_model_bad_knob_range_names_the_line_and_fix(
    file: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines = check(f"{BAD / file}", capsys)
    assert status == 2
    assert line(lines, "contract").startswith("FAIL")
    assert file in lines[1]
    assert re.search(expected, lines[1]), lines[1]


@pytest.mark.tf
def test_check_model_non_scalar_loss_is_a_clear_failure(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = check(f"{BAD / 'vector_loss.py'}:VectorLoss", capsys)
    assert status == 2
    assert line(lines, "build").startswith("PASS")
    loss = line(lines, "loss")
    assert loss.startswith("FAIL") and "vector_loss.py:VectorLoss" in loss
    assert "loss of shape (None,); it must be a scalar: reduce it over the batch" in loss
    assert not [entry for entry in lines if entry[6:].startswith("training")]  # nothing trains on it


@pytest.mark.tf
def test_check_model_finds_unused_knob_and_weight(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = check(f"{BAD / 'unused.py'}:Unused", capsys)
    assert status == 2
    assert line(lines, "gradients").startswith("FAIL") and "['spare']" in line(lines, "gradients")
    assert line(lines, "knob unused").startswith("FAIL") and "changes nothing" in line(lines, "knob unused")
    assert line(lines, "knob batch_size").startswith("PASS")
    assert line(lines, "training").startswith("PASS")


def test_check_model_cli_reports_a_user_error_without_traceback(tmp_path: Path) -> None:
    result = run_tuner(["check-model", f"{BAD / 'bad_range.py'}:BadRange"], cwd=tmp_path)
    assert result.returncode == 2
    assert "FAIL  contract" in result.stdout and "knob range low=10 is above high=1" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_alternatives_are_other_valid_values() -> None:
    assert Knob("bool", False).alternatives() == [True]
    assert Knob("categorical", "b", choices=("a", "b", "c")).alternatives() == ["a", "c"]
    assert Knob("int", 4, 1, 16).alternatives() == [16, 1]
    assert Knob("int", 16, 1, 16).alternatives() == [1]
    assert Knob("float", None, 1e-8, 1e-2, nullable=True).alternatives() == [1e-2, 1e-8]
    assert Knob("float", 0.5, 0.0, 1.0, nullable=True).alternatives() == [1.0, 0.0, None]


@pytest.mark.tf
def test_check_model_flags_a_knob_end_with_a_non_finite_loss_and_runs_the_data_preflight(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, lines = check(f"{BAD / 'init_scale.py'}:InitScale", capsys, steps=1)
    assert status == 2
    assert line(lines, "knob init_scale").startswith("PASS")
    ends = line(lines, "knob init_scale ends")
    assert ends.startswith("FAIL") and "init_scale=1e+30 (its high end) the loss at init is inf" in ends
    assert line(lines, "data preflight").startswith("PASS") and line(lines, "training").startswith("PASS")
    status, lines = check(NAN_LABELS, capsys, steps=1)
    assert status == 2
    preflight = line(lines, "data preflight")
    assert preflight.startswith("FAIL") and "sample(s) with a non-finite label" in preflight


@pytest.mark.tf
@pytest.mark.slow
def test_check_model_warns_that_a_gan_without_val_loss_has_a_default_that_rises(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The sum d_loss + g_loss rises while a GAN trains well: every trial would end "did not learn"."""
    status, lines = check(f"{FIXTURES / 'gan_without_val.py'}:GANWithoutValLoss", capsys)
    assert status == 0, "\n".join(lines)  # a warning, not a failure
    warned = line(lines, "validation loss")
    assert warned.startswith("WARN") and "the sum of its losses (d_loss + g_loss)" in warned
    assert "did not learn" in warned and "ModelGraph(val_loss=...)" in warned
    assert lines[-1].endswith("all checks passed (1 warning)")
    status, lines = check(f"{ROOT / 'examples' / 'gan.py'}:GAN", capsys)
    assert line(lines, "validation loss") == f"PASS  {'validation loss':<24} the model's own val_loss"
