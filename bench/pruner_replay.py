"""Pruner replay: which stopping rule saves steps without stopping the trial that would win?

A guide for choosing ``--pruner``, not its proof (``bench/robustness.py --alt-flags`` is that: real
launches, held-out seeds). Measuring one rule there costs two launches and two held-out checks per
sampler seed; this replays many rules over the same recorded studies in seconds.

Collect (``--collect``): for each sampler seed S, one search-only launch of iterated_mlp at the
default budget with no pruner (``python -m tuner launch --trials 30 --steps 600 --race-seeds 0
--verify-seeds 0 --no-margin --pruner none --seed S``), its Optuna SQLite storage kept in
``--dir``. Every trial's intermediate values (the seeds' mean training loss every 25 steps) and its
validation loss are recorded there.

Replay: each rule walks the trials in the order they were asked; at each report step it sees the
trial's own values so far and the earlier trials' values (all of them: with 2 slots the trial
just before may in truth not have reached that step yet, so this is slightly optimistic for rules
that compare). For each rule and study:

- **saved**: the share of the study's search steps (seeds x steps each trial trained) that the
  rule would not have trained (a stopped trial's remaining steps, its seeds together);
- **best kept**: whether the study's best trial (lowest validation loss of the trials that
  survived) trains to the end;
- **regret**: the best validation loss of the trials the rule keeps over the study's best
  (1.000: the same winner).

What it cannot show: the sampler's trajectory (TPE learns from pruned trials differently), racing
and the verification, and held-out survival.

    .venv/bin/python bench/pruner_replay.py --collect --sampler-seeds 0,1,2,3,4,5 --dir /tmp/replay
    .venv/bin/python bench/pruner_replay.py --dir /tmp/replay
    .venv/bin/python bench/pruner_replay.py --smoke     # one study of 4 trials x 100 steps, in a temporary folder
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from benchlib import ROOT, median, print_header, table

TRIALS, STEPS = 30, 600


@dataclass
class Curve:
    number: int
    values: dict[int, float]  # step -> the seeds' mean training loss (NaN: diverged there)
    steps: int  # the last step the trial trained to
    seeds: int
    val_loss: float | None  # None: it diverged


def collect(directory: str, seed: int) -> None:
    path = os.path.join(directory, f"study-{seed}.db")
    if os.path.exists(path):
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    lock = ["flock", os.environ["BENCH_LOCK"]] if os.environ.get("BENCH_LOCK") else []
    argv = ["launch", "--trials", str(TRIALS), "--steps", str(STEPS), "--study", "iterated_mlp", "--storage", f"sqlite:///{path}.part",
            "--out", os.path.join(directory, f"best-{seed}.yaml"), "--race-seeds", "0", "--verify-seeds", "0",
            "--no-margin", "--pruner", "none", "--no-tracking", "--no-live", "--num-cpus", "2", "--seed", str(seed)]
    done = subprocess.run([*lock, sys.executable, "-m", "tuner", *argv], cwd=directory, env=env,
                          capture_output=True, text=True)
    if done.returncode not in (0, 3):
        sys.exit(f"the launch for S={seed} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    os.replace(f"{path}.part", path)


def curves(path: str) -> list[Curve]:
    study = optuna.load_study(study_name="iterated_mlp", storage=f"sqlite:///{path}")
    out = []
    for t in study.get_trials(deepcopy=False):
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            continue
        record = t.user_attrs.get("tuner.trial", {})
        seeds = len(record.get("seeds", [])) or 2
        values = {int(s): float(v) for s, v in t.intermediate_values.items()}
        finite = t.state is optuna.trial.TrialState.COMPLETE
        last = STEPS if finite else max(values, default=0)
        out.append(Curve(t.number, values, last, seeds, t.value if finite else None))
    return sorted(out, key=lambda c: c.number)


# A rule: (the trial's values so far, the earlier trials, the step) -> stop now?
Rule = Callable[[dict[int, float], list[Curve], int], bool]


def sha(min_step: int, eta: int) -> Rule:
    """Optuna's SuccessiveHalvingPruner (asynchronous): at rungs min_step * eta^k, stop a trial not in
    the best 1/eta of the trials that reached the rung (the first ones: unless it is the best)."""
    rungs = [min_step * eta ** k for k in range(8) if min_step * eta ** k < STEPS]

    def rule(own: dict[int, float], earlier: list[Curve], step: int) -> bool:
        if step not in rungs:
            return False
        value = own[step]
        competing = sorted([c.values[step] for c in earlier if step in c.values and not math.isnan(c.values[step])]
                           + [value])
        idx = max(len(competing) // eta - 1, 0)
        return value > competing[idx]
    return rule


def ratio(min_step: int, factor: float, survivors: bool = False) -> Rule:
    """Stop from ``min_step`` on a trial whose loss is above ``factor`` x the best earlier loss at that
    step (``survivors``: of the earlier trials that trained to the end without diverging)."""
    def rule(own: dict[int, float], earlier: list[Curve], step: int) -> bool:
        if step < min_step:
            return False
        best = [c.values[step] for c in earlier if step in c.values and not math.isnan(c.values[step])
                and (not survivors or c.val_loss is not None)]
        return len(best) >= 3 and own[step] > factor * min(best)
    return rule


def median_rule(min_step: int, startup: int = 5) -> Rule:
    """Optuna's MedianPruner: from ``min_step``, the trial's best value so far above the median of the
    completed trials' values at that step."""
    def rule(own: dict[int, float], earlier: list[Curve], step: int) -> bool:
        if step < min_step:
            return False
        done = [c.values[step] for c in earlier if c.val_loss is not None and step in c.values]
        if len(done) < startup:
            return False
        return min(v for s, v in own.items() if s <= step) > statistics.median(done)
    return rule


