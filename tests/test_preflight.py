"""Data preflight: planted faults are found with their indices; a launch stops, or skips them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FIXTURES, NO_VERIFY, run_tuner
from tuner.errors import DataError
from tuner.models import load_model
from tuner.models.counting_cnn import CountingCNN
from tuner.models.data import Faults
from tuner.preflight import check_data, preflight, without
from tuner.records import Skip

SMALL = {"train_size": 400, "val_size": 40}
NAN_LABELS_MODEL = f"{FIXTURES / 'faulty_cnn.py'}:NanLabels"


def defaults(model) -> dict:
    return {name: knob.default for name, knob in model.knobs.items()}


def findings_of(faults: Faults) -> tuple[dict[str, tuple[int, ...]], tuple[np.ndarray, np.ndarray]]:
    model = CountingCNN(faults=faults, **SMALL)
    data = model.data(defaults(model))
    return {f.what.split(" [")[0]: f.indices for f in check_data(data).findings}, data.train


@pytest.mark.parametrize("spec", ["iterated_mlp", "counting_cnn"])
@pytest.mark.parametrize("scaling", ["raw", "unit"])
def test_check_data_builtin_models_are_clean(spec: str, scaling: str) -> None:
    """Raw pixels are what counting_cnn expects whatever its input_scaling: nothing is flagged."""
    model = load_model(spec)
    knobs = defaults(model) | ({"input_scaling": scaling} if spec == "counting_cnn" else {})
    assert check_data(model.data(knobs)).findings == ()


def test_check_data_finds_planted_nan_labels_at_their_indices() -> None:
    found, (_, labels) = findings_of(Faults(nan_labels=0.05))
    assert found == {"a non-finite label": tuple(np.flatnonzero(np.isnan(labels)))}
    assert len(found["a non-finite label"]) == 20


def test_check_data_finds_negative_labels_corrupt_and_unscaled_images() -> None:
    found, (images, labels) = findings_of(Faults(negative_labels=0.02, corrupt_images=0.02, unscaled_images=0.02))
    corrupt = np.isnan(images).all(axis=(1, 2, 3))
    assert found["a label outside the declared range"] == tuple(np.flatnonzero(labels < 0))
    assert found["a corrupt input"] == tuple(np.flatnonzero(corrupt))
    unscaled = (np.nan_to_num(images) > 255).any(axis=(1, 2, 3))
    assert found["an input outside the expected range"] == tuple(np.flatnonzero(unscaled & ~corrupt))


def test_check_data_says_unscaled_input() -> None:
    model = CountingCNN(faults=Faults(unscaled_images=0.01), **SMALL)
    (finding,) = check_data(model.data(defaults(model))).findings
    assert "unscaled input where the model expects scaled input" in finding.line()
    assert "[0, 255]" in finding.line()


def test_preflight_stops_with_count_and_first_indices() -> None:
    model = CountingCNN(faults=Faults(nan_labels=0.05), **SMALL)
    labels = model.data(defaults(model)).train[1]
    first = ", ".join(map(str, np.flatnonzero(np.isnan(labels))[:10]))
    with pytest.raises(DataError, match=f"20 sample\\(s\\) with a non-finite label .*first indices: {first}, ..."):
        preflight(model, defaults(model), "cnn", allow_bad=False)
    with pytest.raises(DataError, match="pass --allow-bad-data to skip these 20 sample"):
        preflight(model, defaults(model), "cnn", allow_bad=False)


def test_preflight_allow_bad_data_returns_samples_to_skip() -> None:
    model = CountingCNN(faults=Faults(nan_labels=0.05), **SMALL)
    skip, text = preflight(model, defaults(model), "cnn", allow_bad=True)
    labels = model.data(defaults(model)).train[1]
    assert skip == Skip(train=tuple(np.flatnonzero(np.isnan(labels))))
    assert "skipping 20 of 400 training and 0 of 40 validation samples" in text


def test_without_drops_skipped_samples_and_maps_indices_back() -> None:
    model = CountingCNN(faults=Faults(nan_labels=0.05), **SMALL)
    data = model.data(defaults(model))
    skip = Skip(train=tuple(np.flatnonzero(np.isnan(data.train[1]))), val=(0, 1))
    trimmed, ids = without(data, skip)
    assert trimmed.size == 380 and len(trimmed.val[0]) == 38
    assert not np.isnan(trimmed.train[1]).any()
    assert np.array_equal(trimmed.train[0][5], data.train[0][ids[5]])
    assert check_data(trimmed).findings == ()


@pytest.mark.slow
def test_launch_nan_labels_stops_before_anything_starts(tmp_path: Path) -> None:
    result = run_tuner(
        ["launch", "--model", NAN_LABELS_MODEL, "--storage", f"sqlite:///{tmp_path / 't.db'}",
         "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"], cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "train: 5 sample(s) with a non-finite label (NaN or Inf); first indices: " in result.stderr
    assert "pass --allow-bad-data" in result.stderr
    assert not (tmp_path / "t.db").exists() and not (tmp_path / "m.db").exists()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_launch_allow_bad_data_skips_samples_and_trains_clean(tmp_path: Path) -> None:
    """With mse a NaN label in a batch diverges the run: every trial surviving shows the skip reached the workers."""
    import optuna
    from mlflow.tracking import MlflowClient

    result = run_tuner(
        ["launch", "--model", NAN_LABELS_MODEL, "--space", str(FIXTURES / "spaces" / "cnn_mse.yaml"),
         "--trials", "2", "--steps", "80", "--seeds", "1", "--num-cpus", "2", "--study", "bad",
         "--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
         "--out", str(tmp_path / "best.yaml"), "--allow-bad-data", *NO_VERIFY], cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "skipping 5 of 512 training and 0 of 64 validation samples" in result.stdout
    study = optuna.load_study(study_name="bad", storage=f"sqlite:///{tmp_path / 't.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bad").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
    assert parent.data.tags["preflight_skipped_train"] == "5"


def test_check_data_unlabelled_single_array_is_checked_as_an_input() -> None:
    model = load_model(f"{FIXTURES / 'autoencoder.py'}:NanInput")
    (finding,) = check_data(model.data(defaults(model))).findings
    assert (finding.split, finding.what, finding.indices) == ("train", "a non-finite input", (7,))
    clean = load_model(f"{FIXTURES / 'autoencoder.py'}:Autoencoder")
    assert check_data(clean.data(defaults(model))).findings == ()


def test_check_data_flags_a_float64_input_that_overflows_float32_with_sample_feature_and_value() -> None:
    model = load_model(f"{FIXTURES / 'autoencoder.py'}:Autoencoder")
    data = model.data(defaults(model))
    x = data.train[0].copy()
    x[9, 4] = 1.2e39  # finite in float64, Inf once fed to a float32 placeholder
    (finding,) = check_data(replace(data, train=(x,))).findings
    assert (finding.what, finding.indices) == ("an input that overflows float32 when fed", (9,))
    assert finding.detail.startswith("sample 9, feature 4: 1.2e+39 overflows float32")
    assert check_data(replace(data, train=(x,)), dtypes=[np.float64]).findings == ()  # a float64 placeholder
