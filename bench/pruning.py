"""Pruning: how much training a search saves by stopping diverged trials, and how fast it stops them.

A study on iterated_mlp's shipped (default) space, driven through the public API
(``tuner.search.Search`` on a ``tuner.executor.RayExecutor``, an in-memory Optuna study, no
MLflow), with a callback that timestamps every record as the driver receives it. Figures:

- steps fraction: steps actually trained (all seed runs) / steps of a search that trains every
  trial to its budget (trials x seeds x steps);
- cancel latency: from the driver receiving a seed's divergence (the alarm record the worker
  streams at the divergence step, before its forensics replay) to receiving its siblings'
  CANCELLED records; were there no alarm, the diverged seed's ``forensics_seconds`` would be
  added (the replay then runs before the worker sends anything);
- report interval: the median time between two progress records of a run, the unit in which the
  goal (siblings cancelled within one report interval) is stated.

    .venv/bin/python bench/pruning.py [--repeats 3] [--trials 16] [--steps 600] [--seeds 2] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchlib import median, print_header, table, write_json


class Clock:
    """A search callback: every record with the time the driver received it."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, Any]] = []  # (perf_counter seconds, RunRecord)

    def on_trial_start(self, number: int, config: Any) -> None:
        """Nothing to time."""

    def on_trial_result(self, record: Any) -> None:
        """Timestamp the record."""
        self.arrivals.append((time.perf_counter(), record))

    def on_trial_complete(self, outcome: Any) -> None:
        """Nothing to time."""


def one_study(executor: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run one study; its figures."""
    import optuna

    from tuner.config import SPACES_DIR
    from tuner.models import load_model
    from tuner.search import Budget, Search
    from tuner.spaces import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACES_DIR / "iterated_mlp.yaml", "iterated_mlp", load_model("iterated_mlp").knobs)
    sampler = optuna.samplers.TPESampler(seed=args.seed, multivariate=True, constant_liar=True)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if args.smoke:  # a config that diverges within a few steps, so the latency path runs too
        study.enqueue_trial({"learning_rate": 1e-2, "max_iter": 4, "use_clip_norm": False, "use_epsilon": False,
                             "use_input_clip": False})
    clock = Clock()
    budget = Budget(args.trials, args.steps, args.seeds, args.report_every)
    Search(study, space, "iterated_mlp", executor, budget, [clock]).run()
    return figures(clock.arrivals, args)


def figures(arrivals: list[tuple[float, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Steps fraction, cancel latencies and report interval from the timestamped records."""
    finals = [(t, r) for t, r in arrivals if r.final]
    trained = sum(r.step for _, r in finals)
    full = args.trials * args.seeds * args.steps
    gaps = _progress_gaps(arrivals)
    driver_lat, total_lat = [], []
    by_trial: dict[int, list[tuple[float, Any]]] = {}
    for t, r in finals:
        by_trial.setdefault(r.trial, []).append((t, r))
    alarms: dict[int, tuple[float, Any]] = {}  # trial -> its first DIVERGED record (the alarm, or a final one)
    for t, r in arrivals:
        if r.status.value == "diverged" and r.trial not in alarms:
            alarms[r.trial] = (t, r)
    for trial, runs in by_trial.items():
        if trial not in alarms:
            continue
        t_div, first = alarms[trial]
        # a final record comes after the forensics replay; an alarm at the divergence step itself
        forensics = float(first.info.get("forensics_seconds", 0.0)) if first.final else 0.0
        for t, r in runs:
            if r.status.value == "cancelled" and r.step > 0:
                driver_lat.append(t - t_div)
                total_lat.append(t - t_div + forensics)
    pruned = sum(1 for runs in by_trial.values() if any(r.status.value == "diverged" for _, r in runs))
    return {"trained": trained, "full": full, "fraction": trained / full, "pruned_trials": pruned,
            "cancelled_siblings": len(driver_lat), "report_interval": median(gaps),
            "driver_latency": median(driver_lat), "total_latency": median(total_lat),
            "max_driver_latency": max(driver_lat, default=float("nan"))}


def _progress_gaps(arrivals: list[tuple[float, Any]]) -> list[float]:
    """Seconds between consecutive progress records of the same run."""
    last: dict[tuple[int, int], float] = {}
    gaps = []
    for t, r in arrivals:
        key = (r.trial, r.seed)
        if r.status.value == "running" and key in last:
            gaps.append(t - last[key])
        last[key] = t
    return gaps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--report-every", type=int, default=25)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (the same in every repeat)")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if args.smoke:
        args.repeats, args.trials, args.steps, args.report_every = 1, 3, 40, 10

    print_header(f"pruning: {args.trials} trials x {args.steps} steps x {args.seeds} seeds on the default "
                 f"iterated_mlp space, report every {args.report_every}, {args.repeats} repeat(s)")
    from tuner.config import prepare_environment

    prepare_environment()
    from tuner.executor import ClusterConfig, RayExecutor

    executor = RayExecutor(ClusterConfig(num_cpus=args.slots))
    try:
        rows = [one_study(executor, args) for _ in range(args.repeats)]
    finally:
        executor.close()
    keys = ["fraction", "pruned_trials", "cancelled_siblings", "report_interval", "driver_latency",
            "total_latency", "max_driver_latency"]
    print(table(["repeat", "steps trained / full", "pruned trials", "siblings cancelled", "report interval s",
                 "cancel after driver hears s", "cancel after divergence s", "max after driver hears s"],
                [[n + 1, *(r[k] for k in keys)] for n, r in enumerate(rows)]))
    m = {k: median([r[k] for r in rows]) for k in keys}
    print(f"RESULT pruning steps_fraction = {m['fraction']:.3f} (steps trained / every trial to its budget)")
    interval = m["report_interval"]
    if m["total_latency"] != m["total_latency"]:
        print("RESULT pruning cancel_latency = n/a (no sibling run was cancelled)")
        write_json(args.json, {"rows": rows, "medians": m})
        return
    within = "within" if m["total_latency"] <= interval else "NOT within"
    print(f"RESULT pruning cancel_latency = {m['total_latency']:.3f} s from the divergence "
          f"({m['driver_latency']:.3f} s after the driver hears of it; report interval {interval:.3f} s: "
          f"{within} one interval)")
    write_json(args.json, {"rows": rows, "medians": m})


if __name__ == "__main__":
    main()
