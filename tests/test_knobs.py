"""Tuner's own knobs: one table (tuner.knobs.TABLE), and everything that names them agrees with it.

A knob added to the table but not to TrainConfig, or to TrainConfig but not to the table, or that
neither reaches the graph's run-time inputs nor keys the graph, fails here.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from tuner.knobs import DEFAULTS, GRAPH_KNOBS, INPUTS, TABLE, TUNER_KNOBS, run_inputs
from tuner.models.base import Knob
from tuner.records import TrainConfig
from tuner.spaces import default_space

NAMES = [k.name for k in TABLE]


def _other_value(knob: Knob) -> Any:
    """A valid value of ``knob`` other than its default."""
    if knob.kind == "categorical":
        return next(c for c in knob.choices if c != knob.default)
    assert knob.low is not None and knob.high is not None
    return knob.high if knob.default != knob.high else knob.low


def test_table_names_are_trainconfig_fields_in_order_with_the_table_defaults() -> None:
    tuner_fields = [f for f in fields(TrainConfig) if f.name != "knobs"]
    assert [f.name for f in tuner_fields] == NAMES
    for f in tuner_fields:
        if f.default is not MISSING:  # the learning rate has none: a TrainConfig always names it
            assert f.default == DEFAULTS[f.name], f.name


def test_table_is_what_a_search_space_knows_as_tuners_knobs() -> None:
    assert list(TUNER_KNOBS) == NAMES
    space = default_space("none", {})
    assert list(space.params) == NAMES
    assert set(TrainConfig(1e-3).flat()) == set(NAMES)


def test_every_knob_is_fed_at_run_time_or_keys_the_graph_never_both() -> None:
    """Changing a fed knob changes the graph's run-time inputs and not the graph key; changing
    any other changes the graph key (the optimizer also changes the TF defaults fed for null knobs)."""
    assert set(GRAPH_KNOBS) == {k.name for k in TABLE if not k.inputs}
    assert len(INPUTS) == len(set(INPUTS))
    base = TrainConfig(1e-3)
    for k in TABLE:
        changed = TrainConfig.from_flat({**base.flat(), k.name: _other_value(k.knob)})
        assert changed != base, k.name
        fed = run_inputs(changed.flat(), changed.optimizer) != run_inputs(base.flat(), base.optimizer)
        keyed = changed.graph_key() != base.graph_key()
        assert keyed == (not k.inputs), k.name
        assert fed or not k.inputs, k.name


@pytest.mark.parametrize("overrides", [
    {},
    {"clip_norm": 2.0, "l2_weight": None, "optimizer": "rmsprop", "rho": 0.5, "clip_mode": "value"},
    {"learning_rate": 1, "momentum": 0.9, "optimizer_epsilon": 1e-7, "max_iter": 4},
])
def test_from_flat_inverts_flat(overrides: dict[str, Any]) -> None:
    config = TrainConfig.from_flat({"learning_rate": 1e-2, **overrides})
    assert TrainConfig.from_flat(config.flat()) == config
    assert config.l2_weight == 0.0  # null L2 weight: no L2 term


@pytest.mark.tf
def test_hyper_reads_every_run_time_input_of_the_table() -> None:
    """The graph has one run-time input per table input, and each is used by an op of the graph
    (RMSProp and global clipping use them all)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
    from planted import Planted

    from tuner.worker.train import Hyper, build

    model = Planted()
    knobs = {k: v.default for k, v in model.knobs.items()}
    built = build(model, TrainConfig(1e-3, clip_norm=1.0, optimizer="rmsprop", knobs=knobs), 0)
    assert Hyper.NAMES == INPUTS
    assert list(built.hyper.inputs) == list(INPUTS)
    unused = [name for name, tensor in built.hyper.inputs.items() if not tensor.consumers()]
    assert unused == []
