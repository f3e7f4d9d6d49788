"""TPE window: what reading a long study's best trials and its recent ones only does to the search.

tuner's TPE (``tuner.driver.search.make_sampler``) reads, past ``tuner.hooks.TPE_WINDOW`` (1000)
finished trials, only the best 25 of them and the 1000 most recent (``tuner.hooks.windowed_tpe``),
so that an ask costs the same at 5000 trials as at 1000. Real launches of that many trials are out
of reach here (``bench/search_efficiency.py`` runs tens of trials, where the window changes
nothing), so this bench scales the question down: ``--trials`` trials with a window of
``--window`` (default 1500 trials and a window of 250: the smallest window whose good group is
still TPE's largest, 25 = 10 % of 250, as in a study of 6000 trials against tuner's window of
1000), against TPE reading every trial, on ``--seeds`` sampler seeds.

The objective stands in for a model that diverges: on iterated_mlp's shipped space, a risk grows
with the learning rate and ``max_iter`` and falls with clipping, BatchNorm before ReLU and an input
clip; a config past the boundary diverges (told PRUNED at a step that comes sooner the further
past it is, as tuner tells a diverged trial), and below it the loss is best just short of the
boundary (the fastest learning rate that trains), plus L2's cost and noise. It is cheap, so the
sampler's own time is what is measured.

Reported per arm: the best value after each quarter of the trials, the share of the last quarter's
trials within 10 % of the best value any arm found (how well TPE still concentrates), the diverged
share, and the median ask (ask + suggestions) in the last quarter.

    .venv/bin/python bench/tpe_window.py [--trials 1500] [--window 250] [--seeds 3]
    .venv/bin/python bench/tpe_window.py --smoke
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
import warnings
from typing import Any

from benchlib import BENCH, MODEL, ROOT, median, print_header, table, write_json

BOUNDARY = 1.2  # the risk past which a config diverges


def objective(flat: dict[str, Any], rng: random.Random) -> tuple[float | None, int]:
    """(value, step): the final loss of a config that trains (step = the budget, 600), or None and
    the step at which it diverged."""
    risk = (math.log10(flat["learning_rate"] / 1e-4) + 0.1 * (flat["max_iter"] - 4)
            - (0.5 if flat.get("clip_norm") else 0.0) - (0.4 if flat["bn_order"] == "bn_relu" else 0.0)
            - (0.3 if flat.get("input_clip") else 0.0))
    if risk > BOUNDARY:
        return None, max(1, int(600 / (1 + 5 * (risk - BOUNDARY))))
    l2 = flat.get("l2_weight") or 0.0
    loss = 0.1 + 0.3 * (BOUNDARY - risk) ** 2 + 0.02 * math.log10(1 + l2 / 1e-6) / 4 + 0.01 * rng.random()
    return loss, 600


def run_study(window: int | None, trials: int, seed: int) -> dict[str, Any]:
    """One study of ``trials`` trials, asked and told one at a time; ``window`` None: TPE reads all."""
    import optuna

    from tuner.driver.search import make_sampler
    from tuner.models import load_model
    from tuner.spaces import load_space

    space = load_space(ROOT / "search_spaces" / f"{MODEL}.yaml", MODEL, load_model(MODEL).knobs)
    sampler = make_sampler("tpe", seed, len(space.searched()))
    sampler.window = window or 10**12  # type: ignore[attr-defined]
    study = optuna.create_study(sampler=sampler, direction="minimize")
    rng = random.Random(seed)
    values: list[float | None] = []
    asks: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(trials):
            started = time.perf_counter()
            trial = study.ask()
            flat = space.suggest(trial).flat()
            asks.append(time.perf_counter() - started)
            value, step = objective(flat, rng)
            values.append(value)
            if value is None:
                trial.report(float("nan"), step)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, value)
    return {"window": window, "seed": seed, "values": values, "asks": asks}


def summarise(study: dict[str, Any], best: float) -> dict[str, Any]:
    values, n = study["values"], len(study["values"])
    quarters = [min((v for v in values[: n * q // 4] if v is not None), default=float("nan")) for q in (1, 2, 3, 4)]
    last = values[3 * n // 4:]
    return {"window": study["window"] or "all", "seed": study["seed"], "best_by_quarter": quarters,
            "near_best_last_quarter": sum(v is not None and v <= 1.1 * best for v in last) / len(last),
            "diverged": sum(v is None for v in values) / n, "ask_last_quarter": median(study["asks"][3 * n // 4:])}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trials", type=int, default=1500)
    p.add_argument("--window", type=int, default=250,
                   help="finished trials TPE reads past its best 25 (under 250 its good group shrinks below 25)")
    p.add_argument("--seeds", type=int, default=3, help="sampler seeds per arm")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: checks that the script works")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if args.smoke:
        args.trials, args.window, args.seeds = 60, 20, 1
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print_header(f"TPE window: {args.trials} trials, TPE reading all of them against the best 25 and the "
                 f"{args.window} most recent, {args.seeds} sampler seed(s), a synthetic diverging objective")
    studies = []
    for seed in range(args.seeds):
        for window in (None, args.window):
            studies.append(run_study(window, args.trials, seed))
            print(f"  seed {seed}, window {window or 'all'}: done", flush=True)
    best = min(v for s in studies for v in s["values"] if v is not None)
    rows = [summarise(s, best) for s in studies]
    print(table(["TPE reads", "seed", "best after 1/4", "1/2", "3/4", "all", "near-best in last 1/4",
                 "diverged", "ask s (last 1/4)"],
                [[r["window"], r["seed"], *r["best_by_quarter"], r["near_best_last_quarter"], r["diverged"],
                  r["ask_last_quarter"]] for r in rows]))
    for arm in ("all", args.window):
        mine = [r for r in rows if r["window"] == arm]
        print(f"RESULT tpe_window reads {arm}: best {median([r['best_by_quarter'][-1] for r in mine]):.4f}, "
              f"near-best in the last quarter {median([r['near_best_last_quarter'] for r in mine]):.2f}, "
              f"ask {median([r['ask_last_quarter'] for r in mine]):.3f} s (medians of {len(mine)})")
    write_json(args.json, {"rows": rows, "best": best})


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
