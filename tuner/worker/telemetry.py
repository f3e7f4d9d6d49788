"""Stability telemetry of one seed run, in plain Python on numbers the train step already fetched.

Every step adds its loss and unclipped global gradient norm (:meth:`Telemetry.add`): whether the
step was clipped, whether its loss spiked (above ``SPIKE_FACTOR`` times the median of the last
``SPIKE_WINDOW`` losses) and the counts so far. A report step adds the mean loss of the steps
since the last report (``loss_mean``: what the pruner compares, less noisy than one batch's
loss) and what the train step fetched only then (per-weight gradient norms, the largest |value|
of each watched tensor), and becomes a report point; the last ``POINTS_KEPT`` report points go
into a divergence's forensics. The final record carries the summary: max and p50/p90/p99 of the
gradient norm, clip fraction, spike count.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping

import numpy as np

SPIKE_FACTOR = 3.0  # a loss above this many times its running median is a spike
SPIKE_WINDOW = 50  # steps in the running median
SPIKE_WARMUP = 10  # no spike is called before this many steps
POINTS_KEPT = 50  # report points kept for divergence.json
STEPS_KEPT = 50  # (step, loss, grad_norm) kept for divergence.json


class Telemetry:
    """Running numbers of one seed run (see the module docs)."""

    def __init__(self, clip_norm: float | None) -> None:
        self.clip_norm = clip_norm
        self.losses: list[float] = []
        self.gnorms: list[float] = []
        self.clipped = 0  # steps clipped so far
        self.last_clipped = False
        self.spike_steps: list[int] = []
        self.points: deque[dict[str, float]] = deque(maxlen=POINTS_KEPT)
        self._window: deque[float] = deque()  # the last SPIKE_WINDOW losses, in step order
        self._sorted: list[float] = []  # the same losses, sorted (for the median)
        self.init_val_loss: float | None = None  # validation loss before the first step
        self._reported = 0  # steps added up to the latest report

    @property
    def steps(self) -> int:
        """Steps added so far (all finite)."""
        return len(self.losses)

    def add(self, step: int, loss: float, gnorm: float, clipped: bool | None = None) -> None:
        """Count one finite step; ``clipped``: whether clipping changed a gradient (None: the
        global norm above ``clip_norm``)."""
        self.losses.append(loss)
        self.gnorms.append(gnorm)
        self.last_clipped = (self.clip_norm is not None and gnorm > self.clip_norm) if clipped is None else clipped
        self.clipped += self.last_clipped
        if len(self._window) >= SPIKE_WARMUP:
            median = self._sorted[len(self._sorted) // 2]
            if loss > median + (SPIKE_FACTOR - 1.0) * abs(median):
                self.spike_steps.append(step)
        self._window.append(loss)
        bisect.insort(self._sorted, loss)
        if len(self._window) > SPIKE_WINDOW:
            del self._sorted[bisect.bisect_left(self._sorted, self._window.popleft())]

    def clip_fraction(self) -> float:
        """Fraction of the steps so far whose gradient norm was above the clip threshold."""
        return self.clipped / len(self.gnorms) if self.gnorms else 0.0

    def report(self, step: int, fetched: Mapping[str, float]) -> dict[str, float]:
        """The metrics of a report step; ``fetched`` holds the report-only values (see tuner.worker.train)."""
        since = self.losses[self._reported:] or self.losses[-1:]
        self._reported = len(self.losses)
        metrics = {
            "loss_mean": sum(since) / len(since),  # the training loss over the steps since the last report
            "clipped": float(self.last_clipped),
            "clip_fraction": self.clip_fraction(),
            "loss_spikes": float(len(self.spike_steps)),
            **{name: float(value) for name, value in fetched.items()},
        }
        self.points.append({"step": float(step), "loss": self.losses[-1], "grad_norm": self.gnorms[-1], **metrics})
        return metrics

    def last_steps(self) -> tuple[tuple[int, float, float], ...]:
        """(step, loss, grad_norm) of the last ``STEPS_KEPT`` steps (step k is the k-th added)."""
        start = max(0, len(self.losses) - STEPS_KEPT)
        return tuple((i + 1, self.losses[i], self.gnorms[i]) for i in range(start, len(self.losses)))

    def summary(self) -> dict[str, float]:
        """The end-of-run metrics (empty before the first finite step)."""
        if not self.gnorms:
            return {}
        g = np.asarray(self.gnorms)
        p50, p90, p99 = np.percentile(g, [50, 90, 99])
        return {
            "grad_norm_max": float(g.max()), "grad_norm_p50": float(p50),
            "grad_norm_p90": float(p90), "grad_norm_p99": float(p99),
            "clip_fraction": self.clip_fraction(), "loss_spikes": float(len(self.spike_steps)),
        }
