"""examples/adding_lstm.py: a recurrent model none of tuner's rules was tuned on (issue 32).

Its data is the adding problem; an LSTM learns it in a few hundred steps, and a ReLU RNN with
identity recurrence diverges at a learning rate an LSTM takes.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ROOT
from tuner.models import load_model
from tuner.records import RunSpec, RunStatus, TrainConfig

SPEC = f"{ROOT / 'examples' / 'adding_lstm.py'}:AddingRNN"


def test_adding_problem_marks_one_value_in_each_half_and_sums_them() -> None:
    model = load_model(SPEC)
    data = model.data({**{k: v.default for k, v in model.knobs.items()}, "seq_len": 12})
    x, y = data.train
    assert x.shape == (4096, 12, 2) and y.shape == (4096, 1)
    markers = x[:, :, 1]
    assert (markers.sum(axis=1) == 2).all()
    assert (markers[:, :6].sum(axis=1) == 1).all() and (markers[:, 6:].sum(axis=1) == 1).all()
    np.testing.assert_allclose(y[:, 0], (x[:, :, 0] * markers).sum(axis=1), rtol=1e-6)


def train(cell: str, learning_rate: float, steps: int, seq_len: int = 20) -> list:
    from tuner.worker.train import train_run

    model = load_model(SPEC)
    knobs = {**{k: v.default for k, v in model.knobs.items()}, "cell": cell, "seq_len": seq_len}
    spec = RunSpec(0, 0, SPEC, TrainConfig(learning_rate, knobs=knobs), steps=steps, report_every=100)
    return list(train_run(model, model.data(knobs), spec))


@pytest.mark.tf
def test_lstm_learns_the_sum_where_always_one_scores_a_sixth() -> None:
    final = train("lstm", 1e-2, 600)[-1]
    assert final.status is RunStatus.SURVIVED
    assert final.val_loss is not None and final.val_loss < 0.05  # answering 1.0 always: about 0.167


@pytest.mark.tf
def test_irnn_diverges_where_the_lstm_trains() -> None:
    final = train("irnn", 1e-1, 100, seq_len=50)[-1]
    assert final.status is RunStatus.DIVERGED
    assert final.forensics is not None
    assert train("lstm", 1e-1, 100, seq_len=50)[-1].status is RunStatus.SURVIVED
