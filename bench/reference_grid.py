"""The dense reference grid of ``search_efficiency.py``: every point of a grid over its space, trained.

The space is ``bench/data/efficiency_space.yaml`` (iterated_mlp's learning rate and max_iter).
Each grid point is one tuner trial (enqueued in an Optuna study driving ``tuner.driver.search.Search`` on a
``RayExecutor``): the config on every seed, stopped at the first divergence, with the mean
validation loss of the seeds if all survived. The result is written to
``bench/data/reference_grid.json`` (with the command, date, machine and versions that made it),
where ``search_efficiency.py`` reads the best validation loss from. Training is deterministic
per config and seed on one thread, so a rerun gives the same grid up to floating-point noise.

    .venv/bin/python bench/reference_grid.py [--lr-points 11] [--steps 300] [--seeds 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import BENCH, MODEL, machine, print_header

SPACE_FILE = BENCH / "data" / "efficiency_space.yaml"
GRID_FILE = BENCH / "data" / "reference_grid.json"


def efficiency_space() -> Any:
    """The search space of the efficiency benchmark."""
    from tuner.models import load_model
    from tuner.spaces import load_space

    return load_space(SPACE_FILE, MODEL, load_model(MODEL).knobs)


def grid_values(lr_points: int, low: float = 1e-4, high: float = 1e-2, iters: range = range(4, 17)) -> dict[str, list]:
    """Log-spaced learning rates (ends included) x every max_iter of the space."""
    ratio = (high / low) ** (1 / (lr_points - 1))
    rates = [float(f"{low * ratio**k:.4g}") for k in range(lr_points)]
    return {"learning_rate": rates, "max_iter": list(iters)}


def run_grid(executor: Any, values: dict[str, list], steps: int, seeds: int, report_every: int) -> list[dict[str, Any]]:
    """Train every grid point as a tuner trial; one row per point."""
    import optuna

    from tuner.driver.search import Budget, Search
    from tuner.driver.trialrecord import read

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # enqueued points, not GridSampler: its study.stop() at the end of the grid raises under ask/tell
    study = optuna.create_study(direction="minimize")
    for point in itertools.product(*values.values()):
        study.enqueue_trial(dict(zip(values, point, strict=True)))
    points = math.prod(len(v) for v in values.values())
    Search(study, efficiency_space(), MODEL, executor, Budget(points, steps, seeds, report_every)).run()
    records = [(t, read(t)) for t in study.get_trials(deepcopy=False)]
    return [{"learning_rate": t.params["learning_rate"], "max_iter": t.params["max_iter"],
             "status": r.state.value, "val_loss": r.value, "steps_survived": list(r.steps_survived)}
            for t, r in records if r is not None]


def best_point(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The surviving grid point with the lowest validation loss."""
    survived = [r for r in rows if r["status"] == "survived" and r["val_loss"] is not None]
    return min(survived, key=lambda r: r["val_loss"]) if survived else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr-points", type=int, default=11, help="learning rates in the grid (log-spaced)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--report-every", type=int, default=25)
    p.add_argument("--out", default=str(GRID_FILE))
    args = p.parse_args()
    values = grid_values(args.lr_points)
    print_header(f"reference grid: {len(values['learning_rate'])} learning rates x {len(values['max_iter'])} max_iter, "
                 f"{args.steps} steps x {args.seeds} seeds")
    from tuner.environ import prepare_process

    prepare_process()
    from tuner.driver.executor import ClusterConfig, RayExecutor

    executor = RayExecutor(ClusterConfig(num_cpus=2))
    started = time.perf_counter()
    try:
        rows = run_grid(executor, values, args.steps, args.seeds, args.report_every)
    finally:
        executor.close()
    doc = {
        "made_by": "python bench/reference_grid.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "seconds": time.perf_counter() - started,
        "space": str(SPACE_FILE.relative_to(BENCH.parent)), "steps": args.steps, "seeds": args.seeds,
        "report_every": args.report_every, "grid": values, "best": best_point(rows), "points": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    survived = sum(r["status"] == "survived" for r in rows)
    print(f"{len(rows)} points, {survived} survived every seed; best: {doc['best']}; written to {args.out}")


if __name__ == "__main__":
    main()
