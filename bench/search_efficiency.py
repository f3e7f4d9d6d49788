"""Search efficiency: trials until a good stable config, TPE against random sampling, real training.

The target: the first trial whose config survives every seed with a validation loss within 10 %
of the best point of a dense reference grid (``reference_grid.py``, cached in
``bench/data/reference_grid.json``) over the same space (``bench/data/efficiency_space.yaml``)
and budget. For each sampler (tuner's, ``tuner.driver.search.make_sampler``: TPE and random)
and each study seed, a study runs through ``tuner.driver.search.Search`` on one ``RayExecutor``, one
trial at a time (its seeds in parallel), until it hits the target or reaches ``--max-trials``
(then it counts as ``max-trials + 1``, shown as ``>N``). Figures: the median trials to the target
per sampler over the study seeds, and TPE's median / random's (goal: at most 0.5).

    .venv/bin/python bench/search_efficiency.py [--study-seeds 5] [--max-trials 40] [--samplers tpe,random] [--smoke]

``--samplers tpe-constrained``: TPE told each diverged trial's broken constraint (``constrained_tpe``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchlib import MODEL, median, print_header, table, write_json
from reference_grid import GRID_FILE, best_point, efficiency_space, grid_values, run_grid

WITHIN = 0.10
GOAL = 0.5


def trials_to_target(executor: Any, sampler: Any, target: float, args: argparse.Namespace) -> int | None:
    """Trials a study runs until one survives every seed with a validation loss <= target; None if none."""
    import optuna

    from tuner.driver.search import Budget, Search
    from tuner.records import TrialState

    study = optuna.create_study(direction="minimize", sampler=sampler)
    search = Search(study, efficiency_space(), MODEL, executor,
                    Budget(args.max_trials, args.steps, args.seeds, args.report_every))
    for n in range(1, args.max_trials + 1):
        outcome = search.run(1)[-1]
        if outcome.state is TrialState.SURVIVED and outcome.value is not None and outcome.value <= target:
            return n
    return None


def samplers(seed: int, names: list[str]) -> dict[str, Any]:
    """The samplers compared, seeded; ``tpe-constrained`` is tuner's TPE told a diverged trial's
    broken constraint (Optuna's constrained TPE, issue 32)."""
    from tuner.driver.search import make_sampler

    searched = len(efficiency_space().searched())
    made = {name: make_sampler(name, seed, searched) for name in names if name != "tpe-constrained"}
    if "tpe-constrained" in names:
        made["tpe-constrained"] = constrained_tpe(seed, searched)
    return made


def constrained_tpe(seed: int, searched: int) -> Any:
    """``make_sampler("tpe")``'s TPE with ``constraints_func``: a diverged trial broke the constraint by
    the share of its steps it did not survive (its earliest diverged seed's), any other trial none.

    Optuna's TPE (5.0) ranks the trials it splits: complete by value, then pruned by their last
    step, then those that broke a constraint by how much. A diverged trial is pruned with NaN at its
    divergence step, so this changes the order only where a pruner stopped trials.
    """
    import warnings

    import optuna

    from tuner.driver.search import make_sampler
    from tuner.driver.trialrecord import SeedStatus, read
    from tuner.records import TrialState

    def violation(trial: optuna.trial.FrozenTrial) -> tuple[float]:
        record = read(trial)
        if record is None or record.state is not TrialState.DIVERGED:
            return (0.0,)
        survived = min(run.steps_survived for run in record.seeds if run.status is SeedStatus.DIVERGED)
        return (1.0 - survived / record.steps,)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constraints_func: experimental, and deprecated for set_constraint
        return make_sampler("tpe", seed, searched, constraints_func=violation)


def reference(executor: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The cached reference grid (a tiny one trained now in smoke mode)."""
    if args.smoke:
        values = grid_values(2, 1e-3, 3e-3, range(8, 10))
        rows = run_grid(executor, values, args.steps, args.seeds, args.report_every)
        return {"steps": args.steps, "seeds": args.seeds, "report_every": args.report_every, "best": best_point(rows),
                "points": rows}
    if not GRID_FILE.exists():
        raise SystemExit(f"{GRID_FILE} is missing: make it with .venv/bin/python bench/reference_grid.py")
    return json.loads(GRID_FILE.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study-seeds", type=int, default=5)
    p.add_argument("--max-trials", type=int, default=40)
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--samplers", default="tpe,random",
                   help="comma-separated; a sampler left out keeps no figures (random's repeat exactly)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    args.steps, args.seeds, args.report_every = 300, 2, 25
    if args.smoke:
        args.study_seeds, args.max_trials, args.steps, args.report_every = 1, 2, 20, 10

    from tuner.environ import prepare_process

    prepare_process()
    from tuner.driver.executor import ClusterConfig, RayExecutor

    executor = RayExecutor(ClusterConfig(num_cpus=2))
    try:
        grid = reference(executor, args)
        args.steps, args.seeds, args.report_every = grid["steps"], grid["seeds"], grid["report_every"]
        print_header(f"search efficiency: {args.study_seeds} study seed(s) per sampler, at most {args.max_trials} "
                     f"trials, {args.steps} steps x {args.seeds} seeds, reference grid of {len(grid['points'])} points")
        if grid["best"] is None:
            raise SystemExit("no point of the reference grid survived: no target to reach")
        target = grid["best"]["val_loss"] * (1 + WITHIN)
        print(f"grid best: {grid['best']}; target: validation loss <= {target:.4f}")
        names = args.samplers.split(",")
        found: dict[str, list[int | None]] = {name: [] for name in names}
        for seed in range(args.study_seeds):
            for name, sampler in samplers(seed, names).items():
                found[name].append(trials_to_target(executor, sampler, target, args))
                print(f"study seed {seed} {name}: {found[name][-1] or f'>{args.max_trials}'} trials", flush=True)
    finally:
        executor.close()
    counted = {name: [n or args.max_trials + 1 for n in values] for name, values in found.items()}
    meds = {name: median(values) for name, values in counted.items()}
    print(table(["sampler", *[f"seed {s}" for s in range(args.study_seeds)], "median"],
                [[name, *[n or f">{args.max_trials}" for n in found[name]], meds[name]] for name in found]))
    print("RESULT efficiency " + ", ".join(f"{name} = {m:.1f} trials" for name, m in meds.items())
          + f" (median to within {WITHIN:.0%} of the grid best)")
    ratio = meds["tpe"] / meds["random"] if {"tpe", "random"} <= set(meds) else None
    if ratio is not None:
        verdict = "met" if ratio <= GOAL else "MISSED"
        print(f"RESULT efficiency ratio = {ratio:.2f} (TPE / random; goal <= {GOAL}: {verdict})")
    write_json(args.json, {"found": found, "medians": meds, "ratio": ratio, "target": target})


if __name__ == "__main__":
    main()
