"""A run that sends no record for too long is ended: the deadline comes from the model's own pace.

A model whose ``build`` (or a training step) never returns for some knob values would hold its slot
for ever, and its heartbeat would keep its trial "alive" in the study. The executor asks this
watchdog, at every poll, which runs have been silent past their deadline, kills their workers and
FAILs them with the reason ("no progress for 95 s while building the graph").

The deadline is ``FACTOR`` times the longest silence of the same kind that a run of this launch has
shown (from its start to its first record: the graph build and the first report steps; between two
records: ``--report-every`` steps), and never below ``FLOOR`` seconds. Before any run has shown its
pace, ``FIRST`` seconds. ``--run-timeout`` replaces all of this with one fixed deadline. So where
other builds took seconds, a hung one is ended after ``FLOOR``; a slow model (a big CNN on a shared
GPU) sets its own, longer deadline.

A run's forensics (the replay of its diverging step) come between its DIVERGED record and its final
one; that wait is judged as a build is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

FACTOR = 10.0  # times the longest silence seen of the same kind
FLOOR = 120.0  # seconds: no deadline is shorter (a loaded machine, a build that waited for a CPU)
FIRST = 600.0  # seconds: the deadline before any run has shown the model's pace


@dataclass
class _Watched:
    since: float  # when the run started, or sent its last record
    step: int | None = None  # the step of its last record (None: none yet, still building)
    building: bool = True  # the silence is a build's (or forensics'), not report steps'


class Watchdog:
    """Deadlines of the runs in flight (see the module docs).

    Args:
        fixed: ``--run-timeout``: one deadline in seconds for every silence (None: from the pace).
        clock: the time source (a test's fake clock).
    """

    def __init__(self, fixed: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.fixed, self.clock = fixed, clock
        self._runs: dict[Hashable, _Watched] = {}
        self._longest = {True: 0.0, False: 0.0}  # building? -> the longest silence a run ended

    def started(self, run: Hashable) -> None:
        """A run was sent to a worker."""
        self._runs[run] = _Watched(self.clock())

    def heard(self, run: Hashable, step: int, diverged: bool = False) -> None:
        """A run sent a record at ``step`` (``diverged``: its forensics come next, judged as a build)."""
        watched = self._runs.get(run)
        if watched is None:
            return
        now = self.clock()
        kind = watched.building
        self._longest[kind] = max(self._longest[kind], now - watched.since)
        self._runs[run] = _Watched(now, step, building=diverged)

    def forget(self, run: Hashable) -> None:
        """The run ended (or its worker died): no deadline any more."""
        self._runs.pop(run, None)

    def deadline(self, building: bool) -> float:
        """Seconds of silence after which a run is ended."""
        if self.fixed is not None:
            return self.fixed
        longest = self._longest[building] or (self._longest[True] if not building else 0.0)
        return FIRST if not longest else max(FLOOR, FACTOR * longest)

    def overdue(self) -> list[tuple[Hashable, str]]:
        """The runs silent past their deadline, each with the reason in words."""
        now = self.clock()
        out = []
        for run, watched in self._runs.items():
            silent = now - watched.since
            if silent > self.deadline(watched.building):
                doing = ("while building the graph" if watched.step is None
                         else f"after step {watched.step}" + (" (its forensics)" if watched.building else ""))
                out.append((run, f"no progress for {silent:.0f} s {doing}"))
        return out
