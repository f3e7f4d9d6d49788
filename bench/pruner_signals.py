"""Pruner signals: can any early reading of a trial's training loss rank its final validation loss better?

bench/pruner_replay.py replays stopping rules over the values a launch reports (each seed's mean
training loss over the 25 steps before a report). This asks whether another reading of the same
runs would rank better, and how well anything could: the recorded studies' trials (the ``--dir``
of pruner_replay, ``study-S.db``) are retrained, every seed as the search ran it, with every
step's training loss kept, and the validation loss at each report step up to half the steps
(``study-S.steps.json``; in a subprocess under ``BENCH_LOCK``, the only part that imports
TensorFlow). Retraining is exact: the seeds' mean validation loss is checked against the value the
study holds. Then, per signal (the mean, median or geometric mean of the last 25, 50 or 100 steps'
losses, or their minimum; or the validation loss from a quarter to a third of the steps, which
``--pruner behind`` compared at commit 4a5b639, an experiment measured in real launches and reverted):

- **Spearman**: how well the signal at a sixth, a quarter and half of the steps ranks the
  survivors' final validation loss (the mean of their seeds, what the search ranks), averaged over
  the studies;
- **replay**: the saving, winner kept and worst regret of ``--pruner behind`` and ``asha`` (as a
  launch makes them) when the reports carry this signal instead.

And the ceiling: how well one seed's final validation loss ranks another seed's (the survivors'
two search seeds), against how well the first seed's training loss at a quarter of the steps does.
An early signal cannot rank a config's quality much better than a second seed of the same config does.

Last, ``--pruner behind`` and ``--pruner first-seed`` (which reads a whole first seed before it runs
the second) replayed through tuner's own ``Search`` (``Recorded``: an executor that streams each
seed's recorded run, 2 slots, the runs in step): the saving against ``--pruner none`` replayed the
same way, whether the study's best trial still finishes, and the worst regret.

    BENCH_LOCK=/tmp/tf.lock .venv/bin/python bench/pruner_signals.py --dir /tmp/replay   # about 2 min a study
    .venv/bin/python bench/pruner_signals.py --dir /tmp/replay-lstm --model examples/adding_lstm.py:AddingRNN \
        --space examples/adding_lstm.yaml   # the model its studies were recorded with (pruner_replay.py --model)
    .venv/bin/python bench/pruner_signals.py --smoke    # one study of 4 trials x 100 steps, in a temporary folder
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence

import pruner_replay as pr
from benchlib import median, print_header, python_locked, table

from tuner.records import RunRecord, RunSpec, RunStatus

REPORT_EVERY = 25  # the launch's report interval (pruner_replay's studies use the default)
VAL_FACTOR = 2.0  # the factor of ``behind`` on the validation loss at 4a5b639 (its window: a quarter to a third)


def record(path: str) -> None:
    """Retrain every finished trial of study ``path`` (each of its seeds) and write every step's loss."""
    import optuna

    from tuner.worker.actor import import_tensorflow

    import_tensorflow()  # as a worker imports it: Keras 2 for tf.compat.v1's layers and cells
    import tensorflow as tf

    from tuner.models import load_model
    from tuner.records import RunSpec
    from tuner.spaces import config_from_flat
    from tuner.worker.graph import build, session_config
    from tuner.worker.train import Stepper

    tf.compat.v1.disable_eager_execution()
    model = load_model(pr.MODEL)
    study = pr.load(path)
    out = {}
    for t in study.get_trials(deepcopy=False):
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            continue
        trial = t.user_attrs["tuner.trial"]
        config = config_from_flat(trial["config"])
        data = model.data(config.knobs)
        seeds = {}
        for seed in (s["seed"] for s in trial["seeds"]):
            built = build(model, config, seed, lambda: False)
            spec = RunSpec(trial=t.number, seed=seed, model=pr.MODEL, config=config, steps=pr.STEPS)
            val_at: dict[str, float] = {}  # report step -> the validation loss there (up to half the steps)
            with tf.compat.v1.Session(graph=built.graph, config=session_config(1, gpu=False)) as sess:
                built.start(sess, config)
                stepper = Stepper(sess, built, data, spec)
                for step in range(1, pr.STEPS + 1):
                    if stepper.step(step) is not None:
                        break
                    if step % REPORT_EVERY == 0 and step <= pr.STEPS // 2:
                        val_at[str(step)] = float(sess.run(built.val_loss, stepper.feed_arrays(data.val)))
                losses, val = stepper.telemetry.losses, None
                if len(losses) == pr.STEPS:  # survived: its validation loss, as the search measures it
                    val = float(sess.run(built.val_loss, stepper.feed_arrays(data.val)))
            seeds[str(seed)] = {"losses": losses, "val": val, "val_at": val_at}
        out[str(t.number)] = {"value": t.value, "state": t.state.name, "seeds": seeds}
    with open(f"{path[:-3]}.steps.json.part", "w") as f:
        json.dump(out, f)
    os.replace(f"{path[:-3]}.steps.json.part", f"{path[:-3]}.steps.json")


