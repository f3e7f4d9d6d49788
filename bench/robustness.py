"""Robustness: does the exported config survive seeds it never saw, and what do racing and verification cost?

For each budget (small: 8 trials x 300 steps; default: 30 trials x 600 steps) and each sampler
seed S, two launches of ``python -m tuner launch`` run, each in its own process, temporary folder
and SQLite Optuna storage (``--no-tracking --no-live --num-cpus 2 --seed S``):

- tuner now: the defaults (racing to 8 seeds, verification on 16 fresh seeds at 2x the steps, the
  learning-rate margin), plus any ``--now-flags`` (``--now-flags="--race-seeds 8"``);
- no racing ("today"): ``--race-seeds 0 --verify-seeds 0 --no-margin --pruner none
  --no-graph-reuse`` (the launch before racing, verification, the pruner and graph reuse existed).

Each exported best_config.yaml is then retrained on 32 held-out seeds at 2x the budget's steps
(``python -m tuner verify --seed 1000+S``): its survival k/32. Compute is the study's
``tuner.compute`` attr: steps trained and worker seconds (a run's time in its worker, graph build
included) per phase. The compute ratio is tuner now's (search + race + verify) worker seconds over
no racing's search worker seconds, and again with the margin's added; the steps ratio is the same
in steps; the wall ratio compares the launches' wall times (Ray start and shutdown included).

Goals, per budget over the sampler seeds: tuner now's worst held-out survival >= 31/32, and its
median compute ratio <= 1.6x (issue 12: "racing and the final verification together cost at most
1.6x today's compute"; graph reuse is there to win it back, which a count of steps cannot show).

    .venv/bin/python bench/robustness.py [--budgets small,default] [--sampler-seeds 0,1,2]
                                         [--held-out-seeds 32] [--json PATH] [--smoke]
                                         [--now-flags="--race-seeds 8"] [--alt-flags="--pruner none"]
                                         [--no-racing-baseline] [--model SPEC --space FILE]

``--alt-flags`` adds a third launch per sampler seed, tuner now with those flags instead, and
compares the two: steps saved (search + race + verify), held-out survival and validation loss
(issue 16: the pruner's >= 35 % fewer steps for the same exported quality), with the ratio of the
exports' median held-out validation losses and its 95 % interval over the sampler seeds (a paired
bootstrap: where the exports' losses spread over orders of magnitude from seed to seed, as on
examples/adding_lstm.py, ten seeds cannot tell a 5 % difference). ``--from-json A.json B.json``
launches nothing and prints the table and summaries of earlier runs' rows together (one sampler
seed per run keeps each seed's figures if a later one fails).
``--no-racing-baseline`` then skips the launch without racing. With ``BENCH_LOCK``
set to a file, every ``python -m tuner`` runs under ``flock`` on it (a machine shared with tests).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from typing import Any

import optuna
from benchlib import median, model_spec, print_header, python_locked, table, write_json

BUDGETS = {"small": (8, 300), "default": (30, 600)}  # name -> (trials, steps)
SMOKE = (3, 60)
SMOKE_NOW = ["--race-seeds", "4", "--verify-seeds", "4", "--min-survival", "0.4"]  # a quick smoke
VARIANTS = {"now": [], "norace": ["--race-seeds", "0", "--verify-seeds", "0", "--no-margin", "--pruner", "none",
                                   "--no-graph-reuse"]}
PHASES = ("search", "race", "verify", "margin")
STUDY = "robustness"
MODEL: list[str] = []  # --model and --space, given to every launch
VERIFY_MODEL: list[str] = []  # --model, given to every held-out check (a config file never picks the code run)
NORMAL_EXITS = (0, 3)  # 0: a verified success; 3: the config is not shown stable
GOAL_SURVIVAL = 31 / 32
GOAL_COMPUTE = 1.6
Z95 = 1.959963984540054


def tuner(argv: list[str], cwd: str) -> tuple[int, str]:
    """Run ``python -m tuner ARGV`` in ``cwd``; its exit status and stdout. Stops on an abnormal exit."""
    done = python_locked(["-m", "tuner", *argv], cwd=cwd, timeout=4 * 3600)
    if done.returncode not in NORMAL_EXITS:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-8000:])
        sys.exit(f"python -m tuner {' '.join(argv)} exited {done.returncode}")
    return done.returncode, done.stdout


def launch(tmp: str, trials: int, steps: int, seed: int, extra: list[str]) -> dict[str, Any]:
    """One timed launch in ``tmp``: exit status, wall seconds, steps per phase."""
    storage = f"sqlite:///{tmp}/optuna.db"
    argv = ["launch", "--trials", str(trials), "--steps", str(steps), "--storage", storage,
            "--out", f"{tmp}/best_config.yaml", "--no-tracking", "--no-live", "--num-cpus", "2",
            "--seed", str(seed), "--study", STUDY, *MODEL, *extra]
    started = time.perf_counter()
    code, _ = tuner(argv, tmp)
    wall = time.perf_counter() - started
    compute = optuna.load_study(study_name=STUDY, storage=storage).user_attrs.get("tuner.compute", {})
    return {"exit": code, "wall": wall, "steps": {p: compute.get(p, {}).get("steps", 0.0) for p in PHASES},
            "runs": {p: compute.get(p, {}).get("runs", 0.0) for p in PHASES},
            "seconds": {p: compute.get(p, {}).get("seconds", 0.0) for p in PHASES}}


def held_out(tmp: str, steps: int, seeds: int, seed: int) -> tuple[int, int, float]:
    """Survived k of n, and the survivors' validation loss: the exported config retrained on
    ``seeds`` held-out seeds x 2 ``steps``."""
    # the bar only sets verify's exit status (unused here); cap it at what ``seeds`` can reach
    bar = min(0.8, int(100 * seeds / (seeds + Z95 * Z95)) / 100)
    _, out = tuner(["verify", f"{tmp}/best_config.yaml", "--seeds", str(seeds), "--steps", str(2 * steps),
                    "--seed", str(1000 + seed), "--num-cpus", "2", "--min-survival", str(bar), *VERIFY_MODEL], tmp)
    found = re.findall(r"survived (\d+)/(\d+)", out)
    if not found:
        sys.exit(f"no 'survived k/n' line in tuner verify's output:\n{out[-3000:]}")
    k, n = found[-1]
    val = re.findall(r"validation loss ([0-9.e+-]+) \(mean", out)
    return int(k), int(n), float(val[-1]) if val else float("nan")


def measure(trials: int, steps: int, seed: int, held_out_seeds: int, smoke: bool = False) -> dict[str, Any]:
    """Both launches and their held-out checks for one budget and sampler seed."""
    row: dict[str, Any] = {"trials": trials, "steps": steps, "sampler_seed": seed}
    for name, extra in VARIANTS.items():
        extra = [*SMOKE_NOW, *extra] if smoke and name in ("now", "alt") else extra
        with tempfile.TemporaryDirectory(prefix=f"tuner-robustness-{name}-") as tmp:
            result = launch(tmp, trials, steps, seed, extra)
            result["survived"], result["runs_held_out"], result["val_loss"] = held_out(
                tmp, steps, held_out_seeds, seed)
        row[name] = result
    if "norace" in row:
        for unit, key in (("seconds", "compute_ratio"), ("steps", "steps_ratio")):
            now, norace = row["now"][unit], row["norace"][unit]
            spent = now["search"] + now["race"] + now["verify"]
            row[key] = spent / norace["search"] if norace["search"] else float("nan")
            row[f"{key}_margin"] = (spent + now["margin"]) / norace["search"] if norace["search"] else float("nan")
        row["wall_ratio"] = row["now"]["wall"] / row["norace"]["wall"]
    if "alt" in row:  # tuner now against itself with --alt-flags (the pruner off, say)
        now, alt = row["now"]["steps"], row["alt"]["steps"]
        spent = {v: sum(row[v]["steps"][p] for p in ("search", "race", "verify")) for v in ("now", "alt")}
        row["steps_saved"] = 1 - spent["now"] / spent["alt"] if spent["alt"] else float("nan")
        row["search_steps_saved"] = 1 - now["search"] / alt["search"] if alt["search"] else float("nan")
        row["val_loss_ratio"] = row["now"]["val_loss"] / row["alt"]["val_loss"]
    return row


def rate(result: dict[str, Any]) -> float:
    """Held-out survival rate (NaN when no run ended)."""
    return result["survived"] / result["runs_held_out"] if result["runs_held_out"] else float("nan")


def print_rows(rows: list[dict[str, Any]]) -> None:
    """One line per budget x sampler seed."""
    if "norace" in rows[0]:
        print_norace(rows)
    if "alt" in rows[0]:
        head = ["budget", "S", "held-out now", "held-out alt", *(f"{p} steps now" for p in PHASES),
                *(f"{p} steps alt" for p in PHASES),
                "steps saved", "search steps saved", "val_loss now", "val_loss alt", "val ratio", "wall alt s"]
        lines = [[r["budget"], r["sampler_seed"], f"{r['now']['survived']}/{r['now']['runs_held_out']}",
                  f"{r['alt']['survived']}/{r['alt']['runs_held_out']}", *(int(r["now"]["steps"][p]) for p in PHASES),
                  *(int(r["alt"]["steps"][p]) for p in PHASES),
                  r["steps_saved"], r["search_steps_saved"], r["now"]["val_loss"], r["alt"]["val_loss"],
                  r["val_loss_ratio"], r["alt"]["wall"]] for r in rows]
        print(f"tuner now ({' '.join(VARIANTS['now']) or 'defaults'}) against alt "
              f"({' '.join(VARIANTS.get('alt', ['as its --alt-flags']))}):")
        print(table(head, lines))


def print_norace(rows: list[dict[str, Any]]) -> None:
    """Tuner now against the launch before racing and verification."""
    head = ["budget", "S", "held-out now", "held-out no race", "exit now/no race",
            *(f"{p} steps" for p in PHASES), "no-race steps", "steps ratio", "+margin",
            *(f"{p} s" for p in PHASES), "no-race s", "compute ratio", "+margin",
            "wall now s", "wall no race s", "wall ratio", "val_loss now", "val_loss no race"]
    lines = [[r["budget"], r["sampler_seed"], f"{r['now']['survived']}/{r['now']['runs_held_out']}",
              f"{r['norace']['survived']}/{r['norace']['runs_held_out']}",
              f"{r['now']['exit']}/{r['norace']['exit']}", *(int(r["now"]["steps"][p]) for p in PHASES),
              int(r["norace"]["steps"]["search"]), r["steps_ratio"], r["steps_ratio_margin"],
              *(r["now"]["seconds"][p] for p in PHASES), r["norace"]["seconds"]["search"],
              r["compute_ratio"], r["compute_ratio_margin"],
              r["now"]["wall"], r["norace"]["wall"], r["wall_ratio"], r["now"]["val_loss"],
              r["norace"]["val_loss"]] for r in rows]
    print(table(head, lines))


def summarise(budget: str, rows: list[dict[str, Any]]) -> dict[str, float]:
    """The worst held-out rates and the median ratios of one budget, with RESULT lines."""
    s = {"worst_now": min(rate(r["now"]) for r in rows)}
    if "norace" in rows[0]:
        summarise_norace(budget, rows, s)
    if "alt" in rows[0]:
        s["worst_alt"] = min(rate(r["alt"]) for r in rows)
        for key in ("steps_saved", "search_steps_saved", "val_loss_ratio"):
            s[key] = median([r[key] for r in rows])
        now, alt = [r["now"]["val_loss"] for r in rows], [r["alt"]["val_loss"] for r in rows]
        s["val_median_ratio"] = median(now) / median(alt)
        s["val_median_ratio_low"], s["val_median_ratio_high"] = bootstrap_interval(now, alt)
        print(f"RESULT robustness {budget} steps_saved = {s['steps_saved']:.0%} of alt's search+race+verify steps "
              f"({s['search_steps_saved']:.0%} of its search's; median), held-out worst {s['worst_now']:.3f} now, "
              f"{s['worst_alt']:.3f} alt; val_loss now/alt {s['val_loss_ratio']:.3f} (median of the seeds' ratios)")
        print(f"RESULT robustness {budget} val_median_ratio = {s['val_median_ratio']:.3f} (the exports' median "
              f"held-out val_loss, now over alt; 95 % interval {s['val_median_ratio_low']:.3f} to "
              f"{s['val_median_ratio_high']:.3f}, a bootstrap over the {len(rows)} sampler seeds)")
    return s


def bootstrap_interval(now: list[float], alt: list[float], draws: int = 20000) -> tuple[float, float]:
    """The 2.5 and 97.5 percentiles of median(now) / median(alt) over sampler seeds drawn with
    replacement, each seed's pair together: how far the ratio of medians could move by the luck of
    which sampler seeds were measured (a wide interval: the seeds cannot tell the two apart)."""
    rnd, ratios = random.Random(0), []
    for _ in range(draws):
        picks = [rnd.randrange(len(now)) for _ in now]
        ratios.append(median([now[i] for i in picks]) / median([alt[i] for i in picks]))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of an earlier run's ``--json``."""
    with open(path) as f:
        rows: list[dict[str, Any]] = json.load(f)["rows"]
    return rows


