"""The note optuna-dashboard shows on each trial: its record as a person reads it, in Markdown.

optuna-dashboard lists a trial's user attrs one line each, a mapping as JSON cut at 1024
characters, so the ``tuner.trial`` record (for programs: ``tuner.driver.trialrecord``) reads as one
wide, truncated line. A trial's note (Markdown, shown on the trial's page) says what the terminal
says of it: how it ended and where it went non-finite, each seed's run, its verification and
margin, and its config as the YAML best_config.yaml would hold.

:class:`Notes` is a search callback (it only listens): it writes a trial's note once the trial is
told. A config is verified after its trial was told, so :func:`refresh` writes the notes of the
verified trials again. Both write through :func:`tuner.hooks.save_trial_note` (no note without
optuna-dashboard installed). :func:`refresh` also writes the study's note (:func:`study_note`: the
exported trial and why; a note the user wrote is kept below it), with optuna-dashboard's ``save_note``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.driver.counts import Counts
from tuner.driver.trialrecord import ATTR, TrialRecord, study_records
from tuner.driver.views import best_yaml, seeds_text, status_text, steps_text
from tuner.hooks import save_trial_note
from tuner.records import RunRecord, TrialOutcome, TrialState

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)
MAX_CHARS = 2045  # one chunk of optuna-dashboard's note format (tuner.hooks.save_trial_note)


def note(record: TrialRecord) -> str:
    """The Markdown note of a finished trial, at most ``MAX_CHARS`` characters (seed rows left out
    past that, with how many)."""
    exported = " · **exported** (best_config.yaml)" if record.chosen else ""
    head = [f"### Trial {record.number}: {headline(record)}{exported}", ""]
    facts = [f"- seeds {seeds_text(record)}, steps survived: {steps_text(record)}"]
    if record.why:
        facts.append(f"- not exported: {record.why}")
    if record.verification is not None:
        facts.append(f"- verified on fresh seeds: {record.verification.text()}"
                     + (" (exported: best_config.yaml)" if record.chosen else ""))
    if record.margin is not None:
        facts.append(f"- survives up to {record.margin.lr_factor:g}x its learning rate")
    if record.reason and record.state is not TrialState.DIVERGED:
        facts.append(f"- {record.reason.splitlines()[0][:300]}")
    rows = [f"| {s.seed} | {s.phase} | {s.text().split(': ', 1)[1]} |" for s in record.seeds]
    config = ["", "config:", "", "```yaml", best_yaml(record.config), "```"]
    table = ["", "| seed | phase | how it ended |", "|---|---|---|"]

    def text(shown: int) -> str:
        left = len(rows) - shown
        more = [f"| ... | | {left} more (the trial's `{ATTR}` attribute has them all) |"] if left else []
        return "\n".join([*head, *facts, *table, *rows[:shown], *more, *config])

    shown = len(rows)
    while shown > 0 and len(text(shown)) > MAX_CHARS:
        shown -= 1
    return text(shown)[:MAX_CHARS]


def headline(record: TrialRecord) -> str:
    """``diverged at step 109 (loss, iter_2/recompute_input/Log, seed 7)`` / ``survived, val loss 0.0362``."""
    first = record.divergence
    if record.state is TrialState.DIVERGED and first is not None:
        detail = ", ".join(x for x in (first.diverged_on, f"`{first.op}`" if first.op else None,
                                       f"seed {first.seed}", "a race seed" if first.phase == "race" else None) if x)
        return f"diverged at step {first.step} ({detail})"
    text = status_text(record)
    if record.state is TrialState.STOPPED and record.stopped_at is not None:
        text += f" by the pruner at step {record.stopped_at}"
    if record.value is not None and record.state is TrialState.SURVIVED:
        text += f", val loss {record.value:.4g}"
    return text


class Notes:
    """Writes each trial's note when the search tells it (see the module docs)."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def on_trial_start(self, *args: object) -> None:
        """Nothing to note yet."""

    def on_trial_result(self, record: RunRecord) -> None:
        """Nothing to note per record."""

    def on_phase_start(self, *args: object) -> None:
        """Nothing to note."""

    def on_phase_end(self, outcome: TrialOutcome) -> None:
        """Nothing to note: the trial's end notes its race levels."""

    def on_trial_complete(self, outcome: TrialOutcome, record: TrialRecord) -> None:
        """Write the told trial's note from its record."""
        save_trial_note(self.study, outcome.number, note(record), version=1)


