"""The evidence behind an export: the Wilson bound, the seed stream, the selection rule, the margin."""

from __future__ import annotations

import pytest

from tuner.driver.evidence import (
    VERIFY_RANGE,
    Margin,
    SeedStream,
    Verification,
    bar_reachable,
    choose,
    fresh_seeds,
    wilson_lower,
)


def test_wilson_lower_matches_the_closed_form_values() -> None:
    # n / (n + z^2) for k = n; the textbook 95% interval for 8/10 starts at 0.490
    assert wilson_lower(16, 16) == pytest.approx(16 / (16 + 1.959963984540054**2))
    assert wilson_lower(16, 16) == pytest.approx(0.8063, abs=1e-4)
    assert wilson_lower(8, 10) == pytest.approx(0.4902, abs=1e-4)
    assert wilson_lower(15, 16) == pytest.approx(0.7167, abs=1e-4)
    assert wilson_lower(0, 16) == 0.0
    assert wilson_lower(0, 0) == 0.0


def test_bar_reachable_only_while_the_remaining_runs_could_lift_the_bound() -> None:
    assert bar_reachable(0, 16, 0.8)
    assert not bar_reachable(1, 16, 0.8)  # 15/16 tops out at 0.72
    assert bar_reachable(1, 32, 0.8)  # 31/32 reaches 0.84


def test_seed_stream_is_deterministic_and_keeps_verification_seeds_apart() -> None:
    stream = SeedStream(123)
    assert stream.search(3, 2) == SeedStream(123).search(3, 2)
    assert stream.search(3, 2) != stream.search(4, 2)  # each trial its own seeds
    assert stream.race(4)[:2] == stream.race(2)  # race seeds are one shared sequence
    chosen = {*stream.race(64), *(s for t in range(200) for s in stream.search(t, 2))}
    verify = set(stream.verify(64))
    assert all(VERIFY_RANGE[0] <= s < VERIFY_RANGE[1] for s in verify)
    assert not chosen & verify and len(verify) == 64
    assert SeedStream.new(0) == SeedStream.new(0) and SeedStream.new(None) != SeedStream.new(None)


def test_fresh_seeds_never_reuse_an_excluded_seed() -> None:
    first = fresh_seeds(16, seed=5)
    again = fresh_seeds(16, exclude=first[:4], seed=5)
    assert len(set(again)) == 16 and not set(again) & set(first[:4])
    assert fresh_seeds(3) != fresh_seeds(3)  # random without a seed


def verification(survived: int, runs: int, val: float = 0.1, init: float = 1.0) -> Verification:
    return Verification(seeds=tuple(range(runs)), steps=100, survived=survived, runs=runs, min_survival=0.8,
                        val_loss=val, init_val_loss=init)


def test_choose_takes_the_best_loss_among_configs_that_meet_the_bar() -> None:
    verified = {1: (0.01, verification(15, 16)), 2: (0.05, verification(16, 16)), 3: (0.09, verification(16, 16))}
    choice = choose(verified, 0.8)
    assert choice is not None and choice.trial == 2 and choice.met
    assert "lowest validation loss" in choice.rule and "2 met the bar" in choice.rule


def test_choose_falls_back_to_the_highest_lower_bound_and_says_none_met_the_bar() -> None:
    verified = {1: (0.01, verification(3, 4)), 2: (0.05, verification(14, 16)), 3: (0.02, verification(16, 16, 2.0))}
    choice = choose(verified, 0.8)
    assert choice is not None and not choice.met and choice.trial == 3  # 16/16 but did not learn: still highest
    assert "no config met the bar" in choice.rule
    assert choose({}, 0.8) is None


def test_verification_round_trips_and_derives_rate_and_bound() -> None:
    v = verification(9, 16)
    doc = v.to_dict()
    assert doc["rate"] == pytest.approx(9 / 16, abs=1e-4)
    assert doc["rate_low"] == pytest.approx(wilson_lower(9, 16), abs=1e-4)
    assert doc["met"] is False and Verification.from_dict(doc) == v
    assert verification(16, 16).met and not verification(16, 16, val=1.5).met  # did not learn


def test_margin_lr_sensitivity_counts_diverged_factors_as_the_loss_at_init() -> None:
    # the top-down sweep: x5 and x3 diverged, x2 survived (x1.5 not needed)
    margin = Margin(2.0, 100, 16, {5.0: "diverged", 3.0: "diverged", 2.0: "survived"},
                    {1.0: 0.1, 5.0: None, 3.0: None, 2.0: 0.3}, init_val_loss=1.0)
    # factors 1, 2, 3, 5 -> 0.1, 0.3, 1.0 (diverged), 1.0 (diverged); best 0.1
    assert margin.lr_sensitivity == pytest.approx((0.1 + 0.3 + 1.0 + 1.0) / 4 - 0.1)
    assert Margin.from_dict(margin.to_dict()) == margin
