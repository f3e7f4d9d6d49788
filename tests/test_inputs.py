"""Property-based tests (Hypothesis) of everything a user types: space YAMLs, launch YAMLs, flags.

Whatever the input (wrong types, NaN/inf, huge numbers, unicode, empty, nested junk), it is either
valid or stops with exit 2 and one line, no traceback, nothing created. The checks run in process
(``tuner.driver.launch.prepare``: every check that creates nothing) so hundreds of inputs take seconds;
two subprocess runs check the same through ``python -m tuner``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import run_tuner
from tuner.cli import LAUNCH_FLAGS, main
from tuner.config import load_launch
from tuner.driver.launch import prepare
from tuner.errors import ConfigError, TunerError
from tuner.models import load_model
from tuner.spaces import TUNER_KNOBS, load_space

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KNOBS = load_model("iterated_mlp").knobs

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**30), max_value=10**30)
           | st.floats() | st.text(max_size=12) | st.sampled_from(["", "nan", "inf", "-1", "1e309", "0", "💥"]))
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
numbers = st.integers(-5, 30) | st.floats() | st.sampled_from([1e-4, 1e-2, 0.5, 1e300])
ranges = st.fixed_dictionaries({}, optional={"low": numbers | junk, "high": numbers | junk, "log": st.booleans() | junk,
                                             "nullable": st.booleans() | junk, "choices": st.lists(scalars, max_size=3)
                                             | junk})
knob_names = st.sampled_from(sorted({*TUNER_KNOBS, *KNOBS})) | st.text(max_size=8)
space_docs = junk | st.fixed_dictionaries(
    {"params": st.dictionaries(knob_names, ranges | scalars | junk, max_size=4)},
    optional={"model": st.sampled_from(["iterated_mlp", "counting_cnn"]) | junk, "description": junk})
flag_names = st.sampled_from(LAUNCH_FLAGS)
edges = ["", "nan", "inf", "-inf", "-1", "0", "0.5", "2", "1e309", "4294967296", "99999999999999999999", "💥"]
launch_docs = junk | st.dictionaries(flag_names, st.sampled_from(edges) | scalars, min_size=1, max_size=2) \
    | st.dictionaries(flag_names | st.text(max_size=8), scalars | junk, max_size=4)


@contextlib.contextmanager
def empty_cwd() -> Iterator[Path]:
    """A fresh empty working directory for one example; it must still be empty at the end."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(old)


def write(doc: Any, suffix: str = ".yaml") -> str:
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(doc if isinstance(doc, str) else yaml.safe_dump(doc, allow_unicode=True))
    return path


def one_line(exc: BaseException) -> None:
    text = str(exc)
    assert text.strip(), f"{type(exc).__name__} with no message"


@SETTINGS
@given(doc=space_docs)
def test_space_yaml_is_valid_or_one_config_error(doc: Any) -> None:
    path = write(doc)
    try:
        load_space(path, "iterated_mlp", KNOBS)
    except ConfigError as exc:
        one_line(exc)
        assert path in str(exc)  # names the file
    finally:
        os.unlink(path)


@SETTINGS
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_space_file_of_any_bytes_is_valid_or_one_config_error(raw: bytes) -> None:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
    try:
        with empty_cwd() as cwd:
            try:
                prepare(load_launch({"space": path, "no_tracking": True}))
            except ConfigError as exc:
                one_line(exc)
            assert list(cwd.iterdir()) == []
    finally:
        os.unlink(path)


@SETTINGS
@given(doc=launch_docs)
def test_launch_yaml_is_valid_or_one_tuner_error_and_creates_nothing(doc: Any) -> None:
    path = write(doc)
    try:
        with empty_cwd() as cwd:
            try:
                prepare(load_launch({}, path))
            except TunerError as exc:
                one_line(exc)
            assert list(cwd.iterdir()) == []
    finally:
        os.unlink(path)


class Valid(Exception):
    """Raised instead of launching: the input passed every check."""


flag_values = (st.sampled_from([*edges, "iterated_mlp", "x.py:Y", "notadb://x", "http://u:pw@127.0.0.1:1", "tpe"])
               | st.text(max_size=10).filter(lambda v: ":" not in v and not v.startswith("-"))
               | st.integers().map(str) | st.floats().map(str))
options = ["--" + name.replace("_", "-") for name in LAUNCH_FLAGS]
edge_pairs = st.sampled_from([(option, value) for option in options for value in edges])  # every flag x edge
flags = st.lists(edge_pairs | edge_pairs | st.tuples(st.sampled_from(options), flag_values), min_size=1, max_size=2)


@settings(SETTINGS, max_examples=250)
@given(pairs=flags)
def test_launch_flags_exit_2_with_one_line_or_pass(
    pairs: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def checked(config: Any) -> None:
        prepare(config)
        raise Valid

    monkeypatch.setattr("tuner.driver.launch.launch", checked)
    argv = ["launch", "--no-tracking", *(item for pair in pairs for item in pair)]
    with empty_cwd() as cwd:
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        except Valid:
            code = 0
        err = capsys.readouterr().err
        assert list(cwd.iterdir()) == []
    assert code in (0, 2), (argv, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tuner: error: "), (argv, err)
        assert "Traceback" not in err and "pw@" not in err


@pytest.mark.parametrize(("args", "message"), [
    (["--trials", "nan"], "argument --trials: invalid int value: 'nan'"),
    (["--min-survival", "inf"], "min_survival: Input should be a finite number"),
])
def test_launch_bad_flag_value_subprocess_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_tuner(["launch", *args], cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []


def test_launch_yaml_of_nested_junk_subprocess_one_line(tmp_path: Path) -> None:
    config = tmp_path / "launch.yaml"
    config.write_text("trials: {nested: [1, .nan, \"💥\"]}\nsteps: .inf\nbogus: [[[]]]\n", encoding="utf-8")
    result = run_tuner(["launch", "--config", str(config)], cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "launch.yaml: trials: Input should be a valid integer" in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.yaml"]
