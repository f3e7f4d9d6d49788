"""End-of-launch verification and the export it leads to, driven by the in-process executor of
test_search; then ``tuner verify`` for real (Ray, TensorFlow) on two known configs. A launch's
own verification with real training is in test_launch.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import FIXTURES, run_tuner
from tests.test_search import STREAM, FakeExecutor, make_search
from tuner.cli import main
from tuner.driver import studyrecord
from tuner.driver.export import best_config, is_success
from tuner.driver.trialrecord import ATTR
from tuner.driver.verify import Plan, Runner, verify_study

CONFIGS = FIXTURES / "configs"


def run_and_verify(executor: FakeExecutor, lrs: list[float], plan: Plan, race_seeds: int = 4) -> optuna.Study:
    search = make_search(len(lrs), executor, optuna.samplers.RandomSampler(seed=0), race_seeds=race_seeds)
    for lr in lrs:
        search.study.enqueue_trial({"learning_rate": lr})
    search.run()
    verify_study(search.study, Runner(executor, "fake", report_every=20), plan, STREAM, race_seeds, say=lambda _: None)
    return search.study


def test_verify_study_exports_the_raced_best_with_its_verification_and_margin() -> None:
    plan = Plan(seeds=16, steps=400, min_survival=0.8, candidates=3, margin=True, margin_steps=200)
    study = run_and_verify(FakeExecutor(), [10**-2.5, 1e-3], plan)
    doc = best_config(study, "sqlite:///x.db", 200, "fake")
    assert list(doc) == ["config", "stability", "study"]
    assert list(doc["stability"]) == ["steps", "seeds", "steps_survived", "diverged", "val_loss", "learned",
                                      "init_val_loss", "rule", "verified", "margin"]
    verified = doc["stability"]["verified"]
    assert verified["seeds"] == list(STREAM.verify(16)) and verified["steps"] == 400
    assert (verified["survived"], verified["runs"], verified["met"]) == (16, 16, True)
    assert verified["rate"] == 1.0 and verified["rate_low"] >= 0.8
    assert not set(verified["seeds"]) & set(doc["stability"]["seeds"])  # never a seed it was chosen on
    assert "lowest validation loss" in doc["stability"]["rule"]
    assert doc["config"]["learning_rate"] == 10**-2.5 and doc["study"]["model"] == "fake"
    # lr x 1.5 = 10**-2.32 is still below 1e-2; x 5 = 0.016 diverges (fake: lr above 1e-2)
    assert doc["stability"]["margin"]["lr_factor"] == 3.0
    assert is_success(doc)
    yaml.safe_load(yaml.safe_dump(doc))  # a YAML document a person can read back


def test_verify_study_moves_to_the_next_candidate_when_the_best_fails_fresh_seeds() -> None:
    bad = frozenset(STREAM.verify(16)[5:6])  # one fresh seed breaks the fragile best config
    plan = Plan(seeds=16, steps=400, margin=False)
    study = run_and_verify(FakeExecutor(bad_seeds=bad), [10**-2.5, 1e-3], plan, race_seeds=2)
    verified = studyrecord.verifications(study)
    assert not verified[0].met and verified[0].divergences[0] == (next(iter(bad)), 150)
    assert verified[0].runs < 16  # the rest were cancelled once the bar was out of reach
    assert verified[1].met
    doc = best_config(study, "sqlite:///x.db", 200)
    assert doc["study"]["trial"] == 1 and is_success(doc)


def test_export_says_plainly_when_no_config_met_the_bar() -> None:
    bad = frozenset(STREAM.verify(16)[:1])
    plan = Plan(seeds=16, steps=400, candidates=1, margin=False)
    study = run_and_verify(FakeExecutor(bad_seeds=bad), [10**-2.5], plan, race_seeds=2)
    doc = best_config(study, "sqlite:///x.db", 200)
    assert doc["stability"]["verified"]["met"] is False
    assert "no config met the bar" in doc["stability"]["rule"] and "No config met the bar" in doc["note"]
    assert not is_success(doc)


def test_export_names_the_exported_trials_mlflow_run_and_keeps_the_one_an_older_record_holds() -> None:
    plan = Plan(seeds=16, steps=400, margin=False)
    study = run_and_verify(FakeExecutor(), [10**-2.5, 1e-3], plan)
    assert best_config(study, "sqlite:///x.db", 200)["study"]["mlflow_run_id"] is None  # no tracking
    runs = {0: "run-of-0", 1: "run-of-1"}  # what the launch asks the tracker once the search has ended
    assert best_config(study, "sqlite:///x.db", 200, runs=runs)["study"]["mlflow_run_id"] == "run-of-0"
    older = optuna.create_study(study_name=study.study_name)  # trial 0's record as the search wrote it before
    for key, value in study.user_attrs.items():
        older.set_user_attr(key, value)
    for t in study.trials:
        attrs = {**t.user_attrs, ATTR: {**t.user_attrs[ATTR], "run_id": f"written-by-the-search-{t.number}"}}
        older.add_trial(optuna.trial.create_trial(state=t.state, value=t.value, params=t.params,
                                                  distributions=t.distributions, user_attrs=attrs))
    doc = best_config(older, "sqlite:///x.db", 200, runs=runs)
    assert (doc["study"]["trial"], doc["study"]["mlflow_run_id"]) == (0, "written-by-the-search-0")


def test_export_never_calls_a_survivor_that_did_not_learn_a_success() -> None:
    plan = Plan(seeds=16, steps=400, margin=False)
    study = run_and_verify(FakeExecutor(), [1e-5], plan)  # survives, val loss 6.25 > 5.0 at init
    doc = best_config(study, "sqlite:///x.db", 200)
    assert doc["stability"]["learned"] is False and doc["stability"]["diverged"] is False
    assert "did not learn" in doc["note"] and not is_success(doc)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
@pytest.mark.parametrize(("config", "code", "survived", "verdict"), [
    # what an 8 x 300 launch exported before racing existed: 7 of 16 fresh seeds diverged
    ("unstable_iterated.yaml", 3, range(0, 13), "unstable: the 95% lower bound"),
    ("stable_iterated.yaml", 0, range(16, 17), "stable: the 95% lower bound 0.81 reaches --min-survival 0.8"),
])
def test_verify_command_judges_known_configs(
    tmp_path: Path, config: str, code: int, survived: range, verdict: str
) -> None:
    result = run_tuner(["verify", str(CONFIGS / config), "--steps", "900", "--seed", "1", "--num-cpus", "2"],
                       cwd=tmp_path)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-3000:]
    counts = re.findall(r"survived (\d+)/16 \(rate", result.stdout)
    assert counts and int(counts[-1]) in survived, result.stdout[-3000:]
    assert verdict in result.stdout


EVIL = '''
from pathlib import Path

Path(__file__).with_name("IMPORTED").write_text("this file ran")


class Evil:
    knobs = {}

    def build(self, knobs):
        raise RuntimeError("never built here")

    def data(self, knobs):
        raise RuntimeError("never read here")
'''


def _file_naming(tmp_path: Path, model: str) -> Path:
    """A best_config.yaml-shaped file whose study.model is ``model`` (its config has a knob no model has)."""
    path = tmp_path / "from_elsewhere.yaml"
    path.write_text(yaml.safe_dump({"config": {"learning_rate": 1e-3, "widht": 3}, "stability": {"steps": 10},
                                    "study": {"model": model}}))
    return path


def test_verify_never_imports_the_model_file_a_config_file_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "evil.py").write_text(EVIL)
    spec = f"{tmp_path / 'evil.py'}:Evil"
    assert main(["verify", str(_file_naming(tmp_path, spec))]) == 2
    err = capsys.readouterr().err
    assert not (tmp_path / "IMPORTED").exists()  # the file never ran
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"would import the file {tmp_path / 'evil.py'}" in err
    assert f"--model {spec}" in err and "--trust-file-model" in err


def test_verify_never_imports_the_module_a_config_file_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tuner_test_evil_module.py").write_text(EVIL)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["verify", str(_file_naming(tmp_path, "tuner_test_evil_module:Evil"))]) == 2
    err = capsys.readouterr().err
    assert not (tmp_path / "IMPORTED").exists() and "tuner_test_evil_module" not in sys.modules
    assert "would import module 'tuner_test_evil_module'" in err and "--trust-file-model" in err


@pytest.mark.parametrize("how", ["--model", "--trust-file-model"])
def test_verify_imports_the_named_model_file_when_the_command_line_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    (tmp_path / "evil.py").write_text(EVIL)
    spec = f"{tmp_path / 'evil.py'}:Evil"
    flags = ["--model", spec] if how == "--model" else ["--trust-file-model"]
    assert main(["verify", str(_file_naming(tmp_path, spec)), *flags]) == 2  # stopped by the config's unknown knob
    captured = capsys.readouterr()
    assert (tmp_path / "IMPORTED").exists()  # the model was loaded, and the file's config checked against it
    assert "'widht' is not a knob of model" in captured.err
    assert ("importing the file" in captured.out) == (how == "--trust-file-model")


def test_verify_uses_a_built_in_model_a_config_file_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(_file_naming(tmp_path, "counting_cnn"))]) == 2
    assert "'widht' is not a knob of model 'counting_cnn'" in capsys.readouterr().err