def record_missing(directory: str) -> None:
    for path in sorted(glob.glob(os.path.join(directory, "study-*.db"))):
        if not os.path.exists(f"{path[:-3]}.steps.json"):
            done = python_locked([__file__, "--record", path, "--steps", str(pr.STEPS), "--model", pr.MODEL])
            if done.returncode:
                sys.exit(f"retraining {path} failed:\n{done.stderr[-4000:]}")
            print(f"retrained {os.path.basename(path)}", flush=True)


Signal = Callable[[dict, int], float]  # (a seed's run: "losses", "val_at"; the report step) -> its value there


def window(stat: Callable[[Sequence[float]], float], width: int) -> Signal:
    return lambda run, step: stat(run["losses"][max(0, step - width):step])


def val_in_window(run: dict, step: int) -> float:
    """What a launch with ``--pruner behind`` reported at 4a5b639: the validation loss from a quarter
    to a third of the steps (the pruner's window), the mean training loss of the last 25 steps elsewhere."""
    if pr.STEPS // 4 <= step <= pr.STEPS // 3:
        return run["val_at"][str(step)]
    return statistics.fmean(run["losses"][max(0, step - REPORT_EVERY):step])


def gmean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(x, 1e-12)) for x in xs))


SIGNALS: dict[str, Signal] = {
    "mean of 25 (what a launch reports)": window(statistics.fmean, 25),
    "val loss from 1/4 to 1/3 of the steps (behind: 2x)": val_in_window,
    "median of 25": window(statistics.median, 25),
    "median of 50": window(statistics.median, 50),
    "median of 100": window(statistics.median, 100),
    "geometric mean of 25": window(gmean, 25),
    "geometric mean of 50": window(gmean, 50),
    "mean of 100": window(statistics.fmean, 100),
    "minimum of 25": window(min, 25),
}


def curves(trials: dict, signal: Signal) -> list[pr.Curve]:
    """The study's trials as pruner_replay's curves, their reports carrying ``signal``."""
    out = []
    for number, t in sorted(trials.items(), key=lambda kv: int(kv[0])):
        runs = list(t["seeds"].values())
        last = min(len(r["losses"]) for r in runs)
        values = {s: statistics.fmean(signal(r, s) for r in runs)
                  for s in range(REPORT_EVERY, pr.STEPS + 1, REPORT_EVERY) if s <= last}
        finite = t["state"] == "COMPLETE"
        if not finite:
            values[last + 1] = math.nan  # the search reports NaN at the divergence step
        out.append(pr.Curve(int(number), values, pr.STEPS if finite else last + 1, len(runs),
                            t["value"] if finite else None))
    return out