def refresh(study: optuna.Study) -> None:
    """Write the notes of the study's verified trials again, with what the study learned of them
    since they were told (verification, margin, the choice), and the study's note."""
    records = study_records(study)
    for record in records:
        if record.verification is not None or record.margin is not None or record.chosen:
            save_trial_note(study, record.number, note(record), version=2)
    save_study_note(study, records)


STUDY_HEAD = "### Exported by tuner: trial "  # how the study note tuner writes starts
# the study user attr that optuna-dashboard's study page lists beside its "Best Trial" card
EXPORTED_ATTR = "exported (best_config.yaml)"
STUDY_BREAK = "\n\n---\n\n"  # after it, a note the user wrote is kept


def study_note(records: Sequence[TrialRecord], best: int | None) -> str:
    """The study's note (optuna-dashboard's Note page, the left bar's note icon): which trial
    best_config.yaml exports and why, why Optuna's "Best Trial" (``best``, the lowest value) is
    another one, and what "Pruned" means here; "" if no trial is the incumbent."""
    top = next((r for r in records if r.chosen), None)
    if top is None:
        return ""
    lines = [f"{STUDY_HEAD}{top.number} (best_config.yaml)", "", f"- {headline(top)}; seeds {seeds_text(top)}"]
    if top.verification is not None:
        v = top.verification
        bar = f"meets the bar {v.min_survival:g}" if v.met else f"does NOT meet the bar {v.min_survival:g}"
        lines.append(f"- verified on fresh seeds x {v.steps} steps: {v.text()}: {bar}")
    other = next((r for r in records if r.number == best), None)
    if other is not None and other.number != top.number:
        lines.append(f"- Optuna's *Best Trial* (trial {other.number}, lowest val_loss) is not the export: "
                     f"{other.why or 'see its note'}")
    counts = Counts.of(records)
    lines += [f"- {counts.line()}",
              "- *Pruned* here is a trial that diverged (a seed went non-finite) or that the pruner stopped; "
              "neither has a val_loss. Each trial's note says which, and why it lost."]
    return "\n".join(lines)


def exported_line(records: Sequence[TrialRecord], best: int | None) -> str:
    """The exported trial in one line, and why Optuna's "Best Trial" (``best``) is another one; ""
    without an incumbent. optuna-dashboard's study page shows it in its "Study User Attributes"
    table (:data:`EXPORTED_ATTR`), beside the "Best Trial" card, without a click."""
    top = next((r for r in records if r.chosen), None)
    if top is None:
        return ""
    text = f"trial {top.number}: {headline(top)}"
    if top.verification is not None:
        text += f"; verified on fresh seeds: {top.verification.text()}"
    other = next((r for r in records if r.number == best), None)
    if other is not None and other.number != top.number:
        text += f". The Best Trial card (trial {other.number}, lowest val_loss) is not the export: {other.why or '?'}"
    return text


def hold_place(study: optuna.Study) -> None:
    """Write :data:`EXPORTED_ATTR` first on a new study: optuna-dashboard lists the study's user
    attrs in the order they were first written, 5 to a page, so the export's line is on the first
    (a later write changes the value, not the place)."""
    study.set_user_attr(EXPORTED_ATTR, "none yet: the study has no answer until a launch ends")


def save_study_note(study: optuna.Study, records: Sequence[TrialRecord]) -> bool:
    """Write :func:`study_note` as optuna-dashboard's study note, keeping a note the user wrote below
    it, and :func:`exported_line` as the study's :data:`EXPORTED_ATTR` attribute; False without
    optuna-dashboard or without an incumbent."""
    best = min((r for r in records if r.state is TrialState.SURVIVED and r.value is not None),
               key=lambda r: (r.value, r.number), default=None)
    line = exported_line(records, best.number if best else None)
    if line:
        study.set_user_attr(EXPORTED_ATTR, line)
    try:
        from optuna_dashboard import get_note, save_note
    except ImportError as exc:
        log.debug("no optuna-dashboard study note: %s", exc)
        return False
    body = study_note(records, best.number if best else None)
    if not body:
        return False
    held = get_note(study)
    if held.startswith(STUDY_HEAD):  # tuner's note of an earlier launch: what the user added below it is kept
        held = held.partition(STUDY_BREAK)[2]
    save_note(study, body + (STUDY_BREAK + held if held.strip() else ""))
    return True