def verdict(ok: bool) -> str:
    """A goal's word in a RESULT line."""
    return "met" if ok else "MISSED"


def summarise_norace(budget: str, rows: list[dict[str, Any]], s: dict[str, float]) -> None:
    """The RESULT lines of tuner now against the launch before racing and verification."""
    s |= {"worst_norace": min(rate(r["norace"]) for r in rows),
         "compute_ratio": median([r["compute_ratio"] for r in rows]),
         "compute_ratio_margin": median([r["compute_ratio_margin"] for r in rows]),
         "steps_ratio": median([r["steps_ratio"] for r in rows]),
         "steps_ratio_margin": median([r["steps_ratio_margin"] for r in rows]),
         "wall_ratio": median([r["wall_ratio"] for r in rows])}
    print(f"RESULT robustness {budget} worst_survival = {s['worst_now']:.3f} tuner now, {s['worst_norace']:.3f} "
          f"no racing (goal >= {GOAL_SURVIVAL:.3f} = 31/32: {verdict(s['worst_now'] >= GOAL_SURVIVAL)})")
    for key, what in (("compute_ratio", "search+race+verify"), ("compute_ratio_margin", "with the margin")):
        print(f"RESULT robustness {budget} {key} = {s[key]:.2f}x worker seconds, {what} vs no racing's search "
              f"(median; goal <= {GOAL_COMPUTE}: {verdict(s[key] <= GOAL_COMPUTE)})")
    print(f"RESULT robustness {budget} steps_ratio = {s['steps_ratio']:.2f}x steps ({s['steps_ratio_margin']:.2f}x "
          "with the margin; median)")
    print(f"RESULT robustness {budget} wall_ratio = {s['wall_ratio']:.2f}x (median)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", default="small,default", help="comma-separated: small, default")
    p.add_argument("--sampler-seeds", default="0,1,2", help="comma-separated sampler seeds")
    p.add_argument("--held-out-seeds", type=int, default=32, help="seeds of the held-out check (default 32)")
    p.add_argument("--smoke", action="store_true", help="3 trials x 60 steps, 4 held-out seeds, one sampler seed")
    p.add_argument("--now-flags", default="", help="extra launch flags of the 'tuner now' launches")
    p.add_argument("--alt-flags", help="also launch tuner now with these flags instead of --now-flags, and "
                                       "compare (--alt-flags='--pruner none': what the pruner saves)")
    p.add_argument("--no-racing-baseline", action="store_true",
                   help="skip the launch without racing (with --alt-flags: compare tuner now and alt only)")
    p.add_argument("--model", help="the model every launch trains (default: iterated_mlp)")
    p.add_argument("--space", help="its search space file (default: the model's shipped one)")
    p.add_argument("--json", help="write the raw figures here")
    p.add_argument("--from-json", nargs="+", metavar="JSON",
                   help="launch nothing: print the table and summaries of the rows in these --json files together")
    args = p.parse_args()
    if args.from_json:
        rows = [row for path in args.from_json for row in read_rows(path)]  # --now-flags names the variant
        VARIANTS["now"] = args.now_flags.split()
        print_rows(rows)
        for budget in dict.fromkeys(r["budget"] for r in rows):
            summarise(budget, [r for r in rows if r["budget"] == budget])
        return
    if args.model:  # launches run in temporary folders: a model file and the space by absolute path
        VERIFY_MODEL.extend(["--model", model_spec(args.model)])
        MODEL.extend(VERIFY_MODEL)
    if args.space:
        MODEL.extend(["--space", os.path.abspath(args.space)])
    seeds = [int(s) for s in args.sampler_seeds.split(",")]
    unknown = set(args.budgets.split(",")) - set(BUDGETS)
    if unknown:
        p.error(f"--budgets: unknown {', '.join(sorted(unknown))} (choose from {', '.join(BUDGETS)})")
    budgets = {name: BUDGETS[name] for name in args.budgets.split(",")}
    if args.smoke:
        budgets, seeds, args.held_out_seeds = {"smoke": SMOKE}, seeds[:1], 4
    VARIANTS["now"] = args.now_flags.split()
    if args.alt_flags is not None:
        VARIANTS["alt"] = args.alt_flags.split()
    if args.no_racing_baseline:
        if args.alt_flags is None:
            p.error("--no-racing-baseline leaves nothing to compare without --alt-flags")
        del VARIANTS["norace"]

    sizes = ", ".join(f"{n} ({t} trials x {s} steps)" for n, (t, s) in budgets.items())
    print_header(f"robustness of {args.model or 'iterated_mlp'}: {sizes}, "
                 f"sampler seeds {seeds}, {args.held_out_seeds} held-out seeds at 2x steps")
    rows, summaries = [], {}
    for budget, (trials, steps) in budgets.items():
        for seed in seeds:
            row = {"budget": budget, **measure(trials, steps, seed, args.held_out_seeds, args.smoke)}
            rows.append(row)
            print(f"{budget} S={seed}: held-out " + ", ".join(
                f"{row[v]['survived']}/{row[v]['runs_held_out']} {v}" for v in VARIANTS), flush=True)
    print_rows(rows)
    for budget in budgets:
        summaries[budget] = summarise(budget, [r for r in rows if r["budget"] == budget])
    write_json(args.json, {"rows": rows, "summaries": summaries})


if __name__ == "__main__":
    main()
