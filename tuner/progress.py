"""The terminal view of a launch: live on a terminal, one line per trial otherwise.

It is a Callback of ``tuner.search`` and shows the trials running (each seed's step), how many
survived, diverged (at which step) and failed, and the best so far; :func:`summary_table` prints
the table at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from tuner.records import Phase, RunRecord, TrainConfig, TrialOutcome, TrialState


class ProgressView:
    """Live progress of a launch (see the module docs)."""

    def __init__(self, total: int, live: bool | None = None, console: Console | None = None) -> None:
        self.console = console or Console(stderr=False)
        self.total = total
        self.live_mode = sys.stdout.isatty() if live is None else live
        self._running: dict[int, dict[int, int]] = {}  # trial -> seed -> last step
        self._phase: dict[int, str] = {}  # trial -> the phase its runs are in
        self._configs: dict[int, TrainConfig] = {}
        self.done: list[TrialOutcome] = []
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        if self.live_mode:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def on_trial_start(self, number: int, config: TrainConfig) -> None:
        """Show the trial as running."""
        self._running[number] = {}
        self._configs[number] = config
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
        self._configs[number] = config
        self._refresh()

    def on_phase_end(self, outcome: TrialOutcome) -> None:
        """Print what the phase's runs gave, when not live."""
        self._running.pop(outcome.number, None)
        self._phase.pop(outcome.number, None)
        if self._live is None:
            line = f"  trial {outcome.number} {outcome.phase.value}: {phase_line(outcome)}"
            self.console.print(line, highlight=False)
        self._refresh()

    def say(self, text: str) -> None:
        """A line about the launch (above the live view when live)."""
        self.console.print(text, highlight=False)

    def on_trial_complete(self, outcome: TrialOutcome) -> None:
        """Move the trial to the finished counts; print a line when not live."""
        self._running.pop(outcome.number, None)
        self._phase.pop(outcome.number, None)
        self.done.append(outcome)
        if self._live is None:
            self.console.print(f"[{len(self.done)}/{self.total}] {describe(outcome)}", highlight=False)
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Table:
        counts = {state: sum(o.state is state for o in self.done) for state in TrialState}
        table = Table(title=f"tuner: {len(self.done)}/{self.total} trials finished", show_header=False)
        table.add_row("survived", str(counts[TrialState.COMPLETE]))
        table.add_row("diverged", str(counts[TrialState.PRUNED]))
        table.add_row("stopped (behind)", str(counts[TrialState.STOPPED]))
        table.add_row("failed", str(counts[TrialState.FAIL]))
        for number, seeds in sorted(self._running.items()):
            steps = ", ".join(f"seed {s}: {step}" for s, step in sorted(seeds.items())) or "starting"
            table.add_row(f"trial {number} {self._phase.get(number, 'search')}", steps)
        best = best_outcome(self.done)
        table.add_row("best so far", describe(best) if best else "-")
        return table


def best_outcome(outcomes: Iterable[TrialOutcome]) -> TrialOutcome | None:
    """The best COMPLETE outcome by value, else the longest-surviving one."""
    outcomes = list(outcomes)
    complete = [o for o in outcomes if o.state is TrialState.COMPLETE and o.value is not None
                and o.learned is not False]
    if complete:
        return min(complete, key=lambda o: o.value or 0.0)
    pruned = [o for o in outcomes if o.state is TrialState.PRUNED]
    return max(pruned, key=lambda o: min(o.steps_survived, default=0)) if pruned else None


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


def describe(outcome: TrialOutcome) -> str:
    """One line about a finished trial."""
    text = f"trial {outcome.number}: {outcome.state.value}"
    first = outcome.divergence
    if outcome.state is TrialState.COMPLETE:
        text += f", val_loss {outcome.value:.4g}"
        if outcome.learned is False:
            text += " (did not learn: not below its loss at init)"
        raced = sum(r.phase is Phase.RACE for r in outcome.seeds)
        if raced:
            text += f", raced on {raced} more seeds"
    elif first is not None:
        cause = first.diverged_on.value if first.diverged_on else "?"
        text += f" at step {first.step} ({cause}, seed {first.seed}"
        text += ", a race seed)" if first.phase is Phase.RACE else ")"
    elif outcome.reason:
        text += f": {outcome.reason.splitlines()[0][:120]}"
    config = outcome.config
    clip = "none" if config.clip_norm is None else f"{config.clip_norm:.3g}"
    return text + f" | lr {config.learning_rate:.3g}, clip {clip}, l2 {config.l2_weight:.3g}"


def summary_table(outcomes: Iterable[TrialOutcome], keys: Iterable[str] | None = None) -> Table:
    """A table of the trials of this launch: status, steps survived, cause, val loss, config.

    ``keys`` limits the config column to those knobs (the searched ones); None shows all.
    """
    outcomes = sorted(outcomes, key=lambda o: o.number)
    shown = None if keys is None else set(keys)
    table = Table(title="trials")
    for column in ("trial", "status", "steps survived", "diverged at", "val_loss"):
        table.add_column(column, no_wrap=True)
    table.add_column("config")
    for o in outcomes:
        first = o.divergence
        at = f"{first.step} ({first.diverged_on.value})" if first and first.diverged_on else "-"
        value = f"{o.value:.4g}" if o.value is not None else "-"
        config = " ".join(f"{k}={_short(v)}" for k, v in o.config.flat().items() if shown is None or k in shown)
        table.add_row(str(o.number), o.state.value, ",".join(map(str, o.steps_survived)), at, value, config)
    return table


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
