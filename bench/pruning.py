"""Pruning: how much training a search saves by stopping diverged trials, and how fast it stops them.

A study on iterated_mlp's shipped (default) space, driven through the public API
(``tuner.driver.search.Search`` on a ``tuner.driver.executor.RayExecutor``, an in-memory Optuna study, no
MLflow), with a callback that timestamps every record as the driver receives it. Figures:

- steps fraction: steps actually trained (all seed runs) / steps of a search that trains every
  trial to its budget (trials x seeds x steps);
- cancel latency: from the driver cancelling a diverged trial's siblings (once each has passed
  the earliest divergence step, from the alarm record the worker streams at the divergence step
  before its forensics replay: ``tuner.driver.search``) to receiving their CANCELLED records; were there
  no alarm, the diverged seed's ``forensics_seconds`` would be added (the replay then runs before
  the worker sends anything);
  A sibling cancelled while it was still building its graph (no step trained yet) counts too,
  and is shown apart ("starting"): it stops within about 64 ops of the build
  (``tuner.hooks.stoppable_graph``); a sibling cancelled in the executor's queue before it
  started does not count;
- report interval: the median time between two progress records of a run, the unit in which the
  goal (siblings cancelled within one report interval) is stated; and the steps a sibling trained
  past its last progress record before the cancel (at most ``report_every`` when it stops at its
  next report).

Few default-space trials have one seed diverge while its sibling still trains (often both
diverge at once), so each repeat also runs ``--probes`` probe trials: configs of
``bench/data/efficiency_space.yaml`` whose seeds diverged far apart in the reference grid. The
latency figures pool the default-space study and the probes; the steps fraction is the default
space's alone.

    .venv/bin/python bench/pruning.py [--repeats 3] [--trials 16] [--steps 600] [--seeds 2] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchlib import median, print_header, search_parser, table, write_json


class Clock:
    """A search callback: every record with the time the driver received it."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, Any]] = []  # (perf_counter seconds, RunRecord)

    def on_trial_start(self, number: int, config: Any, seeds: Any) -> None:
        """Nothing to time."""

    def on_trial_result(self, record: Any) -> None:
        """Timestamp the record."""
        self.arrivals.append((time.perf_counter(), record))

    def on_trial_complete(self, outcome: Any, record: Any = None) -> None:
        """Nothing to time."""


# configs of bench/data/efficiency_space.yaml whose two seeds diverge far apart in the reference grid
# (learning rate, max_iter): one seed diverges while its sibling trains on, which is what latency needs
QUEUED = "cancelled before it started"  # the executor's reason for a run cancelled in its queue (no latency)
PROBES = ((1.585e-3, 7), (1.585e-3, 8), (1.585e-3, 9), (3.981e-3, 8), (3.981e-3, 10), (1e-2, 11))


