"""A/B of one worker's run cost across two commits: 6 runs of 600 steps of iterated_mlp at max_iter 10,
each with a fresh graph build (no reuse), in one process; prints the total and the training seconds.

Run it in each tree, alternating (the figures in BENCHMARKS.md, "Before and after, per run"):

    git worktree add /tmp/before 65b66c3
    (cd /tmp/before && PYTHONPATH=/tmp/before /work/main/.venv/bin/python /work/main/bench/data/ab_run_cost.py before)
    PYTHONPATH=. .venv/bin/python bench/data/ab_run_cost.py after
"""

import os
import sys
import time

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from tuner.worker.actor import import_tensorflow

import_tensorflow()
from tuner.models import load_model  # noqa: E402
from tuner.records import RunSpec, TrainConfig  # noqa: E402
from tuner.worker.train import train_run  # noqa: E402

model = load_model("iterated_mlp")
knobs = {k: v.default for k, v in model.knobs.items()} | {
    "max_iter": 10, "bn_order": "bn_relu", "epsilon": 1e-6, "input_clip": 10.0}
data = model.data(knobs)
total = train = 0.0
for i in range(6):
    config = TrainConfig(1e-3, clip_norm=None if i % 2 else 1.0, knobs=knobs)
    started = time.perf_counter()
    records = list(train_run(model, data, RunSpec(i, 100 + i, "iterated_mlp", config, 600, 25)))
    train += records[-1].info["train_seconds"]
    total += time.perf_counter() - started
print(sys.argv[1] if len(sys.argv) > 1 else "", f"total {total:.2f}s train {train:.2f}s", records[-1].status)
