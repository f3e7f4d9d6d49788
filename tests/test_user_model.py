"""A user's model file: loading, shipping to Ray workers, and launches (one node and two nodes)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster import start_cluster
from tests.conftest import FINISHED, FIXTURES, NO_VERIFY, ROOT, run_tuner
from tuner.environ import SHIPPED_FILE as SHIPPED_ENV
from tuner.errors import ModelError
from tuner.models import load_model, runtime_env

EXAMPLE = ROOT / "examples" / "my_iterated_model.py"
SPACE = ROOT / "examples" / "my_iterated_model.yaml"
# appended to a copy of the example: each worker that imports it logs its node and where it found it
IMPORT_LOG = '''
import os as _os

if _os.environ.get("TUNER_TEST_IMPORT_LOG"):
    import ray as _ray

    with open(_os.environ["TUNER_TEST_IMPORT_LOG"], "a") as _log:
        _log.write(f"{_ray.get_runtime_context().get_node_id()} {__file__}\\n")
'''


def finished_states(storage: str, study: str) -> list[str]:
    import optuna

    return [t.state.name for t in optuna.load_study(study_name=study, storage=storage).trials]


def test_runtime_env_ships_a_model_file_and_names_it_for_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    env = runtime_env(f"{EXAMPLE}:MyIteratedModel")
    assert env == {"py_modules": [str(EXAMPLE)], "env_vars": {SHIPPED_ENV: str(EXAMPLE)}}
    monkeypatch.chdir(ROOT)  # a relative spec: Ray gets the file, the workers get the spec as typed
    env = runtime_env("examples/my_iterated_model.py:MyIteratedModel")
    assert env == {"py_modules": [str(EXAMPLE)], "env_vars": {SHIPPED_ENV: "examples/my_iterated_model.py"}}
    assert runtime_env("iterated_mlp") == {} and runtime_env("tuner.models.iterated_mlp:IteratedMLP") == {}


def test_runtime_env_refuses_a_file_named_like_another_module(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "json.py")
    with pytest.raises(ModelError, match=r"json.py as module 'json', but another module has that name.*rename"):
        runtime_env(f"{tmp_path / 'json.py'}:MyIteratedModel")


def test_load_model_on_a_worker_imports_the_shipped_module_not_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "unpacked"  # where Ray unpacked py_modules on the worker (on its sys.path)
    shipped.mkdir()
    shutil.copy(EXAMPLE, shipped / "shipped_example_7f3a.py")
    monkeypatch.syspath_prepend(str(shipped))
    driver_path = "/nowhere/on/this/node/shipped_example_7f3a.py"
    monkeypatch.setenv(SHIPPED_ENV, driver_path)
    model = load_model(f"{driver_path}:MyIteratedModel")
    assert Path(sys.modules[type(model).__module__].__file__ or "") == shipped / "shipped_example_7f3a.py"
    monkeypatch.delenv(SHIPPED_ENV)
    with pytest.raises(ModelError, match="does not exist"):  # without the runtime env: the path, which is not here
        load_model(f"{driver_path}:MyIteratedModel")


def test_launch_a_bad_model_file_stops_with_one_message(tmp_path: Path) -> None:
    result = run_tuner(["launch", "--model", f"{FIXTURES / 'bad_models' / 'bad_range.py'}:BadRange",
                        "--storage", f"sqlite:///{tmp_path / 't.db'}", "--no-tracking"], cwd=tmp_path)
    assert result.returncode == 2
    assert "tuner: error: model" in result.stderr and "knob range low=10 is above high=1" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "t.db").exists()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_launch_the_example_model_end_to_end(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    result = run_tuner([
        "launch", "--model", f"{EXAMPLE}:MyIteratedModel", "--space", str(SPACE), "--trials", "2",
        "--steps", "60", "--seeds", "2", "--num-cpus", "2", "--study", "example", "--storage", storage,
        "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--out", str(tmp_path / "best.yaml"), *NO_VERIFY,
    ], cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    states = finished_states(storage, "example")
    assert len(states) == 2 and set(states) <= {"COMPLETE", "PRUNED"}, states
    config = yaml.safe_load((tmp_path / "best.yaml").read_text())["config"]
    assert {"learning_rate", "clip_norm", "max_iter", "bn_order", "epsilon", "input_clip"} <= set(config)


@pytest.fixture
def two_node_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A head node with no CPU (it hosts no trial) and a worker node with 1 CPU, by ``ray start``.

    Yields the head's address and the log that the test model's imports write to: the nodes'
    processes (and so the workers) have ``TUNER_TEST_IMPORT_LOG``; the driver started later has not.
    """
    log = tmp_path / "imports.log"
    monkeypatch.setenv("TUNER_TEST_IMPORT_LOG", str(log))
    nodes = start_cluster(head_cpus=0, workers=1, worker_cpus=1)
    monkeypatch.delenv("TUNER_TEST_IMPORT_LOG")
    try:
        yield nodes.address, log
    finally:
        nodes.stop()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
@pytest.mark.cluster
def test_launch_user_model_on_two_nodes_imports_it_from_the_runtime_env(
    tmp_path: Path, two_node_cluster: tuple[str, Path]
) -> None:
    address, log = two_node_cluster
    driver_side = tmp_path / "driver_only"  # not the launch's cwd: no worker can import from here by chance
    driver_side.mkdir()
    model = driver_side / "user_iterated_model.py"
    model.write_text(EXAMPLE.read_text() + IMPORT_LOG)
    storage = f"sqlite:///{tmp_path / 't.db'}"
    result = run_tuner([
        "launch", "--address", address, "--model", f"{model}:MyIteratedModel", "--space", str(SPACE),
        "--trials", "2", "--steps", "60", "--seeds", "2", "--study", "two_nodes", "--storage", storage,
        "--no-tracking", "--out", str(tmp_path / "best.yaml"), *NO_VERIFY,
    ], cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    states = finished_states(storage, "two_nodes")
    assert len(states) == 2 and set(states) <= {"COMPLETE", "PRUNED"}, states
    imports = [entry.split(" ", 1) for entry in log.read_text().splitlines()]
    assert imports, "no worker imported the model"
    for _, file in imports:  # every worker took the module Ray shipped, never the driver's file
        assert "py_modules_files" in file and Path(file).name == model.name, file
        assert Path(file).resolve() != model.resolve()
