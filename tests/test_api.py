"""The Python API (tuner.api): the same options, checks and answer as the command line, as objects.

The unit tests read real Optuna studies and build real models without TensorFlow; one launch trains
for real, with a model class defined in this test module, shipped to the Ray workers by value.
"""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

import tuner
import tuner.answer
import tuner.api
from tests.test_report import verified_study
from tuner.answer import BestConfig
from tuner.cli import LAUNCH_FLAGS
from tuner.config import LaunchConfig
from tuner.driver.export import best_config, is_success
from tuner.environ import OBJECT_MODEL as OBJECT_ENV
from tuner.environ import OBJECT_SPEC as OBJECT_SPEC_ENV
from tuner.models import Knob, load_model, object_spec, runtime_env
from tuner.models.iterated_mlp import IteratedMLP


class NotebookMLP(IteratedMLP):
    """A model class defined outside any installed package, as in a notebook cell."""

    knobs = {**IteratedMLP.knobs, "cell_knob": Knob("int", 2, 1, 3, help="a knob of this class alone")}


class NoBuild:
    knobs: dict[str, object] = {}

    def data(self, knobs: object) -> None:
        return None


@pytest.mark.parametrize("module", [tuner.api, tuner.answer], ids=lambda m: m.__name__)
def test_api_docstring_examples_run(module: object) -> None:
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert attempted >= 2 and failed == 0


