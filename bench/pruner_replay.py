"""Pruner replay: which stopping rule saves steps without stopping the trial that would win?

A guide for choosing ``--pruner``, not its proof (``bench/robustness.py --alt-flags`` is that: real
launches, held-out seeds). Measuring one rule there costs two launches and two held-out checks per
sampler seed; this replays many rules over the same recorded studies in seconds.

Collect (``--collect``): for each sampler seed S, one search-only launch of iterated_mlp (or
``--model``, with ``--space``) at the default budget with no pruner (``python -m tuner launch
--trials 30 --steps 600 --race-seeds 0 --verify-seeds 0 --no-margin --pruner none --seed S``), its
Optuna SQLite storage kept in ``--dir``. Every trial's intermediate values (the seeds' mean
training loss every 25 steps) and its validation loss are recorded there.

Replay: each rule is a pruner as a launch makes it (Optuna's own classes and tuner's
``BehindBestPruner``, from ``tuner.driver.pruning``), on an in-memory Optuna study. The recorded
trials are replayed into it in the order they were asked, each reporting its values as the search
does and asked ``should_prune`` at the steps the search asks it, and told as the search tells it,
cut where the pruner stopped it. A trial sees the earlier trials as the pruner left them (all of
them finished: with 2 slots the trial just before may in truth not have reached that step yet, so
this is slightly optimistic for pruners that compare). For each rule and study:

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
    .venv/bin/python bench/pruner_replay.py --collect --sampler-seeds 0,1,2,3,4,5,6,7,8,9 --dir /tmp/replay-lstm \
        --model examples/adding_lstm.py:AddingRNN --space examples/adding_lstm.yaml
    .venv/bin/python bench/pruner_replay.py --smoke     # one study of 4 trials x 100 steps, in a temporary folder
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from benchlib import median, model_spec, print_header, python_locked, table

from tuner.driver.pruning import BehindBestPruner, make_pruner, prune_start

TRIALS, STEPS = 30, 600
MODEL, SPACE = "iterated_mlp", ""  # --model and --space: the model the recorded launches train, and its space


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
    argv = ["launch", "--trials", str(TRIALS), "--steps", str(STEPS), "--study", "replay", "--storage", f"sqlite:///{path}.part",
            "--model", MODEL, *(["--space", SPACE] if SPACE else []),
            "--out", os.path.join(directory, f"best-{seed}.yaml"), "--race-seeds", "0", "--verify-seeds", "0",
            "--no-margin", "--pruner", "none", "--no-tracking", "--no-live", "--num-cpus", "2", "--seed", str(seed)]
    done = python_locked(["-m", "tuner", *argv], cwd=directory)
    if done.returncode not in (0, 3):
        sys.exit(f"the launch for S={seed} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    os.replace(f"{path}.part", path)


def load(path: str) -> optuna.Study:
    """The one study a recorded launch wrote (``replay``; ``iterated_mlp`` in folders recorded before --model)."""
    storage = f"sqlite:///{path}"
    return optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)


def curves(path: str) -> list[Curve]:
    study = load(path)
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


# A rule: a fresh pruner and the first step at which the search asks it (``Budget.prune_from``)
Rule = Callable[[], tuple[optuna.pruners.BasePruner, int]]


def shipped(kind: str) -> Rule:
    """``--pruner KIND`` exactly as a launch of ``STEPS`` steps makes it."""
    return lambda: (make_pruner(kind, STEPS), prune_start(kind, STEPS))


def behind(min_step: int, factor: float, max_step: int | None = None) -> Rule:
    """tuner's BehindBestPruner with another start step, last step or factor."""
    return lambda: (BehindBestPruner(min_step, max_step, factor), min_step)


def asha(min_step: int, eta: int) -> Rule:
    """Optuna's SuccessiveHalvingPruner, rungs at ``min_step`` x ``eta``^k, keeping the best 1/``eta``."""
    return lambda: (optuna.pruners.SuccessiveHalvingPruner(min_resource=min_step, reduction_factor=eta,
                                                            min_early_stopping_rate=0), min_step)


def median_from(min_step: int) -> Rule:
    """Optuna's MedianPruner (5 startup trials), asked from ``min_step`` on."""
    return lambda: (optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0), min_step)


def replay(study: list[Curve], rule: Rule) -> tuple[float, bool, float]:
    """(share of steps saved, the best trial kept, regret) of ``rule`` on one study.

    The trials are replayed in order into an in-memory Optuna study with the rule's pruner: each
    reports its values as the search does and is asked ``should_prune`` at the steps the search asks
    it (from ``prune_from`` if not 0, before the last step); it is told as the search tells it (COMPLETE with
    its validation loss; PRUNED where it diverged, its last value NaN, or where it was stopped)."""
    pruner, prune_from = rule()
    replayed = optuna.create_study(direction="minimize", pruner=pruner)
    total = sum(c.steps * c.seeds for c in study)
    saved, kept = 0, []
    for c in study:
        trial, stop = replayed.ask(), None
        for step in sorted(c.values):
            trial.report(c.values[step], step)
            if 0 < prune_from <= step < c.steps and trial.should_prune():  # a NaN is only ever at c.steps
                stop = step
                break
        if stop is not None:
            saved += (c.steps - stop) * c.seeds
            replayed.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif c.val_loss is None:
            replayed.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            kept.append(c)
            replayed.tell(trial, c.val_loss)
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
    "--pruner behind (1.5x best from 150 to 300)": shipped("behind"),
    "--pruner asha (rungs 150, 450, best third)": shipped("asha"),
    "--pruner median (from 300)": shipped("median"),
    "asha from 150, best quarter": asha(150, 4),
    "asha from 100, best third": asha(100, 3),
    "asha from 75, best third": asha(75, 3),
    "median from 150": median_from(150),
    "median from 100": median_from(100),
    **{f"{f}x best from {m}": behind(m, f) for m in (50, 100, 150) for f in (1.3, 2.0, 3.0)},
    **{f"1.5x best from {m}": behind(m, 1.5) for m in (50, 100, 150)},
    **{f"{f}x best from {m} to {n}": behind(m, f, n) for m, n in ((100, 200), (100, 300), (150, 200))
       for f in (1.3, 1.5)},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="folder of the recorded studies (study-S.db)")
    p.add_argument("--collect", action="store_true", help="first record the studies that are missing")
    p.add_argument("--sampler-seeds", default="0,1,2", help="comma-separated sampler seeds to collect")
    p.add_argument("--smoke", action="store_true", help="record and replay one study of 4 trials x 100 steps")
    add_model_args(p)
    args = p.parse_args()
    use_model(args)
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


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=MODEL, help="the model the recorded launches train (default: iterated_mlp; "
                   "a path/to/file.py:Name is made absolute: launches run in --dir)")
    p.add_argument("--space", default="", help="its search space file (default: the model's shipped one)")


def use_model(args: argparse.Namespace) -> None:
    global MODEL, SPACE
    MODEL = model_spec(args.model)
    SPACE = os.path.abspath(args.space) if args.space else ""


def run(args: argparse.Namespace) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per replayed study
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
