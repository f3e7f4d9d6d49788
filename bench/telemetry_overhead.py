"""Telemetry overhead: iterated_mlp's bare train step against the same step with tuner's telemetry.

- bare: the batch, then one ``session.run`` of the train op fetching (weights finite, loss,
  unclipped gradient norm), then the finiteness check: what every step costs without telemetry.
- telemetry: ``tuner.train.Stepper.step``, what ``train_run`` runs: the same, plus clip and
  loss-spike bookkeeping every step and, on report steps (every ``--report-every``), the
  per-weight gradient norms and watched |values| fetched with the train op and a snapshot of
  every variable for forensics.

Both run in one session, one thread (as a worker with one CPU), in alternating blocks of
``--steps`` steps, ``--repeats`` times; the figure is the median time per step of each.

    .venv/bin/python bench/telemetry_overhead.py [--steps 400] [--repeats 9] [--max-iter 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tuner.models.iterated_mlp import IteratedMLP
from tuner.records import RunSpec, TrainConfig
from tuner.train import Stepper, build, non_finite, session_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=9, help="timed blocks of each kind")
    p.add_argument("--max-iter", type=int, default=10, help="iterated_mlp's max_iter")
    p.add_argument("--report-every", type=int, default=25, help="steps between report steps")
    args = p.parse_args()

    model = IteratedMLP()
    knobs = {k: v.default for k, v in model.knobs.items()} | {"max_iter": args.max_iter, "epsilon": 1e-6}
    config = TrainConfig(1e-4, clip_norm=1.0, knobs=knobs)  # a guard and a low rate: no divergence
    total = 2 * args.steps * (args.repeats + 1)
    spec = RunSpec(0, 0, "iterated_mlp", config, total, args.report_every)
    data = model.data(knobs)
    built = build(model, config, seed=0)
    with tf.compat.v1.Session(graph=built.graph, config=session_config(1, gpu=False)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        stepper = Stepper(sess, built, data, spec)
        step = 0

        def bare(k: int) -> None:
            ok, loss, gnorm = sess.run(built.train_fetches, stepper.feed_arrays(data.batch(k, 0)))
            non_finite(float(loss), float(gnorm), bool(ok))

        def block(run_step: Callable[[int], object]) -> float:
            nonlocal step
            start = time.perf_counter()
            for _ in range(args.steps):
                step += 1
                run_step(step)
            return (time.perf_counter() - start) / args.steps

        block(bare), block(stepper.step)  # warm up both
        times: dict[str, list[float]] = {"bare": [], "telemetry": []}
        for _ in range(args.repeats):
            times["bare"].append(block(bare))
            times["telemetry"].append(block(stepper.step))
    bare_ms = statistics.median(times["bare"]) * 1e3
    tele_ms = statistics.median(times["telemetry"]) * 1e3
    print(f"iterated_mlp max_iter={args.max_iter}, batch {data.batch_size}, report every {args.report_every} steps, "
          f"1 thread; median of {args.repeats} blocks of {args.steps} steps")
    print(f"bare train step:      {bare_ms:.3f} ms")
    print(f"with telemetry:       {tele_ms:.3f} ms")
    print(f"overhead:             {100 * (tele_ms / bare_ms - 1):+.1f} %")


if __name__ == "__main__":
    main()
