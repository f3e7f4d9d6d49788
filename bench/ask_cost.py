"""Ask cost: what one ``study.ask`` (and the trial's suggestions) costs the driver, against the
number of trials in flight, on the storage and sampler a launch uses; and where that time goes.

For each ``--inflight`` N the script builds a study as a launch on a large cluster would hold it:
``--finished`` finished trials (their intermediate values every ``--report-every`` steps of
``--steps``), and N running trials (each with the latest value the driver's batching has written);
then it times ``--asks`` asks of tuner's sampler (TPE, multivariate, grouped, constant liar:
``tuner.driver.search.make_sampler``), each followed by the config's suggestions (``tuner.spaces``),
as ``Search._ask`` does; through the storage a launch opens (``--cache driver``: an Optuna RDB
storage with heartbeats that keeps the driver's running trials in memory, ``tuner.driver.liveness``
and ``tuner.hooks.driver_storage``) and through Optuna's own cache over the same database
(``--cache optuna``, what launches used before: it reads every trial in flight back at each read).
The studies are built with a random sampler (cheap) and only the timed asks use TPE. With
``--profile``, one more ask at the largest N runs under cProfile and the functions that took most
of it are printed.

    .venv/bin/python bench/ask_cost.py [--inflight 50 200 500 1000] [--finished 200 ...] [--asks 5]
        [--cache driver optuna] [--tpe-window 0 1000] [--profile]
    .venv/bin/python bench/ask_cost.py --smoke
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import sys
import tempfile
import time
import warnings
from typing import Any

from benchlib import BENCH, MODEL, ROOT, median, print_header, table, write_json


def build(storage_url: str, finished: int, inflight: int, steps: int, report_every: int,
          cache: str) -> tuple[Any, Any]:
    """A study with ``finished`` finished and ``inflight`` running trials; and the space. ``cache``:
    "driver" (the storage a launch opens) or "optuna" (Optuna's own cache over the same database)."""
    import optuna

    from tuner.driver.liveness import Liveness
    from tuner.models import load_model
    from tuner.spaces import load_space

    model = load_model(MODEL)
    space = load_space(ROOT / "search_spaces" / f"{MODEL}.yaml", MODEL, model.knobs)
    liveness = Liveness(30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage = (liveness.storage(storage_url) if cache == "driver" else
                   optuna.storages.RDBStorage(storage_url, heartbeat_interval=liveness.interval))
    study = optuna.create_study(storage=storage, direction="minimize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in range(finished + inflight):
            trial = study.ask()
            space.suggest(trial)
            if n < finished:
                for step in range(report_every, steps + 1, report_every):
                    trial.report(1.0 / step, step)
                if n % 5 == 0:  # about a fifth diverge: PRUNED at their divergence step
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(trial, 0.1 + (n % 17) / 100)
            else:
                trial.report(0.5, report_every)  # the latest value the driver's batching wrote
    return study, space


def timed_asks(study: Any, space: Any, asks: int, window: int | None = None) -> list[float]:
    """Seconds of each of ``asks`` asks with tuner's sampler, each with its suggestions; ``window``:
    the finished trials TPE reads past its best (``tuner.hooks.windowed_tpe``; 0: all, as Optuna's TPE)."""
    import optuna

    from tuner.driver.search import make_sampler
    from tuner.hooks import flush_held

    study.sampler = make_sampler("tpe", 0, len(space.searched()))
    if window is not None:
        study.sampler.window = window or 10**12
    seconds, asked = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(asks):
            started = time.perf_counter()
            asked.append(study.ask())
            space.suggest(asked[-1])
            flush_held(study)  # as Search._ask does
            seconds.append(time.perf_counter() - started)
        for trial in asked:  # the trials in flight stay as many for the next setting (TPE reads no FAIL)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return seconds


def profile_ask(study: Any, space: Any, top: int = 15) -> str:
    """cProfile of one more ask: the functions with the most cumulative time."""
    from tuner.hooks import flush_held

    profiler = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profiler.enable()
        space.suggest(study.ask())
        flush_held(study)
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--inflight", type=int, nargs="+", default=[50, 200, 500, 1000])
    p.add_argument("--finished", type=int, nargs="+", default=[200], help="finished trials (the sampler's history)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--report-every", type=int, default=25)
    p.add_argument("--asks", type=int, default=5)
    p.add_argument("--storage", default="sqlite", help="sqlite (a file per study), or an RDB URL to write to")
    p.add_argument("--cache", nargs="+", choices=["driver", "optuna"], default=["driver", "optuna"],
                   help="driver: the storage a launch opens (tuner.hooks.driver_storage); optuna: Optuna's own cache")
    p.add_argument("--tpe-window", type=int, nargs="+", default=[None],
                   help="finished trials TPE reads past its best 25 (0: all of them; default: tuner's, "
                        "tuner.hooks.TPE_WINDOW); each is timed on the same study")
    p.add_argument("--profile", action="store_true", help="cProfile one ask at the largest --inflight")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if args.smoke:
        args.inflight, args.finished, args.asks, args.profile = [4, 8], [10], 2, True
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print_header(f"ask cost: TPE (tuner's settings) on {args.storage}, finished trials of "
                 f"{args.steps} steps, a value every {args.report_every}; {args.asks} asks per point")
    rows, profile = [], ""
    for cache, finished, inflight in itertools.product(args.cache, args.finished, args.inflight):
        with tempfile.TemporaryDirectory(prefix="tuner-ask-cost-") as tmp:
            url = f"sqlite:///{tmp}/optuna.db" if args.storage == "sqlite" else args.storage
            started = time.perf_counter()
            study, space = build(url, finished, inflight, args.steps, args.report_every, cache)
            built = time.perf_counter() - started
            timed = {w: timed_asks(study, space, args.asks, w) for w in args.tpe_window}
            seconds = timed[args.tpe_window[0]]
            timed_asks(study, space, 0, args.tpe_window[0])  # the profile's sampler: the first setting's
            if args.profile and inflight == max(args.inflight) and finished == max(args.finished):
                profile += (f"cProfile of one ask at {inflight} in flight, {finished} finished, {cache} cache "
                            "(cumulative):\n")
                profile += profile_ask(study, space)
        for window, seconds in timed.items():
            rows.append({"cache": cache, "inflight": inflight, "finished": finished, "tpe_window": window,
                         "median_s": median(seconds), "max_s": max(seconds), "built_s": built})
            print(f"  {cache} cache, {inflight} in flight, {finished} finished, TPE window "
                  f"{'tuner default' if window is None else window or 'none'}: ask + suggest median "
                  f"{median(seconds):.3f} s (max {max(seconds):.3f} s)", flush=True)
    print(table(["cache", "trials in flight", "finished", "TPE window", "ask median s", "ask max s"],
                [[r["cache"], r["inflight"], r["finished"], "default" if r["tpe_window"] is None else r["tpe_window"],
                  r["median_s"], r["max_s"]] for r in rows]))
    if profile:
        print(profile)
    for cache in args.cache:
        for key, fixed, label in (("inflight", "finished", "in flight"), ("finished", "inflight", "finished")):
            mine = [r for r in rows if r["cache"] == cache and r[fixed] == rows[0][fixed]
                    and r["tpe_window"] == args.tpe_window[0]]
            if len(mine) < 2:
                continue
            first, last = mine[0], mine[-1]
            growth = last["median_s"] / first["median_s"] if first["median_s"] else float("nan")
            print(f"RESULT ask_cost {cache} cache median = {last['median_s']:.3f} s at {last[key]} {label}, "
                  f"{first['median_s']:.3f} s at {first[key]} ({growth:.1f}x; {first[fixed]} {fixed})")
    write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