def ceiling(trials: dict) -> tuple[float, float]:
    """(one seed's final validation loss ranking the other's; the first seed's signal at a quarter doing so)."""
    quarter = pr.STEPS // 4
    pairs = [list(t["seeds"].values()) for t in trials.values() if t["state"] == "COMPLETE"]
    pairs = [p for p in pairs if len(p) == 2 and None not in (p[0]["val"], p[1]["val"])]
    seed_to_seed = pr.spearman([(a["val"], b["val"]) for a, b in pairs])
    reported = SIGNALS["mean of 25 (what a launch reports)"]
    early = pr.spearman([(reported(a, quarter), b["val"]) for a, b in pairs])
    return seed_to_seed, early


class Recorded:
    """An executor for tuner's Search that streams the recorded runs, ``slots`` at a time, one record
    of each running run per poll (the runs in step, as equally fast workers): replay trial i's k-th
    submitted seed run is recorded trial i's k-th seed. Reports every ``REPORT_EVERY`` steps carry
    ``loss_mean`` (the last 25 steps' mean, as tuner.worker.telemetry sends it); ``trained[i]``
    counts the steps trial i ran."""

    def __init__(self, trials: list[dict], slots: int = 2) -> None:
        self.trials, self.slots = trials, slots
        self.queue: list[RunSpec] = []
        self.running: dict[tuple[int, int], Iterator[RunRecord]] = {}
        self.reached: dict[tuple[int, int], int] = {}  # a running run's last step
        self.handed: dict[int, int] = {}  # trial -> seed runs started
        self.trained: dict[int, int] = {}
        self.ended: list[RunRecord] = []  # cancelled runs, sent at the next poll

    def free(self) -> int:
        return self.slots - len(self.running) - len(self.queue)

    def submit(self, spec: RunSpec) -> None:
        self.queue.append(spec)

    def cancel(self, trial: int) -> None:
        for spec in [q for q in self.queue if q.trial == trial]:
            self.queue.remove(spec)
            self.ended.append(RunRecord(trial, spec.seed, 0, RunStatus.CANCELLED, final=True))
        for key in [k for k in self.running if k[0] == trial]:
            step = self.reached.pop(key, 0)
            del self.running[key]
            self.ended.append(RunRecord(trial, key[1], step, RunStatus.CANCELLED, final=True, steps_survived=step))
            self._count(trial, step)

    def _count(self, trial: int, steps: int) -> None:
        self.trained[trial] = self.trained.get(trial, 0) + steps

    def _run(self, spec: RunSpec) -> Iterator[RunRecord]:
        k = self.handed.get(spec.trial, 0)
        self.handed[spec.trial] = k + 1
        run = list(self.trials[spec.trial]["seeds"].values())[k]
        losses, val, key = run["losses"], run["val"], (spec.trial, spec.seed)
        for step in range(REPORT_EVERY, len(losses) + 1, REPORT_EVERY):
            self.reached[key] = step
            yield RunRecord(spec.trial, spec.seed, step, RunStatus.RUNNING, loss=losses[step - 1], steps_survived=step,
                            metrics={"loss_mean": statistics.fmean(losses[step - REPORT_EVERY:step])})
        if val is not None and math.isfinite(val):
            self._count(spec.trial, pr.STEPS)
            yield RunRecord(spec.trial, spec.seed, pr.STEPS, RunStatus.SURVIVED, final=True, steps_survived=pr.STEPS,
                            val_loss=val)
        else:  # diverged at the step after its last loss (or in its validation loss, at the end)
            step = min(len(losses) + 1, pr.STEPS)
            self._count(spec.trial, step)
            yield RunRecord(spec.trial, spec.seed, step, RunStatus.DIVERGED, final=True, steps_survived=step - 1)

    def poll(self, timeout: float) -> list[RunRecord]:
        out, self.ended = self.ended, []
        while self.queue and len(self.running) < self.slots:
            spec = self.queue.pop(0)
            self.running[(spec.trial, spec.seed)] = self._run(spec)
        for key, records in list(self.running.items()):
            record = next(records)
            out.append(record)
            if record.final:
                del self.running[key]
                self.reached.pop(key, None)
        return out


