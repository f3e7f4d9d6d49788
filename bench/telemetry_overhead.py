"""Telemetry overhead: iterated_mlp's bare train step against the same step with tuner's telemetry.

- bare: the batch, then one ``session.run`` of the train op fetching (weights finite, loss,
  unclipped gradient norm), then the finiteness check: what every step costs without telemetry.
- telemetry: ``tuner.worker.train.Stepper.step``, what ``train_run`` runs: the same, plus clip and
  loss-spike bookkeeping every step and, on report steps (every ``--report-every``), the
  per-weight gradient norms and watched |values| fetched with the train op and a snapshot of
  every variable for forensics.

Both run in one session, one thread (as a worker with one CPU), step by step in turn (a bare
step, a telemetry step, ...), so that other load on the machine hits both alike. A block is
``--steps`` steps of each (a multiple of ``--report-every``: every block holds its report steps);
its figure is the mean time per step of each kind. Printed, for wall time and for the process's
CPU time, over ``--repeats`` blocks: the median time per step of each kind, and the overhead as
the median over blocks of (telemetry / bare) - 1, with its quartiles.

    .venv/bin/python bench/telemetry_overhead.py [--steps 100] [--repeats 41] [--max-iter 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tuner.models.iterated_mlp import IteratedMLP
from tuner.records import RunSpec, TrainConfig
from tuner.worker.train import Stepper, build, non_finite, session_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=41, help="timed pairs of blocks")
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
        built.start(sess, config)
        stepper = Stepper(sess, built, data, spec)
        steps = {"bare": 0, "telemetry": 0}

        def bare(k: int) -> None:
            ok, loss, gnorm = sess.run(built.train_fetches, stepper.feed_arrays(data.batch(k, 0)))
            non_finite(float(loss), float(gnorm), bool(ok))

        def block() -> tuple[tuple[float, float], tuple[float, float]]:
            """(wall, CPU) seconds per step of the bare steps and of the telemetry steps of one block."""
            spent = {"bare": [0.0, 0.0], "telemetry": [0.0, 0.0]}
            for _ in range(args.steps):
                for kind, run_step in (("bare", bare), ("telemetry", stepper.step)):
                    steps[kind] += 1
                    wall, cpu = time.perf_counter(), time.process_time()
                    run_step(steps[kind])
                    spent[kind][0] += time.perf_counter() - wall
                    spent[kind][1] += time.process_time() - cpu
            b, t = spent["bare"], spent["telemetry"]
            return (b[0] / args.steps, b[1] / args.steps), (t[0] / args.steps, t[1] / args.steps)

        block()  # warm up
        pairs = [block() for _ in range(args.repeats)]
    print(f"iterated_mlp max_iter={args.max_iter}, batch {data.batch_size}, report every {args.report_every} steps, "
          f"1 thread; {args.repeats} blocks of {args.steps} bare + {args.steps} telemetry steps in turn; "
          f"load average {os.getloadavg()[0]:.2f}")
    for clock, i in (("wall", 0), ("CPU", 1)):
        bare_ms = statistics.median(b[i] for b, _ in pairs) * 1e3
        tele_ms = statistics.median(t[i] for _, t in pairs) * 1e3
        q1, q2, q3 = statistics.quantiles([t[i] / b[i] for b, t in pairs], n=4)
        print(f"{clock:>4} time per step: bare {bare_ms:.3f} ms, with telemetry {tele_ms:.3f} ms; overhead "
              f"{100 * (q2 - 1):+.1f} % (median of blocks; quartiles {100 * (q1 - 1):+.1f} to {100 * (q3 - 1):+.1f} %)")


if __name__ == "__main__":
    main()
