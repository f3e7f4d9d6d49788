"""The floor: the same seed runs in one process, one after another, with tuner's own training loop.

Reads runs (see ``benchlib``) from a JSON file and trains each with ``tuner.worker.train.train_run``
(graph build, session, steps, forensics of a divergence, validation: what a worker runs), stopped
where the measured tool's run stopped; no Ray, no Optuna, no MLflow. Prints the total, and with
``--json`` writes each run's seconds. Used by ``overhead.py`` and ``scaling.py``:

    .venv/bin/python bench/bare_loop.py RUNS.json [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", help="a JSON list of runs, or an object with a 'runs' list")
    p.add_argument("--json", help="write the per-run seconds here")
    args = p.parse_args()
    with open(args.runs) as f:
        doc = json.load(f)
    runs = doc["runs"] if isinstance(doc, dict) else doc

    started = time.perf_counter()
    import tensorflow  # noqa: F401

    import_seconds = time.perf_counter() - started
    results = [train(run) for run in runs]
    total = sum(r["seconds"] for r in results)
    print(f"{len(results)} runs, {sum(r['steps'] for r in results)} steps: {total:.2f} s "
          f"(TensorFlow import in this process: {import_seconds:.2f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "import_seconds": import_seconds}, f)


_DATA: dict[str, Any] = {}  # knobs -> dataset, made once like a worker's (not timed)


def train(run: dict[str, Any]) -> dict[str, Any]:
    """Train one run up to its ``stop`` step; its seconds, steps and status."""
    from benchlib import MODEL, run_key, train_config

    from tuner.models import load_model
    from tuner.records import RunSpec
    from tuner.worker.train import train_run

    model = load_model(MODEL)
    config = train_config(run["config"])
    key = json.dumps(dict(config.knobs), sort_keys=True)
    if key not in _DATA:
        _DATA[key] = model.data(config.knobs)
    spec = RunSpec(0, run["seed"], MODEL, config, run["steps"], run["report_every"])
    reached = [0]  # the step of the latest record: should_stop is asked right after a report
    started = time.perf_counter()
    for record in train_run(model, _DATA[key], spec, should_stop=lambda: reached[0] >= run["stop"]):
        reached[0] = record.step
        final = record
    seconds = time.perf_counter() - started
    return {"key": run_key(run), "seconds": seconds, "steps": final.step, "status": final.status.value}


if __name__ == "__main__":
    main()