def replay_search(trials: dict, kind: str, pruner: object = None) -> tuple[dict[int, int], dict[int, float]]:
    """Replay a recorded study through tuner's Search with ``--pruner KIND`` as a launch makes it, or
    ``pruner`` asked from KIND's first step (no racing): (steps trained per trial, the validation
    loss of each trial told COMPLETE)."""
    import optuna

    from tuner.driver.evidence import SeedStream
    from tuner.driver.pruning import make_pruner, prune_start
    from tuner.driver.search import Budget, Search
    from tuner.spaces import space_from

    ordered = [t for _, t in sorted(trials.items(), key=lambda kv: int(kv[0]))]
    executor = Recorded(ordered)
    study = optuna.create_study(direction="minimize", pruner=pruner or make_pruner(kind, pr.STEPS))
    budget = Budget(len(ordered), pr.STEPS, seeds=2, report_every=REPORT_EVERY, prune_from=prune_start(kind, pr.STEPS))
    Search(study, space_from({}, "replay", {}, "<replay>"), "replay", executor, budget, stream=SeedStream(0)).run()
    values = {t.number: t.value for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE}
    return {i: executor.trained.get(i, 0) for i in range(len(ordered))}, values


def fixed_first_seed() -> object:
    """``--pruner first-seed`` as it was before its loss rule checked itself against the study
    (``FirstSeedPruner.cuts_a_winner``, 2026-12-07): the fixed 3x at every step."""
    from tuner.driver.pruning import FirstSeedPruner, prune_start

    class Fixed(FirstSeedPruner):
        def cuts_a_winner(self, trials: list, step: int, bar: float) -> bool:
            return False

    return Fixed(prune_start("first-seed", pr.STEPS), max_step=pr.STEPS // 2)


SEARCHED: dict[str, tuple[str, Callable[[], object] | None]] = {  # label -> (--pruner kind, another pruner of it)
    "behind": ("behind", None),
    "first-seed": ("first-seed", None),
    "first-seed, fixed loss rule (before 2026-12-07)": ("first-seed", fixed_first_seed),
}


def through_search(studies: dict[str, dict], kinds: dict[str, tuple[str, Callable[[], object] | None]]
                   ) -> list[list[object]]:
    """Per pruner (label -> its kind and, if not as a launch makes it, a factory), each study replayed
    through the search: the saving against ``none`` replayed the same way (median, and per study),
    the winner kept, and the worst regret."""
    rows = []
    base = {name: replay_search(trials, "none") for name, trials in studies.items()}
    for label, (kind, make) in kinds.items():
        saved, kept, regret = [], 0, []
        for name, trials in studies.items():
            steps, values = replay_search(trials, kind, make() if make else None)
            best, best_kept = min(base[name][1].values(), default=math.nan), min(values.values(), default=math.inf)
            saved.append(1 - sum(steps.values()) / sum(base[name][0].values()))
            kept += best_kept == best
            regret.append(best_kept / best)
        rows.append([label, median(saved), " ".join(f"{x:.0%}" for x in saved), f"{kept} of {len(studies)}",
                     max(regret)])
    return rows


def mean_finite(xs: Sequence[float]) -> float:
    finite = [x for x in xs if not math.isnan(x)]
    return statistics.fmean(finite) if finite else math.nan


def run(directory: str) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per replayed study
    record_missing(directory)
    paths = sorted(glob.glob(os.path.join(directory, "study-*.steps.json")))
    if not paths:
        sys.exit(f"no study-*.db in {directory}: record some with bench/pruner_replay.py --collect")
    studies = {}
    for path in paths:
        with open(path) as f:
            studies[os.path.basename(path)[6:-11]] = json.load(f)
    print_header(f"pruner signals over {len(studies)} retrained studies ({pr.TRIALS} trials x {pr.STEPS} steps)")
    worst = max(abs(statistics.fmean(r["val"] for r in t["seeds"].values()) - t["value"]) / t["value"]
                for s in studies.values() for t in s.values() if t["state"] == "COMPLETE")
    print(f"retrained trials reproduce the studies' validation losses: worst relative difference {worst:.1e}")
    checkpoints = tuple(max(REPORT_EVERY, pr.STEPS // k // REPORT_EVERY * REPORT_EVERY) for k in (6, 4, 2))
    rules = {"behind": pr.shipped("behind"), "asha": pr.shipped("asha")}
    rows = []
    for label, signal in SIGNALS.items():
        study_curves = [curves(trials, signal) for trials in studies.values()]
        ranks = [mean_finite([pr.spearman([(c.values[s], c.val_loss) for c in cs
                                           if c.val_loss is not None and s in c.values]) for cs in study_curves])
                 for s in checkpoints]
        row: list[object] = [label, *ranks]
        row_rules = dict(rules)
        if signal is val_in_window:  # with the rule it was measured with
            row_rules["behind"] = pr.behind(pr.STEPS // 4, VAL_FACTOR, pr.STEPS // 3)
        for rule in row_rules.values():
            results = [pr.replay(cs, rule) for cs in study_curves]
            row += [median([r[0] for r in results]), f"{sum(r[1] for r in results)} of {len(results)}",
                    max(r[2] for r in results)]
        rows.append(row)
    print(table(["signal", *(f"Spearman at {s}" for s in checkpoints),
                 *(f"{k}: {col}" for k in rules for col in ("saved", "winner kept", "worst regret"))], rows))
    ceilings = [ceiling(trials) for trials in studies.values()]
    print(table(["study", "seed A's val ranks seed B's", f"seed A's loss at {pr.STEPS // 4} ranks seed B's val"],
                [[name, *c] for name, c in zip(studies, ceilings, strict=True)]))
    searched = through_search(studies, SEARCHED)
    print("Replayed through tuner's Search (2 slots, runs in step; saved against --pruner none replayed so):")
    print(table(["--pruner", "saved (median)", "saved per study", "winner kept", "worst regret"], searched))
    first = searched[1]
    print(f"RESULT pruner_signals first_seed = {first[1]:.0%} saved (median), winner kept in {first[3]}, worst "
          f"regret {first[4]:.3f} (--pruner first-seed through the search; behind: {searched[0][1]:.0%}, "
          f"{searched[0][3]}, {searched[0][4]:.3f}; first-seed's fixed loss rule before 2026-12-07: "
          f"{searched[2][1]:.0%}, {searched[2][3]}, {searched[2][4]:.3f})")
    val = next(r for r in rows if SIGNALS[str(r[0])] is val_in_window)
    print(f"RESULT pruner_signals val_behind = {val[4]:.0%} saved (median), winner kept in {val[5]}, worst regret "
          f"{val[6]:.3f} (2x the best finished trial's validation loss, a quarter to a third of the steps)")
    best = max(rows, key=lambda r: r[2])
    print(f"RESULT pruner_signals best_rank = {best[2]:.3f} at step {checkpoints[1]} ({best[0]}; "
          f"the reported mean: {rows[0][2]:.3f})")
    print(f"RESULT pruner_signals seed_to_seed = {median([c[0] for c in ceilings]):.3f} (median Spearman of one "
          f"seed's final val loss with another's; one seed's loss at step {checkpoints[1]}: "
          f"{median([c[1] for c in ceilings]):.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="folder of pruner_replay's recorded studies (study-S.db)")
    p.add_argument("--smoke", action="store_true", help="record, retrain and read one study of 4 trials x 100 steps")
    p.add_argument("--record", metavar="STUDY_DB", help=argparse.SUPPRESS)  # the retraining subprocess
    p.add_argument("--steps", type=int, default=pr.STEPS, help=argparse.SUPPRESS)
    pr.add_model_args(p)
    args = p.parse_args()
    pr.use_model(args)
    pr.STEPS = args.steps
    if args.record:
        record(args.record)
        return
    if args.smoke:
        pr.TRIALS, pr.STEPS = 4, 100
        with tempfile.TemporaryDirectory(prefix="tuner-pruner-signals-") as tmp:
            pr.collect(tmp, 0)
            run(tmp)
        return
    if not args.dir:
        p.error("--dir is required (or --smoke)")
    run(args.dir)


if __name__ == "__main__":
    main()
