"""Overhead: tuner's wall time against the floor, beside Ray Tune + OptunaSearch on the same search.

Each repeat, side by side, each in a fresh process (1 and 2 in an order that rotates per repeat):

1. ``tuner.driver.launch.launch`` on iterated_mlp's shipped space (TPE, sampler seed 0), MLflow and
   Optuna on SQLite (schemas created beforehand, as on any launch after a machine's first); and
   the same launch with ``--no-tracking`` (MLflow's share of the overhead; Ray Tune logs nowhere);
2. ``ray_tune_baseline.py`` with Tune's default settings and with ``reuse_actors=True``;
3. the bare loop (``bare_loop.py``): every seed run that 1 and 2 trained, stopped where it stopped,
   in one process, one after another;
4. ``python -c "import tensorflow"``.

The floor of a system = the bare loop's time for that system's runs / slots + one TensorFlow
import; its overhead ratio = its wall time / its floor (goal: tuner at most 1.10, and below both
Ray Tune settings). Wall times start with the libraries imported (a driver's imports are the same
whoever orchestrates) and end when the cluster is shut down.

With ``--space bench/data/tuner_knobs_space.yaml --rebuild --settings``: the graph-reuse figure
(issue 16): a space of tuner's own knobs only, where every run trains one model config, so a worker
builds its graph once; ``--rebuild`` adds the same launch with ``--no-graph-reuse`` (Ray Tune's
baseline searches the shipped space only, so ``--space`` runs no Ray Tune setting).

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
    tf_import_seconds,
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
    """Every system once, then the bare loop over the union of their runs; a row per system.

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
    union = {run_key(r): r for s in systems.values() for r in s["runs"] if r["stop"] > 0}
    with tempfile.TemporaryDirectory(prefix="tuner-bare-") as tmp:
        path = Path(tmp) / "runs.json"
        path.write_text(json.dumps(list(union.values())))
        bare = run_part("bare_loop.py", [str(path)])
    seconds = {r["key"]: r["seconds"] for r in bare["results"]}
    elsewhere = sum(1 for r in bare["results"] if r["steps"] != union[r["key"]]["stop"])
    if elsewhere:
        print(f"note: {elsewhere} of {len(union)} bare runs ended at another step than the measured run "
              "(a divergence that did not repeat exactly, or a cancel between report steps)")
    tf_import = bare["import_seconds"] if args.smoke else tf_import_seconds()
    rows = []
    for name, system in systems.items():
        trained = [r for r in system["runs"] if r["stop"] > 0]
        bare_total = sum(seconds[run_key(r)] for r in trained)
        floor = bare_total / args.slots + tf_import
        rows.append({"system": name, "wall": system["wall"], "bare": bare_total, "tf_import": tf_import,
                     "floor": floor, "ratio": system["wall"] / floor, "runs": len(trained),
                     "steps": sum(r["stop"] for r in trained), "slots": system.get("slots")})
    return rows


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
    headers = ["repeat", "system", "wall s", "bare s", "TF import s", "floor s", "ratio", "runs", "steps"]
    for n in range(args.repeats):
        for row in one_repeat(args, settings, turn=n):
            rows.append({"repeat": n + 1, **row})
            print(f"repeat {n + 1} {row['system']}: wall {row['wall']:.2f} s, floor {row['floor']:.2f} s, "
                  f"ratio {row['ratio']:.2f}", flush=True)
    print(table(headers, [[r["repeat"], r["system"], r["wall"], r["bare"], r["tf_import"], r["floor"], r["ratio"],
                           r["runs"], r["steps"]] for r in rows]))
    timed = [r for r in rows if r["slots"]]
    print("\nwhere tuner's slot time went (s; ready and end from the executor's start, slot seconds between them):")
    print(table(["repeat", "system", "workers ready", "last run ended", "busy", "wasted on siblings", "idle"],
                [[r["repeat"], r["system"], r["slots"]["ready"], r["slots"]["end"], r["slots"]["busy"],
                  r["slots"]["wasted"], r["slots"]["idle"]] for r in timed]))
    names = [name for name in ("tuner", "tuner_no_mlflow", "tuner_rebuild", *settings)
             if any(r["system"] == name for r in rows)]
    medians = {name: {key: median([r[key] for r in rows if r["system"] == name])
                      for key in ("wall", "floor", "ratio")} for name in names}
    print(f"\nmedian of {args.repeats} repeat(s):")
    print(table(["system", "wall s", "floor s", "wall / floor"],
                [[name, m["wall"], m["floor"], m["ratio"]] for name, m in medians.items()]))
    tuner_ratio = medians["tuner"]["ratio"]
    goal = REUSE_GOAL if args.space else GOAL
    verdict = "met" if tuner_ratio <= goal else "MISSED"
    print(f"RESULT overhead tuner = {tuner_ratio:.2f} (goal <= {goal:.2f}: {verdict})")
    if "tuner_rebuild" in medians:
        print(f"RESULT overhead tuner_rebuild = {medians['tuner_rebuild']['ratio']:.2f} (the same launch "
              "with --no-graph-reuse)")
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