def replay(study: list[Curve], rule: Rule) -> tuple[float, bool, float]:
    """(share of steps saved, the best trial kept, regret) of ``rule`` on one study."""
    total = sum(c.steps * c.seeds for c in study)
    saved, kept, earlier = 0, [], []  # earlier: the trials so far as the rule left them (cut where it stopped them)
    for c in study:
        stop = next((s for s in sorted(c.values) if s < c.steps and not math.isnan(c.values[s])
                     and rule({k: v for k, v in c.values.items() if k <= s}, earlier, s)), None)
        if stop is None:
            kept.append(c)
            earlier.append(c)
        else:
            saved += (c.steps - stop) * c.seeds
            earlier.append(Curve(c.number, {k: v for k, v in c.values.items() if k <= stop}, stop, c.seeds, None))
    finite = [c.val_loss for c in study if c.val_loss is not None]
    best = min(finite) if finite else math.nan
    kept_finite = [c.val_loss for c in kept if c.val_loss is not None]
    best_kept = min(kept_finite) if kept_finite else math.inf
    return saved / total, best_kept == best, best_kept / best


def spearman(pairs: list[tuple[float, float]]) -> float:
    """Spearman's rank correlation of the pairs (ties broken by order; NaN under 3 pairs)."""
    if len(pairs) < 3:
        return math.nan

    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=xs.__getitem__)
        r = [0.0] * len(xs)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r
    a, b = ranks([x for x, _ in pairs]), ranks([y for _, y in pairs])
    return statistics.correlation(a, b)


RULES: dict[str, Rule] = {
    "asha 150 x3 (today's --pruner asha)": sha(150, 3),
    "asha 150 x4": sha(150, 4),
    "asha 75 x3": sha(75, 3),
    "asha 100 x3": sha(100, 3),
    "median from 300": median_rule(300),
    "median from 150": median_rule(150),
    "median from 100": median_rule(100),
    **{f"{f}x best from {m}" + (" (--pruner behind)" if (f, m) == (1.5, 150) else ""): ratio(m, f)
       for m in (50, 100, 150) for f in (1.5, 2.0, 3.0)},
    **{f"{f}x best survivor from {m}": ratio(m, f, True) for m in (50, 100, 150) for f in (1.3, 1.5, 2.0)},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="folder of the recorded studies (study-S.db)")
    p.add_argument("--collect", action="store_true", help="first record the studies that are missing")
    p.add_argument("--sampler-seeds", default="0,1,2", help="comma-separated sampler seeds to collect")
    p.add_argument("--smoke", action="store_true", help="record and replay one study of 4 trials x 100 steps")
    args = p.parse_args()
    if args.smoke:
        global TRIALS, STEPS
        TRIALS, STEPS = 4, 100
        args.collect, args.sampler_seeds = True, "0"
        with tempfile.TemporaryDirectory(prefix="tuner-pruner-replay-") as tmp:
            args.dir = tmp
            run(args)
        return
    if not args.dir:
        p.error("--dir is required (or --smoke)")
    run(args)


def run(args: argparse.Namespace) -> None:
    os.makedirs(args.dir, exist_ok=True)
    if args.collect:
        for seed in (int(s) for s in args.sampler_seeds.split(",")):
            collect(args.dir, seed)
            print(f"recorded S={seed}", flush=True)
    paths = sorted(glob.glob(os.path.join(args.dir, "study-*.db")))
    if not paths:
        sys.exit(f"no study-*.db in {args.dir}: record some with --collect")
    studies = {os.path.basename(p)[6:-3]: curves(p) for p in paths}
    print_header(f"pruner replay over {len(studies)} recorded studies ({TRIALS} trials x {STEPS} steps, no pruner)")
    for name, study in studies.items():
        finite = sum(c.val_loss is not None for c in study)
        print(f"S={name}: {len(study)} trials, {finite} survived, best val_loss "
              f"{min((c.val_loss for c in study if c.val_loss is not None), default=math.nan):.4g}")
    print("How well the training loss at a step ranks the survivors' validation loss (Spearman, per study):")
    checkpoints = (50, 100, 150, 300, 450)
    print(table(["study", *(f"step {s}" for s in checkpoints)],
                [[name, *(spearman([(c.values[s], c.val_loss) for c in study if c.val_loss is not None
                                    and s in c.values]) for s in checkpoints)] for name, study in studies.items()]))
    rows = []
    for label, rule in RULES.items():
        results = [replay(study, rule) for study in studies.values()]
        rows.append([label, median([r[0] for r in results]), " ".join(f"{r[0]:.0%}" for r in results),
                     sum(r[1] for r in results), " ".join(f"{r[2]:.3f}" for r in results),
                     max(r[2] for r in results)])
    print(table(["rule", "saved (median)", "saved per study", f"best kept (of {len(studies)})", "regret per study",
                 "worst regret"], rows))
    for row in rows:
        print(f"RESULT pruner_replay {row[0].split(' (')[0]}: saved = {row[1]:.0%} (median), winner kept in "
              f"{row[3]} of {len(studies)}, worst regret = {row[5]:.3f}")


if __name__ == "__main__":
    main()
