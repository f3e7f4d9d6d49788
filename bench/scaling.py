"""Scaling: trials per minute with 2 slots against 1 slot, on a 2-core machine.

Each repeat runs the same launch twice, each in a fresh process (``tuner.driver.launch.launch``,
iterated_mlp's shipped space, TPE with sampler seed 0, MLflow and Optuna on SQLite): on an
embedded 2-CPU cluster with ``max_concurrent`` 1, then 2. With the same seed the first 10 trials
(TPE's random start-up) ask the same configs. Two rates per launch:

- end to end: trials / the launch's wall time (Ray start, TensorFlow import in the workers,
  shutdown included);
- steady: trials after the first / time from the first trial's end to the last trial's end
  (Optuna's ``datetime_complete``): the rate once the workers are up.

Goal: 2 slots reach at least 1.8x the trials per minute of 1 slot.

The two launches train the same configs only while TPE is in its random start-up (10 trials on
the default space): after it, TPE's choices depend on the order results came in, so the work
differs. Each launch also prints the steps its runs trained, and the slot time of seed runs
cancelled before their first step (a sibling still building its graph when the other seed
diverged: with 1 slot that sibling is cancelled in the queue, for free); ``--sampler random``
asks the same configs in both launches whatever the order.

    .venv/bin/python bench/scaling.py [--repeats 3] [--trials 8] [--steps 300] [--seeds 2]
                                      [--sampler tpe|random] [--smoke]
"""

from __future__ import annotations

import argparse
from typing import Any

from benchlib import (
    median,
    print_header,
    run_part,
    runs_from_study,
    search_argv,
    search_launch,
    search_parser,
    slot_clock,
    table,
    write_json,
)

GOAL = 1.8


def launch_part(args: argparse.Namespace) -> dict[str, Any]:
    """One timed launch with ``args.slots`` seed runs at once (run in its own process)."""
    with slot_clock(args.slots) as slots, search_launch(
        args, "tuner-scaling-", num_cpus=2, max_concurrent=args.slots, sampler=args.sampler
    ) as (wall, study):
        ends = sorted(t.datetime_complete for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None)
        steps = sum(run["stop"] for run in runs_from_study(study, args.steps, args.report_every))
    span = (ends[-1] - ends[0]).total_seconds() if len(ends) > 1 else float("nan")
    return {"wall": wall, "trials": len(ends), "e2e": 60 * len(ends) / wall,
            "steady": 60 * (len(ends) - 1) / span if span > 0 else float("nan"),
            "steps": steps, "wasted": slots["wasted"]}


def main() -> None:
    p = search_parser(__doc__, trials=8, steps=300)
    p.add_argument("--sampler", choices=["tpe", "random"], default="tpe", help="the study's sampler (default tpe)")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--part", choices=["launch"], help=argparse.SUPPRESS)
    p.add_argument("--slots", type=int, default=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part == "launch":
        write_json(args.json, launch_part(args))
        return
    if args.smoke:
        args.repeats, args.trials, args.steps, args.report_every = 1, 2, 20, 10

    print_header(f"scaling: {args.trials} trials x {args.steps} steps x {args.seeds} seeds, 1 slot vs 2 slots on "
                 f"a 2-CPU cluster, {args.sampler} sampler, {args.repeats} repeat(s)")
    common = ["--part", "launch", *search_argv(args), "--sampler", args.sampler]
    rows = []
    for n in range(args.repeats):
        one = run_part("scaling.py", [*common, "--slots", "1"])
        two = run_part("scaling.py", [*common, "--slots", "2"])
        row = {"wall_1": one["wall"], "wall_2": two["wall"], "e2e_1": one["e2e"], "e2e_2": two["e2e"],
               "steady_1": one["steady"], "steady_2": two["steady"],
               "e2e_ratio": two["e2e"] / one["e2e"], "steady_ratio": two["steady"] / one["steady"],
               "steps_1": one["steps"], "steps_2": two["steps"], "wasted_1": one["wasted"], "wasted_2": two["wasted"],
               "work_ratio": (two["steps"] / two["wall"]) / (one["steps"] / one["wall"])}
        rows.append(row)
        print(f"repeat {n + 1}: end to end {row['e2e_ratio']:.2f}x, steady {row['steady_ratio']:.2f}x", flush=True)
    keys = ["wall_1", "wall_2", "e2e_1", "e2e_2", "e2e_ratio", "steady_1", "steady_2", "steady_ratio",
            "steps_1", "steps_2", "wasted_1", "wasted_2", "work_ratio"]
    print(table(["repeat", "wall 1 slot s", "wall 2 slots s", "trials/min 1", "trials/min 2", "ratio",
                 "steady/min 1", "steady/min 2", "steady ratio", "steps trained 1", "steps trained 2",
                 "slot s wasted 1", "slot s wasted 2", "steps/s ratio"],
                [[n + 1, *(r[k] for k in keys)] for n, r in enumerate(rows)]))
    m = {k: median([r[k] for r in rows]) for k in keys}
    for name, key in (("end_to_end", "e2e_ratio"), ("steady", "steady_ratio")):
        verdict = "met" if m[key] >= GOAL else "MISSED"
        print(f"RESULT scaling {name} = {m[key]:.2f}x trials per minute, 2 slots vs 1 (goal >= {GOAL}: {verdict})")
    print(f"RESULT scaling steps trained per second, end to end = {m['work_ratio']:.2f}x, 2 slots vs 1 "
          f"(steps trained: {m['steps_1']:.0f} with 1 slot, {m['steps_2']:.0f} with 2)")
    write_json(args.json, {"rows": rows, "medians": m})


if __name__ == "__main__":
    main()
