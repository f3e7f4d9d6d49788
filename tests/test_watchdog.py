"""The watchdog's deadlines come from the model's own pace (tuner.driver.watchdog); the real case, a
launch whose model hangs in its build, is tests/test_fault_matrix.py's."""

from __future__ import annotations

from tuner.driver.watchdog import FIRST, FLOOR, Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_before_any_pace_a_run_may_be_silent_for_the_first_deadline() -> None:
    clock = Clock()
    dog = Watchdog(clock=clock)
    dog.started("a")
    clock.now = FIRST - 1
    assert dog.overdue() == []
    clock.now = FIRST + 1
    assert dog.overdue() == [("a", f"no progress for {FIRST + 1:.0f} s while building the graph")]


def test_a_hung_build_is_ended_at_the_floor_where_other_builds_took_seconds() -> None:
    clock = Clock()
    dog = Watchdog(clock=clock)
    dog.started("fast")
    clock.now = 3.0  # built and reported in 3 s
    dog.heard("fast", 25)
    dog.forget("fast")  # it ended
    dog.started("hung")
    assert dog.deadline(building=True) == FLOOR  # 10 x 3 s is below the floor
    clock.now = 3.0 + FLOOR + 1
    assert [run for run, _ in dog.overdue()] == ["hung"]


def test_a_slow_model_sets_its_own_longer_deadline_and_a_stuck_step_is_named() -> None:
    clock = Clock()
    dog = Watchdog(clock=clock)
    dog.started("slow")
    clock.now = 50.0  # a 50-s build
    dog.heard("slow", 25)
    clock.now = 80.0  # 30 s between two reports
    dog.heard("slow", 50)
    assert dog.deadline(building=True) == 500.0 and dog.deadline(building=False) == 300.0
    clock.now = 80.0 + 301
    assert dog.overdue() == [("slow", "no progress for 301 s after step 50")]
    dog.forget("slow")
    assert dog.overdue() == []


def test_forensics_after_a_divergence_are_judged_as_a_build_and_a_fixed_timeout_overrides() -> None:
    clock = Clock()
    dog = Watchdog(fixed=20.0, clock=clock)
    dog.started("a")
    clock.now = 5.0
    dog.heard("a", 7, diverged=True)
    clock.now = 26.0
    assert dog.overdue() == [("a", "no progress for 21 s after step 7 (its forensics)")]