def test_api_import_tuner_is_cheap_and_states_its_public_names() -> None:
    code = ("import sys, tuner; print(sorted(m for m in ('optuna', 'ray', 'tensorflow', 'mlflow', 'pandas') "
            "if m in sys.modules)); print(tuner.launch.__module__, tuner.Result.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"  # nothing heavy until a name is used
    assert out[1] == "tuner.api Result"
    for name in tuner.__all__:
        assert getattr(tuner, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tuner.nope  # noqa: B018


def test_api_launch_options_are_the_cli_flags_one_definition() -> None:
    # every flag the command takes is a keyword of tuner.launch: both are LaunchConfig's fields
    assert set(LAUNCH_FLAGS) == set(LaunchConfig.model_fields)
    with pytest.raises(tuner.ConfigError, match=r"^tuner.launch\(\): steps: Input should be greater"):
        tuner.launch(steps=0)
    with pytest.raises(tuner.ConfigError, match="pruner: Input should be 'none', 'behind'"):
        tuner.launch(pruner="hyperband")


def test_api_bad_input_is_one_tuner_error_with_the_cli_line(tmp_path: Path) -> None:
    with pytest.raises(tuner.ModelError, match="unknown model 'nope'"):
        tuner.launch("nope", storage=f"sqlite:///{tmp_path / 't.db'}", no_tracking=True)
    with pytest.raises(tuner.ModelError, match="missing build: add a method"):
        tuner.launch(NoBuild)
    with pytest.raises(tuner.ConfigError, match="no such study"):
        optuna.create_study(study_name="other", storage=f"sqlite:///{tmp_path / 't.db'}")
        tuner.load("absent", f"sqlite:///{tmp_path / 't.db'}")
    with pytest.raises(tuner.ConfigError, match=r"--seeds 4 cannot reach --min-survival 0\.8"):
        tuner.verify({"config": {"learning_rate": 0.01}}, seeds=4)
    with pytest.raises(tuner.TunerError, match=r"expected a best_config\.yaml path, its mapping"):
        tuner.verify([1, 2])
    assert not (tmp_path / "best_config.yaml").exists()


def test_api_model_objects_get_a_spec_and_ship_by_value_to_a_fresh_process() -> None:
    assert object_spec(IteratedMLP) == "iterated_mlp"  # a built-in stays a name
    spec = object_spec(NotebookMLP)
    assert spec == "object:NotebookMLP"
    assert LaunchConfig(model=spec).study_name == "NotebookMLP"
    env = runtime_env(spec)["env_vars"]
    assert env[OBJECT_SPEC_ENV] == spec
    # a worker: another interpreter that never imported this test module
    code = ("from tuner.models import load_model; m = load_model('object:NotebookMLP'); "
            "print(type(m).__name__, m.knobs['cell_knob'].high)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env={**os.environ, **env}, check=True).stdout
    assert out.split() == ["NotebookMLP", "3"]
    instance = NotebookMLP()
    assert object_spec(instance) == spec and load_model(spec) is instance  # an instance is used as it is


def test_api_a_model_too_large_to_ship_is_refused_saying_why() -> None:
    class Heavy(IteratedMLP):
        blob = os.urandom(200_000)

    with pytest.raises(tuner.ModelError, match=r"KiB .* holds large data"):
        object_spec(Heavy)


def test_api_an_object_spec_from_another_process_says_how_to_give_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OBJECT_ENV, raising=False)
    with pytest.raises(tuner.ModelError, match=r"give it again: tuner.verify\(..., model=Gone\)"):
        load_model("object:Gone")


def test_api_best_config_types_the_exported_document_key_for_key(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    doc = best_config(verified_study(storage), storage, 100, "iterated_mlp")
    answer = BestConfig.of(doc)
    assert answer.to_dict() == doc and list(answer.to_dict()) == list(doc)
    assert answer.trusted is is_success(doc) is True
    assert answer.stability.verified is not None and answer.stability.verified.survived == 16
    assert answer.stability.margin is not None and answer.stability.margin.lr_factor == 3.0
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert BestConfig.read(path) == answer
    with pytest.raises(tuner.ConfigError, match=r"stability: Field required"):
        BestConfig.of({"config": {}, "study": doc["study"]})


def test_api_load_gives_the_answer_the_records_a_dataframe_and_figures(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    verified_study(storage)
    result = tuner.load("v", storage, tracking_uri=f"sqlite:///{tmp_path / 'absent.db'}")
    assert result.answer == BestConfig.of(best_config(optuna.load_study(study_name="v", storage=storage),
                                                      storage, 100))
    assert result.trusted and result.reason.startswith("verified 16/16")
    assert result.best is not None and result.best.number == 0 and result.best.chosen
    assert result.config == result.answer.config and result.tracking_uri is None  # absent.db: nothing created
    assert not (tmp_path / "absent.db").exists()
    frame = result.trials_dataframe()
    assert list(frame["number"]) == [0, 1, 2, 3]
    assert list(frame["state"]) == ["survived", "survived", "survived", "diverged"]
    assert list(frame["chosen"]) == [True, False, False, False]
    assert "params_learning_rate" in frame.columns and frame.loc[0, "verified_met"] == True  # noqa: E712
    seeds = result.trials_dataframe(seeds=True)
    assert len(seeds) == sum(len(t.seeds) for t in result.trials) and "seed_state" in seeds.columns
    for fig in (result.plot_stability_map(), result.plot_survival()):
        assert fig.axes and "trial" in fig._suptitle.get_text()
    assert "tuner.Result study='v' trials=4: trial 0, verified 16/16" in repr(result)


def test_api_load_of_a_study_without_a_finished_trial_has_no_answer(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    optuna.create_study(study_name="empty", storage=storage)
    result = tuner.load("empty", storage)
    assert result.answer is None and not result.trusted and result.config == {} and result.best is None
    assert "no trial has finished" in result.reason


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_api_launch_of_a_class_then_load_and_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = tuner.launch(NotebookMLP, trials=2, steps=40, seeds=1, race_seeds=0, verify_seeds=2, margin=False,
                          min_survival=0.0, num_cpus=2, storage="sqlite:///t.db", tracking_uri="sqlite:///m.db",
                          out="best.yaml", progress=False)
    assert result.study == "NotebookMLP" and len(result.trials) == 2
    assert result.answer is not None and result.answer.study.model == "object:NotebookMLP"
    assert result.answer.to_dict() == yaml.safe_load(Path("best.yaml").read_text())
    assert result.out == tmp_path / "best.yaml" and result.experiment_id is not None
    assert result.trusted == (result.answer.stability.verified is not None and result.answer.stability.verified.met)
    assert "cell_knob" in result.config  # the class's own knobs
    assert all(t.state.value != "failed" for t in result.trials)  # its workers unpickled it (else: ModelError)
    assert tuner.load("NotebookMLP", "sqlite:///t.db", "sqlite:///m.db").answer == result.answer
    # the same call again: the study has its trials, nothing is trained, the same answer
    again = tuner.launch(NotebookMLP, trials=2, steps=40, seeds=1, race_seeds=0, verify_seeds=2, margin=False,
                         min_survival=0.0, num_cpus=2, storage="sqlite:///t.db", tracking_uri="sqlite:///m.db",
                         out="best.yaml", progress=False)
    assert again.answer == result.answer
    evidence = tuner.verify(result, seeds=2, steps=30, min_survival=0.0, num_cpus=2, progress=False)
    assert evidence.runs + evidence.failed == 2 and evidence.steps == 30
    assert not set(evidence.seeds) & set(result.answer.stability.seeds)  # fresh seeds


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_api_launch_of_a_class_after_the_notebooks_own_ray_init_ships_it_to_the_workers(
        ray_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray already started in this process (here by the session's cluster, in a notebook by the user's
    own ``ray.init()``): tuner joins it, and the class it was given still reaches every worker."""
    import ray

    assert ray.is_initialized()
    monkeypatch.chdir(tmp_path)
    result = tuner.launch(NotebookMLP, trials=1, steps=20, seeds=1, race_seeds=0, verify_seeds=0, margin=False,
                          storage="sqlite:///t.db", tracking_uri="sqlite:///m.db", out="best.yaml", progress=False)
    assert [t.state.value for t in result.trials] != ["failed"], result.trials  # else: ModelError on the worker
    assert result.answer is not None and result.answer.study.model == "object:NotebookMLP"
    assert ray.is_initialized()  # the notebook's Ray is left running


def test_repo_has_the_api_doc() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    for name in ("tuner.launch", "tuner.load", "tuner.verify", "trials_dataframe", "plot_stability_map",
                 "Interrupted"):
        assert name in text