def one_repeat(executor: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The default-space study (steps fraction, latency), then the probes (more latency samples)."""
    import optuna

    from tuner.config import SPACES_DIR
    from tuner.models import load_model
    from tuner.spaces import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACES_DIR / "iterated_mlp.yaml", "iterated_mlp", load_model("iterated_mlp").knobs)
    from tuner.driver.search import make_sampler

    sampler = make_sampler("tpe", args.seed, len(space.searched()))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if args.smoke:  # a config that diverges within a few steps, so the latency path runs too
        study.enqueue_trial({"learning_rate": 1e-2, "max_iter": 4, "use_clip_norm": False, "use_epsilon": False,
                             "use_input_clip": False})
    main = run_study(executor, study, space, args.trials, args)
    row = {**steps_figures(main, args), **latency_figures([latency_samples(main)], "")}
    if args.probes:
        from reference_grid import efficiency_space

        study = optuna.create_study(direction="minimize")
        for rate, iters in PROBES[: args.probes]:
            study.enqueue_trial({"learning_rate": rate, "max_iter": iters})
        probes = run_study(executor, study, efficiency_space(), args.probes, args)
        row.update(latency_figures([latency_samples(main), latency_samples(probes)], "all_"))
    return row


def run_study(executor: Any, study: Any, space: Any, trials: int, args: argparse.Namespace) -> list[tuple[float, Any]]:
    """Run ``trials`` trials of ``study``; every record with the time the driver received it."""
    from tuner.driver.search import Budget, Search

    clock = Clock()
    budget = Budget(trials, args.steps, args.seeds, args.report_every)
    Search(study, space, "iterated_mlp", executor, budget, [clock]).run()
    return clock.arrivals


def steps_figures(arrivals: list[tuple[float, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Steps trained against the full budget, and the pruned trials."""
    trained = sum(r.step for _, r in arrivals if r.final)
    full = args.trials * args.seeds * args.steps
    pruned = len({r.trial for _, r in arrivals if r.final and r.status.value == "diverged"})
    return {"trained": trained, "full": full, "fraction": trained / full, "pruned_trials": pruned}


def cancel_times(arrivals: list[tuple[float, Any]]) -> dict[int, tuple[float, dict[int, int], float]]:
    """Trial -> (when the driver cancelled its siblings, each seed's last step then, forensics seconds
    that wait included): as ``tuner.driver.search`` does, once a seed diverged at step s and every seed has
    passed step s or ended (so a sibling that would diverge before s still does)."""
    seeds: dict[int, set[int]] = {}
    for _, r in arrivals:
        seeds.setdefault(r.trial, set()).add(r.seed)
    first: dict[int, int] = {}  # trial -> earliest divergence step seen
    reached: dict[int, dict[int, int]] = {}
    ended: dict[int, set[int]] = {}
    out: dict[int, tuple[float, dict[int, int], float]] = {}
    for t, r in arrivals:
        if r.trial in out:
            continue
        reached.setdefault(r.trial, {})[r.seed] = r.step
        if r.final:
            ended.setdefault(r.trial, set()).add(r.seed)
        if r.status.value == "diverged":
            first[r.trial] = min(first.get(r.trial, r.step), r.step)
        done = ended.get(r.trial, set())
        if r.trial in first and len(done) < len(seeds[r.trial]) and all(
                s in done or reached[r.trial].get(s, 0) >= first[r.trial] for s in seeds[r.trial]):
            wait = float(r.info.get("forensics_seconds", 0.0)) if r.final and r.status.value == "diverged" else 0.0
            out[r.trial] = (t, dict(reached[r.trial]), wait)
    return out


def latency_samples(arrivals: list[tuple[float, Any]]) -> dict[str, list[float]]:
    """Per cancelled sibling: seconds from the driver's cancel (:func:`cancel_times`) to its final
    record, and the steps it trained past its last progress record before the cancel."""
    cancels = cancel_times(arrivals)
    out: dict[str, list[float]] = {"steps": [], "starting": [], "training": [], "gaps": _progress_gaps(arrivals)}
    for t, r in arrivals:
        if r.final and r.status.value == "cancelled" and r.trial in cancels and r.error != QUEUED:
            when, reached, wait = cancels[r.trial]
            if r.step > 0:  # it was training (else it was still building its graph)
                out["steps"].append(r.step - reached.get(r.seed, 0))
                out["training"].append(t - when + wait)
            else:
                out["starting"].append(t - when)
    return out


def latency_figures(samples: list[dict[str, list[float]]], prefix: str) -> dict[str, Any]:
    """Medians and worst cases of the latency samples of one or more studies."""
    pooled = {k: [v for s in samples for v in s[k]] for k in samples[0]}
    return {f"{prefix}samples": len(pooled["training"]) + len(pooled["starting"]),
            f"{prefix}starting": len(pooled["starting"]),
            f"{prefix}starting_latency": median(pooled["starting"]),
            f"{prefix}training_latency": median(pooled["training"]),
            f"{prefix}max_training_latency": max(pooled["training"], default=float("nan")),
            f"{prefix}report_interval": median(pooled["gaps"]),
            f"{prefix}extra_steps": median(pooled["steps"]),
            f"{prefix}max_extra_steps": max(pooled["steps"], default=float("nan"))}


def _progress_gaps(arrivals: list[tuple[float, Any]]) -> list[float]:
    """Seconds between consecutive progress records of the same run."""
    last: dict[tuple[int, int], float] = {}
    gaps = []
    for t, r in arrivals:
        key = (r.trial, r.seed)
        if r.status.value == "running" and key in last:
            gaps.append(t - last[key])
        last[key] = t
    return gaps


def main() -> None:
    p = search_parser(__doc__, trials=16, steps=600)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--probes", type=int, default=len(PROBES), help="probe trials per repeat for more latency samples")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    args = p.parse_args()
    if args.smoke:
        args.repeats, args.trials, args.steps, args.report_every, args.probes = 1, 3, 40, 10, 1

    print_header(f"pruning: {args.trials} trials x {args.steps} steps x {args.seeds} seeds on the default "
                 f"iterated_mlp space, report every {args.report_every}, {args.repeats} repeat(s)")
    from tuner.environ import prepare_process

    prepare_process()
    from tuner.driver.executor import ClusterConfig, RayExecutor

    executor = RayExecutor(ClusterConfig(num_cpus=args.slots))
    try:
        rows = [one_repeat(executor, args) for _ in range(args.repeats)]
    finally:
        executor.close()
    print(table(["repeat", "steps trained / full", "pruned trials"],
                [[n + 1, r["fraction"], r["pruned_trials"]] for n, r in enumerate(rows)]))
    prefix = "all_" if args.probes else ""
    keys = ["samples", "starting", "report_interval", "training_latency", "max_training_latency", "starting_latency",
            "extra_steps", "max_extra_steps"]
    print(table(["repeat", "cancelled siblings", "of them starting", "report interval s", "training: cancel s",
                 "training: max s", "starting: cancel s", "steps past alarm", "max steps"],
                [[n + 1, *(r[prefix + k] for k in keys)] for n, r in enumerate(rows)]))
    m = {k: median([r[k] for r in rows]) for k in rows[0]}
    print(f"RESULT pruning steps_fraction = {m['fraction']:.3f} (steps trained / every trial to its budget)")
    training = m[prefix + "training_latency"]
    if training != training:
        print("RESULT pruning cancel_latency = n/a (no sibling was cancelled while training)")
    else:
        interval = m[prefix + "report_interval"]
        within = "within" if training <= interval else "NOT within"
        worst = max(r[prefix + "max_training_latency"] for r in rows)
        worst_steps = max(r[prefix + "max_extra_steps"] for r in rows)
        print(f"RESULT pruning cancel_latency = {training:.3f} s from the divergence to a training sibling's end, "
              f"median over repeats (worst {worst:.3f} s); report interval {interval:.3f} s: {within} one interval; "
              f"siblings trained {m[prefix + 'extra_steps']:.0f} steps past the alarm (worst {worst_steps:.0f}, "
              f"report every {args.report_every})")
    starting = m[prefix + "starting_latency"]
    if starting == starting:
        print(f"RESULT pruning cancel_latency_starting = {starting:.3f} s for a sibling still building its graph "
              "(it stops mid-build)")
    write_json(args.json, {"rows": rows, "medians": m})


if __name__ == "__main__":
    main()
