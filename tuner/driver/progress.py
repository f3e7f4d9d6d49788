"""The terminal view of a launch: live on a terminal, one line per event otherwise.

It is a Callback of ``tuner.driver.search`` and shows the trials running (each seed's ``step/total``),
how many survived, diverged (at which step, on what, at which op) and failed, the elapsed time
and what is left (``tuner.driver.eta``: the steps still to train, search, races, verification and
margin, at this launch's measured speed), and the best so far (the incumbent:
``tuner.driver.trialrecord.incumbent``). The table at the end is ``tuner.driver.wrapup``'s.
Finished trials are shown from their :class:`~tuner.driver.trialrecord.TrialRecord`, as ``tuner
report`` shows them (``tuner.driver.views``).

Piped or redirected (stdout not a terminal: :func:`output_console`), there is no live view, and each
event is one line that starts with its marker: ``[3/30 1m05s elapsed, ~2m10s left] trial 7: ...`` for
a trial, ``[verify 5/16 ...] trial 4 seed S: ...`` for a verification or margin run, ``  trial 4
race: ...`` for a race level; lines are never wrapped, so a log can be read and grepped by line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tuner.driver import views
from tuner.driver.counts import Counts
from tuner.driver.eta import Eta, Work
from tuner.driver.trialrecord import TrialRecord
from tuner.records import Phase, RunRecord, RunStatus, TrainConfig, TrialOutcome

PIPED_WIDTH = 120  # piped or redirected: the width tables are laid out in (their cells wrap); lines never wrap
LIVE_REFRESH = 2  # redraws a second of the live view: the clock moves, and a terminal log stays small
ESTIMATE_S = 1.0  # seconds between two estimates of the time left (ProgressView.clock)
_RUN_LINES = (Phase.VERIFY, Phase.MARGIN)  # phases whose runs get a line each when not live


def output_console(**kwargs: Any) -> Console:
    """The console of a command's own output (``kwargs``: rich's ``Console`` arguments).

    On a terminal, rich's own: the terminal's width, colours, a live view. Piped or redirected,
    every line is written whole (``soft_wrap``: never wrapped at 80 columns mid-phrase, never
    cropped) and tables are laid out in :data:`PIPED_WIDTH` columns whatever width the terminal
    behind the pipe has, so a log reads the same everywhere.
    """
    console = Console(**kwargs)
    if console.is_terminal:
        return console
    return Console(**{"width": PIPED_WIDTH, "soft_wrap": True, **kwargs})


class ProgressView:
    """Live progress of a launch (see the module docs).

    Args:
        total: trials this launch runs (0: a verification alone, ``tuner verify``).
        live: redraw in place; None: when the console is a terminal. Never when it is not (a live
            view written into a log file is megabytes of redraws).
        console: where to print (default: :func:`output_console`).
        keys: the knobs shown per trial (the searched ones; None: all).
        steps: the steps of a search run (for ``step/total``).
        work: what the launch trains, for the estimate of what is left (default: ``total`` trials
            of one seed x ``steps``, nothing after the search).
        label: how a trial's number is named in its lines (``tuner verify``: the config file).
        clock: seconds, monotonic (a fake one in the tests).
        race_seeds: the launch's race target (0: no racing): the incumbent, "best so far", is the
            trial the export would pick now (``tuner.driver.trialrecord.incumbent``).
    """

    def __init__(self, total: int, live: bool | None = None, console: Console | None = None,
                 keys: Sequence[str] | None = None, steps: int = 0, work: Work | None = None,
                 label: Callable[[int], str] = lambda number: f"trial {number}",
                 clock: Callable[[], float] = time.monotonic, race_seeds: int = 0) -> None:
        self.console = console or output_console()
        self.race_seeds = race_seeds  # seeds a trial must survive to be the incumbent (trialrecord.incumbent)
        self.total, self.keys, self.steps, self.label = total, keys, steps, label
        self.live_mode = live is not False and self.console.is_terminal
        self.eta = Eta(work or Work(total, steps), clock)
        self._clock = clock
        self._running: dict[int, dict[int, int]] = {}  # trial -> seed -> last step, runs in flight
        self._phase: dict[int, str] = {}  # trial -> the phase its runs are in
        self._runs: dict[int, list[int]] = {}  # trial -> [runs ended, runs] of its verification or margin
        self.done: list[TrialRecord] = []
        self._live: Live | None = None
        self._started = clock()
        self._left: tuple[float, float | None] | None = None  # (when, the estimate then): at most one a second

    def __enter__(self) -> ProgressView:
        self._started = self._clock()
        if self.live_mode:
            # redrawn from the current state a few times a second (so the clock moves), never per record
            self._live = Live(console=self.console, refresh_per_second=LIVE_REFRESH, get_renderable=self._render)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(kind, exc, tb)
            self._live = None

    def on_trial_start(self, number: int, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Show the trial as running."""
        self._running[number] = {}
        self.eta.trial_started(number)

    def on_trial_result(self, record: RunRecord) -> None:
        """Track each seed's step; a line per verification or margin run that ended, when not live."""
        self.eta.record(record)
        running = self._running.get(record.trial)
        if running is None:
            return
        if not record.final:
            running[record.seed] = record.step
            return
        running.pop(record.seed, None)
        counts = self._runs.get(record.trial)
        if counts is not None and record.phase in _RUN_LINES:
            counts[0] += 1
            if self._live is None and record.status is not RunStatus.CANCELLED:
                self._print(f"[{record.phase.value} {counts[0]}/{counts[1]} {self.clock()}] "
                            f"{self.label(record.trial)} seed {record.seed}: {run_line(record)}")

    def on_phase_start(self, number: int, phase: Phase, config: TrainConfig, seeds: Sequence[int]) -> None:
        """Show the config's race, verification or margin runs as running."""
        self._running[number] = {}
        self._phase[number] = phase.value
        self._runs[number] = [0, len(seeds)]
        self.eta.phase_started(number, phase, len(seeds))

    def on_phase_end(self, outcome: TrialOutcome) -> None:
        """Print what the phase's runs gave, when not live."""
        self._running.pop(outcome.number, None)
        self._phase.pop(outcome.number, None)
        self._runs.pop(outcome.number, None)
        self.eta.phase_ended(outcome)
        if self._live is None:
            self._print(f"  {self.label(outcome.number)} {outcome.phase.value}: {phase_line(outcome)}")

    def say(self, text: str) -> None:
        """A line about the launch (above the live view when live)."""
        self._print(text)

    def on_trial_complete(self, outcome: TrialOutcome, record: TrialRecord) -> None:
        """Move the trial to the finished counts; print a line when not live."""
        self._running.pop(outcome.number, None)
        self._phase.pop(outcome.number, None)
        self.eta.trial_finished(outcome.number)
        self.done.append(record)
        if self._live is None:
            self._print(f"[{len(self.done)}/{self.total} {self.clock()}] {views.describe(record, self.keys)}")

    def clock(self) -> str:
        """``1m05s elapsed, ~3m20s left``: the time so far and the estimate of what is left
        (``tuner.driver.eta``, made again at most every ``ESTIMATE_S`` seconds and counted down
        between; not shown before a run has trained measurably, nor once nothing is left)."""
        now = self._clock()
        text = f"{_duration(now - self._started)} elapsed"
        if self._left is None or now - self._left[0] >= ESTIMATE_S:  # O(trials in flight): 13 % of a trial's
            self._left = (now, self.eta.left())                       # end at 500 slots when made each line
        when, left = self._left
        left = None if left is None else left - (now - when)
        if left is not None and left >= 1.0:
            text += f", ~{_duration(left)} left"
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

    def _print(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False)

    def _render(self) -> RenderableType:
        if not self.total:
            return self._render_runs()
        done = list(self.done)
        counts = Counts.of(done)  # the one definition every view uses
        table = Table(title=f"tuner: {counts.finished}/{self.total} trials finished, {self.clock()}", show_header=False)
        table.add_row("survived", str(counts.survived))
        table.add_row("diverged", str(counts.diverged))
        table.add_row("stopped (behind)", str(counts.stopped))
        table.add_row("failed", str(counts.failed))
        for number, seeds in sorted(dict(self._running).items()):
            phase = self._phase.get(number, "search")
            table.add_row(f"{self.label(number)} {phase}", self._seeds_text(number, phase, seeds))
        table.add_row("best so far", views.best_so_far(done, self.keys, self.race_seeds))
        return table

    def _render_runs(self) -> Text:
        """The live line of a verification alone: its runs ended, those in flight, the clock."""
        parts = [f"{self.label(number)} {self._phase.get(number, '')}: {self._seeds_text(number, '', seeds)}"
                 for number, seeds in sorted(dict(self._running).items())]
        return Text(f"{'; '.join(parts) or 'starting'} | {self.clock()}")

    def _seeds_text(self, number: int, phase: str, seeds: dict[int, int]) -> str:
        total = f"/{self.steps}" if self.steps and phase == "search" else ""
        text = ", ".join(f"seed {s}: {step}{total}" for s, step in sorted(dict(seeds).items())) or "starting"
        counts = self._runs.get(number)
        return f"{counts[0]}/{counts[1]} runs ended; {text}" if counts else text


def run_line(record: RunRecord) -> str:
    """``survived, val_loss 0.041``, ``diverged at step 212 (loss)`` or ``failed: ...``: how a run ended."""
    if record.status is RunStatus.SURVIVED:
        return "survived" + (f", val_loss {record.val_loss:.4g}" if record.val_loss is not None else "")
    if record.status is RunStatus.DIVERGED:
        return f"diverged at step {record.step}" + (f" ({record.cause})" if record.cause else "")
    if record.status is RunStatus.FAILED:
        return "failed: " + " ".join((record.error or "").split())
    return f"{record.status.value} at step {record.steps_survived}"


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


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
