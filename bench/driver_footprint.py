"""Driver footprint: the driver's CPU time and peak memory per 1000 progress records; no TensorFlow.

Each repeat runs the same launch twice, each in a fresh process that is the driver itself
(``tuner.driver.launch.launch``: Optuna on SQLite, MLflow on SQLite, the progress view, the plots):
once with few progress records (``--coarse`` report interval) and once with many (``--fine``).
Per launch: the driver process's CPU time (user + system, all its threads, during the launch),
its peak resident memory (``ru_maxrss``) before and after, and the records it received (counted
from the runs the study kept: a record every report interval, and a final one per run). Figures:

- CPU per 1000 records, marginal: (CPU fine - CPU coarse) / (records fine - records coarse) x 1000,
  the cost of a record beyond the launch's fixed costs; and the fine launch's total per 1000;
- peak memory: the fine launch's peak RSS, and (peak fine - peak coarse) per 1000 more records;
- whether ``tensorflow`` was imported in the driver (it must not be);
- what a record costs, split: MLflow's writes and Optuna's reports (``record_costs``, no Ray).

    .venv/bin/python bench/driver_footprint.py [--repeats 3] [--trials 8] [--steps 300] [--fine 3] [--no-tracking]
                                               [--smoke]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from typing import Any

from benchlib import (
    import_driver,
    median,
    pre_create_stores,
    print_header,
    run_part,
    runs_from_study,
    search_argv,
    search_launch,
    search_parser,
    table,
    write_json,
)


def records_of(run: dict[str, Any]) -> int:
    """Progress records a run streamed, and its final record."""
    every, stop, steps = run["report_every"], run["stop"], run["steps"]
    if run["status"] == "survived":
        progress = -(-steps // every)  # every multiple of the interval, and the last step
    elif run["status"] == "diverged":
        progress = (stop - 1) // every + 1  # the report steps before the divergence step, and its alarm
    else:
        progress = stop // every  # cancelled at a report step, after its record
    return progress + 1


def record_costs(trials: int = 8, reports: int = 24, metrics: int = 30) -> dict[str, float]:
    """CPU ms per progress record of its two shares, without Ray: MLflow's writes and Optuna's reports.

    Records like a launch's (``metrics`` telemetry values, 2 seeds, ``reports`` report steps per
    trial) go through ``tuner.driver.tracking.Tracker`` into a SQLite MLflow store; a study on SQLite
    gets one ``trial.report`` per report step (one per two records, as when both seeds reach it).
    """
    import optuna

    from tuner.driver.tracking import Tracker
    from tuner.records import RunRecord, RunStatus, TrainConfig

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    values = {f"grad_norm/w{k}": 1.0 for k in range(metrics)}
    n = trials * reports * 2
    with tempfile.TemporaryDirectory(prefix="tuner-record-cost-") as tmp:
        storage, uri = f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db"
        pre_create_stores(storage, uri)
        tracker = Tracker(uri, "cost", {})
        started = time.process_time()
        for trial in range(trials):
            tracker.on_trial_start(trial, TrainConfig(1e-3), (0, 1))
            for step in range(1, reports + 1):
                for seed in (0, 1):
                    tracker.on_trial_result(RunRecord(trial, seed, step, RunStatus.RUNNING, 1.0, 1.0,
                                                      steps_survived=step, metrics=values))
        tracker.flush()
        mlflow_ms = 1000 * (time.process_time() - started) / n
        study = optuna.create_study(storage=storage)
        started = time.process_time()
        for _ in range(trials):
            trial = study.ask()
            for step in range(1, reports + 1):
                trial.report(1.0, step)
            study.tell(trial, 1.0)
        optuna_ms = 1000 * (time.process_time() - started) / n
    return {"mlflow_ms": mlflow_ms, "optuna_ms": optuna_ms, "metrics": metrics + 2}


def launch_part(args: argparse.Namespace) -> dict[str, Any]:
    """One launch, measured from inside its driver (run in its own process)."""
    import_driver()
    before = resource.getrusage(resource.RUSAGE_SELF)
    with search_launch(args, "tuner-footprint-", num_cpus=2, no_tracking=args.no_tracking) as (wall, study):
        after = resource.getrusage(resource.RUSAGE_SELF)
        runs = runs_from_study(study, args.steps, args.report_every)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall": wall, "cpu": cpu, "rss_before_mb": before.ru_maxrss / 1024, "rss_peak_mb": after.ru_maxrss / 1024,
            "records": sum(records_of(r) for r in runs), "tensorflow": "tensorflow" in sys.modules}


def main() -> None:
    p = search_parser(__doc__, trials=8, steps=300)
    p.add_argument("--fine", type=int, default=3, help="report interval of the launch with many records")
    p.add_argument("--coarse", type=int, default=100, help="report interval of the launch with few records")
    p.add_argument("--no-tracking", action="store_true", help="launch without MLflow (to see MLflow's share)")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--part", choices=["launch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part == "launch":
        write_json(args.json, launch_part(args))
        return
    if args.smoke:
        args.repeats, args.trials, args.steps, args.fine, args.coarse = 1, 2, 30, 2, 30

    print_header(f"driver footprint: {args.trials} trials x {args.steps} steps x {args.seeds} seeds, report every "
                 f"{args.coarse} vs {args.fine} steps, {args.repeats} repeat(s)"
                 + (", without MLflow" if args.no_tracking else ""))
    common = ["--part", "launch", *search_argv(args), *(["--no-tracking"] if args.no_tracking else [])]
    rows = []
    for n in range(args.repeats):
        coarse = run_part("driver_footprint.py", [*common, "--report-every", str(args.coarse)])
        fine = run_part("driver_footprint.py", [*common, "--report-every", str(args.fine)])
        extra = fine["records"] - coarse["records"]
        rows.append({
            "records": fine["records"], "records_coarse": coarse["records"], "cpu": fine["cpu"],
            "cpu_coarse": coarse["cpu"], "cpu_per_1000": 1000 * fine["cpu"] / fine["records"],
            "marginal_cpu_per_1000": 1000 * (fine["cpu"] - coarse["cpu"]) / extra if extra > 0 else float("nan"),
            "peak_mb": fine["rss_peak_mb"], "peak_mb_coarse": coarse["rss_peak_mb"],
            "marginal_mb_per_1000": 1000 * (fine["rss_peak_mb"] - coarse["rss_peak_mb"]) / extra if extra > 0
            else float("nan"),
            "tensorflow": coarse["tensorflow"] or fine["tensorflow"],
        })
        print(f"repeat {n + 1}: {fine['records']} records, {fine['cpu']:.2f} s CPU", flush=True)
    keys = ["records_coarse", "cpu_coarse", "records", "cpu", "cpu_per_1000", "marginal_cpu_per_1000",
            "peak_mb_coarse", "peak_mb", "marginal_mb_per_1000"]
    print(table(["repeat", "records (coarse)", "CPU s (coarse)", "records (fine)", "CPU s (fine)",
                 "CPU s / 1000 rec", "marginal CPU s / 1000 rec", "peak RSS MB (coarse)", "peak RSS MB (fine)",
                 "marginal MB / 1000 rec"],
                [[n + 1, *(r[k] for k in keys)] for n, r in enumerate(rows)]))
    m = {k: median([r[k] for r in rows]) for k in keys}
    print(f"RESULT driver cpu_per_1000_records = {m['marginal_cpu_per_1000']:.3f} s marginal "
          f"({m['cpu_per_1000']:.3f} s with the launch's fixed costs)")
    print(f"RESULT driver peak_memory = {m['peak_mb']:.0f} MB peak RSS ({m['marginal_mb_per_1000']:.1f} MB more "
          "per 1000 records, marginal)")
    imported = any(r["tensorflow"] for r in rows)
    print(f"RESULT driver tensorflow_imported = {'YES (a defect)' if imported else 'no'}")
    costs = record_costs(trials=2 if args.smoke else 8)
    print(f"RESULT driver record_cost = {costs['mlflow_ms']:.2f} ms CPU for MLflow ({costs['metrics']} metrics), "
          f"{costs['optuna_ms']:.2f} ms for Optuna's reports, per record (without Ray)")
    write_json(args.json, {"rows": rows, "medians": m, "record_costs": costs})


if __name__ == "__main__":
    main()
