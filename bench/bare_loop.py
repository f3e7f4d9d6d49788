"""The floor: the same seed runs with tuner's own training loop, in as many processes as the system had slots.

Reads runs (see ``benchlib``) from a JSON file and trains each with ``tuner.worker.train.train_run``
(graph build, session, steps, forensics of a divergence, validation: what a worker runs), stopped
where the measured tool's run stopped; no Ray, no Optuna, no MLflow, no driver. Each of the
``--processes`` processes is set up as a tuner worker is: ``OMP_NUM_THREADS=1`` (what Ray gives an
actor of one CPU), TensorFlow imported as a worker imports it (``tuner.worker.actor.import_tensorflow``),
the run's session config (``RunSpec.threads``), its data made once per model config and kept, and
the worker's graph cache (``tuner.worker.train.Graphs``; ``--rebuild`` builds every run's graph afresh).

The runs of one model config go to one process, one after another, so that a graph is built once
per config where a tool may build it once per slot; the processes take the configs in the order
the runs came, each the next one free. The wall time (processes started to the last run's end,
their TensorFlow imports included) is the floor: nothing tuner or Ray Tune does can beat it by
more than the noise. Prints the wall time; with ``--json`` writes it and each run's seconds.
Used by ``overhead.py``:

    .venv/bin/python bench/bare_loop.py RUNS.json [--processes 2] [--rebuild] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", help="a JSON list of runs, or an object with a 'runs' list")
    p.add_argument("--processes", type=int, default=1, help="processes training at once: the system's slots")
    p.add_argument("--rebuild", action="store_true", help="no graph cache: build every run's graph (--no-graph-reuse)")
    p.add_argument("--json", help="write the wall time and the per-run seconds here")
    args = p.parse_args()
    with open(args.runs) as f:
        doc = json.load(f)
    runs = doc["runs"] if isinstance(doc, dict) else doc

    context = multiprocessing.get_context("spawn")  # a fresh interpreter, as a Ray worker is
    todo, done = context.Queue(), context.Queue()
    for group in by_config(runs):
        todo.put(group)
    for _ in range(args.processes):
        todo.put(None)
    started = time.perf_counter()
    slots = [context.Process(target=slot, args=(todo, done, args.rebuild)) for _ in range(args.processes)]
    for process in slots:
        process.start()
    reports = [done.get() for _ in slots]
    wall = time.perf_counter() - started
    for process in slots:
        process.join()
    failed = [r["error"] for r in reports if "error" in r]
    if failed:
        raise SystemExit("a bare-loop process failed:\n" + "\n".join(failed))
    results = [result for r in reports for result in r["results"]]
    imports = [r["import_seconds"] for r in reports]
    print(f"{len(results)} runs, {sum(r['steps'] for r in results)} steps in {args.processes} process(es): "
          f"{wall:.2f} s wall, {sum(r['seconds'] for r in results):.2f} s of runs "
          f"(TensorFlow import per process: {', '.join(f'{s:.2f}' for s in imports)} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"wall": wall, "results": results, "import_seconds": max(imports),
                       "processes": args.processes, "rebuild": args.rebuild}, f)


def by_config(runs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The runs grouped by model config, in the order each config first came."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(json.dumps(run["config"], sort_keys=True), []).append(run)
    return list(groups.values())


def slot(todo: Any, done: Any, rebuild: bool) -> None:
    """One process: import TensorFlow as a worker does, then train groups until the queue says stop."""
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        started = time.perf_counter()
        from tuner.worker.actor import GRAPHS_KEPT, import_tensorflow

        import_tensorflow()
        from tuner.worker.train import Graphs

        import_seconds = time.perf_counter() - started
        graphs = Graphs(0 if rebuild else GRAPHS_KEPT)
        results = []
        while (group := todo.get()) is not None:
            results.extend(train(run, graphs) for run in group)
        done.put({"results": results, "import_seconds": import_seconds})
    except BaseException as exc:  # the parent waits for a report from every process
        import traceback

        done.put({"error": "".join(traceback.format_exception(exc))})


_MODELS: dict[str, Any] = {}  # name -> model, loaded once like a worker's
_DATA: dict[str, Any] = {}  # knobs -> (dataset, sample ids): the last config's, made once as a worker makes it


def train(run: dict[str, Any], graphs: Any) -> dict[str, Any]:
    """Train one run up to its ``stop`` step; its seconds, steps and status."""
    from benchlib import MODEL, run_key, train_config

    from tuner.models import load_model
    from tuner.preflight import without
    from tuner.records import RunSpec
    from tuner.worker.train import train_run

    started = time.perf_counter()
    if MODEL not in _MODELS:
        _MODELS[MODEL] = load_model(MODEL)
    model = _MODELS[MODEL]
    config = train_config(run["config"])
    spec = RunSpec(0, run["seed"], MODEL, config, run["steps"], run["report_every"])
    key = json.dumps(dict(config.knobs), sort_keys=True)
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = without(model.data(config.knobs), spec.skip)
    data, sample_ids = _DATA[key]
    reached = [0]  # the step of the latest record: should_stop is asked right after a report
    stop = lambda: reached[0] >= run["stop"]  # noqa: E731
    for record in train_run(model, data, spec, stop, None, sample_ids, graphs):
        reached[0] = record.step
        final = record
    seconds = time.perf_counter() - started
    return {"key": run_key(run), "seconds": seconds, "steps": final.step, "status": final.status.value}


if __name__ == "__main__":
    main()
