"""Overhead: tuner's wall time against the floor, beside Ray Tune + OptunaSearch on the same search.

Each repeat, side by side, each in a fresh process (1 and 2 in an order that rotates per repeat):

1. ``tuner.driver.launch.launch`` on iterated_mlp's shipped space (TPE, sampler seed 0), MLflow and
   Optuna on SQLite (schemas created beforehand, as on any launch after a machine's first); and
   the same launch with ``--no-tracking`` (MLflow's share of the overhead; Ray Tune logs nowhere);
2. ``ray_tune_baseline.py`` with Tune's default settings and with ``reuse_actors=True``;
3. per system, its floor: the bare loop (``bare_loop.py``) trains every seed run that system trained,
   stopped where it stopped, in as many processes as it had slots, each set up as a tuner worker
   (threads, TensorFlow import, data, graph cache), with no orchestration at all.

The floor of a system = the bare loop's wall time for its runs, its processes' TensorFlow imports
included; its overhead ratio = its wall time / its floor (goal: tuner at most 1.10, and below both
Ray Tune settings; below 1.00 by more than the noise would mean the floor is not one). Wall times
start with the libraries imported (a driver's imports are the same whoever orchestrates) and end
when the cluster is shut down.

With ``--space bench/data/tuner_knobs_space.yaml --rebuild --settings``: the graph-reuse figure
(issue 16): a space of tuner's own knobs only, where every run trains one model config, so a worker
builds its graph once; ``--rebuild`` adds the same launch with ``--no-graph-reuse`` and a second
floor per system that builds every run's graph (issue 16's goal: tuner at most 0.7x of it; Ray
Tune's baseline searches the shipped space only, so ``--space`` runs no Ray Tune setting).

    .venv/bin/python bench/overhead.py [--repeats 3] [--trials 16] [--steps 300] [--seeds 2] [--space S]
        [--rebuild] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchlib import (
    median,
    print_header,
    run_key,
    run_part,
    runs_from_study,
    search_argv,
    search_launch,
    search_parser,
    slot_clock,
    table,
    write_json,
)

SETTINGS = {"ray_tune_default": [], "ray_tune_reuse": ["--reuse-actors"]}
GOAL = 1.10
REUSE_GOAL = 0.70  # with --space of tuner's knobs only: graph reuse against the rebuilding floor (issue 16)


def tuner_part(args: argparse.Namespace) -> dict[str, Any]:
    """One timed launch (run in its own process by ``--part tuner``)."""
    with slot_clock(args.slots) as slots, search_launch(
        args, "tuner-overhead-", num_cpus=args.slots, no_tracking=args.no_tracking,
        graph_reuse=not args.no_graph_reuse,
    ) as (wall, study):
        runs = runs_from_study(study, args.steps, args.report_every)
    return {"wall": wall, "runs": runs, "trials": args.trials, "slots": slots}


def one_repeat(args: argparse.Namespace, settings: list[str], turn: int) -> list[dict[str, Any]]:
    """Every system once, then each one's floor over its own runs; a row per system.

    The systems' order rotates by ``turn``, so that each takes its turn first and last: the VM's
    drift (see BENCHMARKS.md) then does not favour the same system in every repeat.
    """
    common = [*search_argv(args), "--slots", str(args.slots)]
    parts = {"tuner": ("overhead.py", ["--part", "tuner", *common])}
    if not args.smoke and not args.rebuild:
        parts["tuner_no_mlflow"] = ("overhead.py", ["--part", "tuner", "--no-tracking", *common])
    if args.rebuild:
        parts["tuner_rebuild"] = ("overhead.py", ["--part", "tuner", "--no-graph-reuse", *common])
    for name in settings:
        parts[name] = ("ray_tune_baseline.py", [*common, *SETTINGS[name]])
    order = list(parts)
    order = order[turn % len(order):] + order[: turn % len(order)]
    ran = {name: run_part(*parts[name]) for name in order}
    systems = {name: ran[name] for name in parts}  # rows in the usual order
    rows = []
    for name, system in systems.items():
        trained = [r for r in system["runs"] if r["stop"] > 0]
        floor = bare_floor(trained, args.slots)
        row = {"system": name, "wall": system["wall"], "floor": floor["wall"], "ratio": system["wall"] / floor["wall"],
               "tf_import": floor["import_seconds"], "runs": len(trained), "steps": sum(r["stop"] for r in trained),
               "slots": system.get("slots")}
        if args.rebuild:  # issue 16's figure: against the floor that builds every run's graph
            rebuilt = bare_floor(trained, args.slots, rebuild=True)
            row.update(rebuild_floor=rebuilt["wall"], rebuild_ratio=system["wall"] / rebuilt["wall"])
        rows.append(row)
    return rows


def bare_floor(runs: list[dict[str, Any]], slots: int, rebuild: bool = False) -> dict[str, Any]:
    """``bare_loop.py`` over ``runs`` in ``slots`` worker-like processes: its wall time is the floor."""
    with tempfile.TemporaryDirectory(prefix="tuner-bare-") as tmp:
        path = Path(tmp) / "runs.json"
        path.write_text(json.dumps(runs))
        bare = run_part("bare_loop.py", [str(path), "--processes", str(slots), *(["--rebuild"] if rebuild else [])])
    wanted = {run_key(r): r["stop"] for r in runs}
    elsewhere = sum(1 for r in bare["results"] if r["steps"] != wanted[r["key"]])
    if elsewhere:
        print(f"note: {elsewhere} of {len(runs)} bare runs ended at another step than the measured run "
              "(a divergence that did not repeat exactly, or a cancel between report steps)")
    return bare


def main() -> None:
    p = search_parser(__doc__, trials=16, steps=300)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--settings", nargs="*", choices=sorted(SETTINGS), default=sorted(SETTINGS),
                   help="Ray Tune settings to compare with")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--part", choices=["tuner"], help=argparse.SUPPRESS)
    p.add_argument("--rebuild", action="store_true",
                   help="add tuner with --no-graph-reuse (and leave out the run without MLflow)")
    p.add_argument("--no-tracking", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-graph-reuse", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part == "tuner":
        write_json(args.json, tuner_part(args))
        return
    settings = [] if args.space else args.settings
    if args.smoke:
        args.repeats, args.trials, args.steps, args.report_every = 1, 2, 20, 10
        settings = ["ray_tune_reuse"]

    print_header(f"overhead: {args.trials} trials x {args.steps} steps x {args.seeds} seeds, {args.slots} slots, "
                 f"report every {args.report_every}, {args.repeats} repeat(s)")
    rows = []
    keys = ["wall", "floor", "ratio", *(["rebuild_floor", "rebuild_ratio"] if args.rebuild else [])]
    for n in range(args.repeats):
        for row in one_repeat(args, settings, turn=n):
            rows.append({"repeat": n + 1, **row})
            print(f"repeat {n + 1} {row['system']}: " + ", ".join(f"{k} {row[k]:.2f}" for k in keys), flush=True)
    print(table(["repeat", "system", *keys, "TF import s (floor's slowest process)", "runs", "steps"],
                [[r["repeat"], r["system"], *[r[k] for k in keys], r["tf_import"], r["runs"], r["steps"]]
                 for r in rows]))
    timed = [r for r in rows if r["slots"]]
    print("\nwhere tuner's slot time went (s; ready and end from the executor's start, slot seconds between them):")
    print(table(["repeat", "system", "workers ready", "last run ended", "busy", "wasted on siblings", "idle"],
                [[r["repeat"], r["system"], r["slots"]["ready"], r["slots"]["end"], r["slots"]["busy"],
                  r["slots"]["wasted"], r["slots"]["idle"]] for r in timed]))
    names = [name for name in ("tuner", "tuner_no_mlflow", "tuner_rebuild", *settings)
             if any(r["system"] == name for r in rows)]
    medians = {name: {key: median([r[key] for r in rows if r["system"] == name]) for key in keys} for name in names}
    print(f"\nmedian of {args.repeats} repeat(s):")
    print(table(["system", *keys], [[name, *m.values()] for name, m in medians.items()]))
    tuner_ratio = medians["tuner"]["ratio"]
    verdict = "met" if tuner_ratio <= GOAL else "MISSED"
    print(f"RESULT overhead tuner = {tuner_ratio:.2f} (goal <= {GOAL:.2f}: {verdict}; below 1.00 would mean "
          "the floor is not one)")
    if "tuner_rebuild" in medians:
        print(f"RESULT overhead tuner_rebuild = {medians['tuner_rebuild']['ratio']:.2f} (the same launch "
              "with --no-graph-reuse)")
    if args.rebuild:
        reuse = medians["tuner"]["rebuild_ratio"]
        verdict = "met" if reuse <= REUSE_GOAL else "MISSED"
        print(f"RESULT overhead graph_reuse = {reuse:.2f} (tuner against the floor that builds every run's "
              f"graph; goal <= {REUSE_GOAL:.2f}: {verdict})")
    if "tuner_no_mlflow" in medians:
        print(f"RESULT overhead tuner_no_mlflow = {medians['tuner_no_mlflow']['ratio']:.2f} (the same launch "
              "with --no-tracking)")
    for name in settings:
        ratio = medians[name]["ratio"]
        verdict = "tuner below" if tuner_ratio < ratio else "tuner NOT below"
        print(f"RESULT overhead {name} = {ratio:.2f} ({verdict})")
    write_json(args.json, {"rows": rows, "medians": medians})


if __name__ == "__main__":
    main()
