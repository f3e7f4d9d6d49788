"""The terminal view of a launch: live on a terminal, one line per trial otherwise.

It is a Callback of ``tuner.driver.search`` and shows the trials running (each seed's ``step/total``),
how many survived, diverged (at which step, on what, at which op) and failed, the elapsed time
and an estimate of what is left, and the best so far; :func:`summary_table` prints the table at
the end. Finished trials are shown from their :class:`~tuner.driver.trialrecord.TrialRecord`, as
``tuner report`` shows them (``tuner.driver.views``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from tuner.driver import trialrecord, views
from tuner.driver.trialrecord import TrialRecord
from tuner.records import Phase, RunRecord, TrainConfig, TrialOutcome, TrialState


class ProgressView:
    """Live progress of a launch (see the module docs).

    Args:
        total: trials this launch runs.
        live: redraw in place (default: when stdout is a terminal); else one line per trial.
        console: where to print.
        keys: the knobs shown per trial (the searched ones; None: all).
        steps: the steps of a search run (for ``step/total`` and the estimate of what is left).
    """

    def __init__(self, total: int, live: bool | None = None, console: Console | None = None,
                 keys: Sequence[str] | None = None, steps: int = 0) -> None:
        self.console = console or Console(stderr=False)
        self.total, self.keys, self.steps = total, keys, steps
        self.live_mode = sys.stdout.isatty() if live is None else live
        self._running: dict[int, dict[int, int]] = {}  # trial -> seed -> last step
        self._phase: dict[int, str] = {}  # trial -> the phase its runs are in
        self.done: list[TrialRecord] = []
        self._live: Live | None = None
        self._started = time.monotonic()

    def __enter__(self) -> ProgressView:
        self._started = time.monotonic()
        if self.live_mode:
            # redrawn 4 times a second from the current state, so the clock moves between records
            self._live = Live(console=self.console, refresh_per_second=4, get_renderable=self._render)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def on_trial_start(self, number: int, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Show the trial as running."""
        self._running[number] = {}
        self._refresh()

    def on_trial_result(self, record: RunRecord) -> None:
        """Track each seed's step."""
        if record.trial in self._running and not record.final:
            self._running[record.trial][record.seed] = record.step
            self._refresh()

    def on_phase_start(self, number: int, phase: Phase, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Show the config's race, verification or margin runs as running."""
        self._running[number] = {}
        self._phase[number] = phase.value
        self._refresh()

    def on_phase_end(self, outcome: TrialOutcome) -> None:
        """Print what the phase's runs gave, when not live."""
        self._running.pop(outcome.number, None)
        self._phase.pop(outcome.number, None)
        if self._live is None:
            line = f"  trial {outcome.number} {outcome.phase.value}: {phase_line(outcome)}"
            self.console.print(line, highlight=False, markup=False)
        self._refresh()

    def say(self, text: str) -> None:
        """A line about the launch (above the live view when live)."""
        self.console.print(text, highlight=False, markup=False)

    def on_trial_complete(self, outcome: TrialOutcome) -> None:
        """Move the trial to the finished counts; print a line when not live."""
        self._running.pop(outcome.number, None)
        self._phase.pop(outcome.number, None)
        record = TrialRecord.from_outcome(outcome, self.steps)
        self.done.append(record)
        if self._live is None:
            line = f"[{len(self.done)}/{self.total} {self.clock()}] {views.describe(record, self.keys)}"
            self.console.print(line, highlight=False, markup=False)
        self._refresh()

    def clock(self) -> str:
        """``1m05s elapsed, ~3m20s left``: the time so far, and an estimate from the trials' progress."""
        elapsed = time.monotonic() - self._started
        done = self.progress()
        text = f"{_duration(elapsed)} elapsed"
        if 0 < done < self.total:
            text += f", ~{_duration(elapsed * (self.total - done) / done)} left"
        return text

    def progress(self) -> float:
        """Trials finished, counting a running search trial by its seeds' mean share of the steps."""
        running = 0.0
        if self.steps:
            for number, seeds in dict(self._running).items():  # a copy: the live view's thread reads it too
                seeds = dict(seeds)
                if self._phase.get(number, "search") == "search" and seeds:
                    running += sum(min(s, self.steps) for s in seeds.values()) / (len(seeds) * self.steps)
        return min(float(self.total), len(self.done) + running)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def _render(self) -> Table:
        done = list(self.done)
        counts = {state: sum(r.state is state for r in done) for state in TrialState}
        table = Table(title=f"tuner: {len(done)}/{self.total} trials finished, {self.clock()}", show_header=False)
        table.add_row("survived", str(counts[TrialState.COMPLETE]))
        table.add_row("diverged", str(counts[TrialState.PRUNED]))
        table.add_row("stopped (behind)", str(counts[TrialState.STOPPED]))
        table.add_row("failed", str(counts[TrialState.FAIL]))
        total = f"/{self.steps}" if self.steps else ""
        for number, seeds in sorted(dict(self._running).items()):
            phase = self._phase.get(number, "search")
            steps = ", ".join(f"seed {s}: {step}{total if phase == 'search' else ''}"
                              for s, step in sorted(seeds.items())) or "starting"
            table.add_row(f"trial {number} {phase}", steps)
        best = trialrecord.best(list(self.done))
        table.add_row("best so far", views.describe(best[0], self.keys) if best else "-")
        return table


def phase_line(outcome: TrialOutcome) -> str:
    """``survived 2/2, val_loss 0.041`` or ``diverged at step 212 (seed S); 5 of 16 ended``."""
    ended = [r for r in outcome.seeds if r.status.value in ("survived", "diverged")]
    survived = sum(r.status.value == "survived" for r in ended)
    first = outcome.divergence
    text = f"survived {survived}/{len(ended)}"
    if first is not None:
        text += f", first divergence at step {first.step} (seed {first.seed})"
    if len(ended) < len(outcome.seeds):
        text += f", {len(outcome.seeds) - len(ended)} run(s) cancelled or failed"
    if outcome.value is not None:
        text += f", val_loss {outcome.value:.4g}"
    return text


def summary_table(outcomes: Iterable[TrialOutcome], keys: Sequence[str] | None = None, steps: int = 0) -> Table:
    """The trials of this launch as ``tuner report`` shows them (``tuner.driver.views.trials_table``)."""
    records = [TrialRecord.from_outcome(o, steps) for o in sorted(outcomes, key=lambda o: o.number)]
    return views.trials_table(records, keys)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
