"""The baseline: the same search written with Ray Tune 2.60 and OptunaSearch, as a Tune user would.

Same model (iterated_mlp), same search space (the shipped ``search_spaces/iterated_mlp.yaml``,
given to OptunaSearch as a define-by-run function: the same ``suggest`` calls as tuner makes),
same sampler (``tuner.driver.search.make_sampler``'s TPE, the same seed), same budget, same training loop
(``tuner.worker.train.train_run``, so only the orchestration differs). One Tune trial is one config: it
trains its seeds one after another on one CPU, reports every ``--report-every`` steps, and stops at
the first seed that diverges (a diverged trial scores ``1000 + steps missed``: OptunaSearch
cannot be told NaN or PRUNED). ``--slots`` trials run at once. The wall time covers
``ray.init`` to ``ray.shutdown``, with the libraries already imported.

    .venv/bin/python bench/ray_tune_baseline.py [--trials 16] [--steps 300] [--seeds 2] [--reuse-actors]
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
_DATA: dict[str, Any] = {}  # knobs -> dataset, kept for the trials a reused actor runs next


def trainable(config: dict[str, Any], steps: int, seeds: int, report_every: int) -> None:
    """One Tune trial (see the module docs); its last report carries the runs it trained."""
    from benchlib import MODEL, train_config
    from ray import tune

    from tuner.worker.actor import use_legacy_keras

    use_legacy_keras()  # as tuner's workers: tf.compat.v1.layers need Keras 2, chosen before TF is imported
    from tuner.models import load_model
    from tuner.records import RunSpec, RunStatus
    from tuner.worker.train import train_run

    model = load_model(MODEL)
    train = train_config(config["train_config"])
    key = json.dumps(dict(train.knobs), sort_keys=True)
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = model.data(train.knobs)
    runs: list[dict[str, Any]] = []
    val_losses: list[float] = []
    for seed in range(seeds):
        spec = RunSpec(0, seed, MODEL, train, steps, report_every)
        for record in train_run(model, _DATA[key], spec):
            if record.status is RunStatus.RUNNING:  # not the alarm a divergence sends before its forensics
                tune.report({"val_loss": record.loss, "seed": seed, "step": record.step})
        runs.append({"config": config["train_config"], "seed": seed, "steps": steps,
                     "report_every": report_every, "stop": record.step, "status": record.status.value})
        if record.status is not RunStatus.SURVIVED:
            value = 1000.0 + steps - record.steps_survived
            break
        val_losses.append(float(record.val_loss or 0.0))
    else:
        value = sum(val_losses) / len(val_losses)
    tune.report({"val_loss": value, "runs": json.dumps(runs), "done": True})


class DefineByRun:
    """OptunaSearch's define-by-run space: tuner's ``SearchSpace.suggest`` on the shipped space.

    A module-level class, not a closure: Tune pickles the searcher at every experiment checkpoint.
    """

    def __call__(self, trial: Any) -> dict[str, Any]:
        return {"train_config": self.space().suggest(trial).flat()}

    @staticmethod
    def space() -> Any:
        """The shipped iterated_mlp space."""
        from tuner.models import load_model
        from tuner.spaces import load_space

        path = BENCH.parent / "search_spaces" / "iterated_mlp.yaml"
        return load_space(path, "iterated_mlp", load_model("iterated_mlp").knobs)


def run_tune(trials: int, steps: int, seeds: int, report_every: int, slots: int, seed: int,
             reuse_actors: bool) -> dict[str, Any]:
    """Run the baseline search; its wall time and the runs its trials trained."""
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from tuner.driver.search import make_sampler

    sampler = make_sampler("tpe", seed, len(DefineByRun.space().searched()))  # the same sampler as tuner's
    search = OptunaSearch(space=DefineByRun(), metric="val_loss", mode="min", sampler=sampler)
    fn = tune.with_parameters(trainable, steps=steps, seeds=seeds, report_every=report_every)
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp:
        started = time.perf_counter()
        ray.init(address="local", num_cpus=slots, include_dashboard=False, log_to_driver=False)
        tuner = tune.Tuner(
            tune.with_resources(fn, {"cpu": 1}),
            tune_config=tune.TuneConfig(search_alg=search, num_samples=trials, max_concurrent_trials=slots,
                                        reuse_actors=reuse_actors),
            run_config=tune.RunConfig(storage_path=tmp, name="baseline", verbose=0),
        )
        grid = tuner.fit()
        ray.shutdown()
        wall = time.perf_counter() - started
    if grid.errors:
        raise RuntimeError(f"{len(grid.errors)} Tune trial(s) failed: {grid.errors[0]}")
    runs = [run for k in range(len(grid)) for run in json.loads((grid[k].metrics or {})["runs"])]
    return {"wall": wall, "runs": runs, "trials": len(grid)}


def main() -> None:
    from benchlib import search_parser

    p = search_parser(__doc__, trials=16, steps=300, repeats=False)
    p.add_argument("--slots", type=int, default=2, help="trials at once (CPUs of the local cluster)")
    p.add_argument("--reuse-actors", action="store_true", help="Tune's reuse_actors=True (default: False)")
    args = p.parse_args()

    # the workers import this module by name (it is on their PYTHONPATH): trainable's cache lives there
    os.environ["PYTHONPATH"] = os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    from tuner.driver.executor import _ensure_token
    from tuner.environ import prepare_process

    prepare_process()
    _ensure_token()
    importlib.import_module("ray.tune.search.optuna")  # the libraries are imported before the clock starts
    module = importlib.import_module("ray_tune_baseline")  # this file by name: workers import it by reference

    doc = module.run_tune(args.trials, args.steps, args.seeds, args.report_every, args.slots,
                                     args.seed, args.reuse_actors)
    steps = sum(r["stop"] for r in doc["runs"])
    print(f"Ray Tune + OptunaSearch, reuse_actors={args.reuse_actors}: {doc['trials']} trials, "
          f"{len(doc['runs'])} seed runs, {steps} steps in {doc['wall']:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(doc))


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
