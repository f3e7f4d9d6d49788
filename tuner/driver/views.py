"""What a person reads in the terminal: the trials table, one line per trial, the best config as YAML.

One implementation for the launch's summary and ``tuner report`` (both read
:class:`~tuner.driver.trialrecord.TrialRecord` s). The table fits any width: its cells wrap (one knob per
line in the config column) and fold instead of cutting a value to ``…``, so piped to a file at 80
columns the learning rate and the searched knobs stay visible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import yaml
from rich.table import Table

from tuner.driver import trialrecord
from tuner.driver.trialrecord import SeedStatus, TrialRecord
from tuner.records import TrialState

_MARK = {SeedStatus.DIVERGED: "x", SeedStatus.CANCELLED: "c", SeedStatus.FAILED: "f", SeedStatus.SURVIVED: ""}
LEGEND = ("steps survived per seed: x diverged, c cancelled (a sibling diverged), s stopped by the pruner, "
          "f failed; * the incumbent (exported)")


def short(value: object) -> str:
    """A knob value in few characters (floats to 3 significant digits)."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def knobs_text(config: Mapping[str, object], keys: Sequence[str] | None, sep: str = " ") -> str:
    """``learning_rate=0.0042 max_iter=10``: the knobs ``keys`` (None: all) of ``config``."""
    shown = list(config) if keys is None else [k for k in keys if k in config]
    return sep.join(f"{k}={short(config[k])}" for k in shown)


def status_text(record: TrialRecord) -> str:
    """The trial's status; a survivor whose validation loss stayed at or above its loss at
    initialisation reads ``survived, did not learn``."""
    if record.state is TrialState.SURVIVED and record.learned is False:
        return "survived, did not learn"
    return record.state.value


def seeds_text(record: TrialRecord) -> str:
    """How many seeds the trial ran (``8 (6 raced)`` when some were race seeds; ``1 (the others not
    run)`` for a trial the pruner stopped after its first seed)."""
    count = str(len(record.seeds))
    if record.raced:
        return f"{count} ({record.raced} raced)"
    if record.state is TrialState.STOPPED and record.stopped_at is not None and record.stopped_at >= record.steps:
        return f"{count} (the others not run)"
    return count


def steps_text(record: TrialRecord) -> str:
    """``39x, 45c / 60``: steps survived per seed, marked by how the seed ended, and the budget; a
    seed the pruner stopped is marked ``s``, not ``c``."""
    stopped = record.state is TrialState.STOPPED
    steps = ", ".join(f"{s.steps_survived}{'s' if stopped and s.status is SeedStatus.CANCELLED else _MARK[s.status]}"
                      for s in record.seeds)
    return steps + (f" / {record.steps}" if record.steps else "")


def divergence_text(record: TrialRecord, cause: str | None = None) -> str:
    """``step 41: loss; iter_2/recompute_input/Log`` for the earliest divergence ("" if none)."""
    first = record.divergence
    if first is None:
        return ""
    text = f"step {first.step}: {first.diverged_on or '?'}"
    cause = cause or first.op
    return text + (f"; {cause}" if cause else "")


def verified_text(record: TrialRecord) -> str:
    """``16/16 (>= 0.81)`` for a verified trial, ``*`` appended for the incumbent; "" otherwise."""
    v = record.verification
    text = "" if v is None else f"{v.survived}/{v.runs} (>= {v.rate_low:.2f})"
    return f"{text} *".strip() if record.chosen else text


def trials_table(records: Sequence[TrialRecord], keys: Sequence[str] | None,
                 causes: Mapping[int, str] | None = None) -> Table:
    """One row per trial: its outcome (status, val loss, seeds and steps survived, the divergence:
    step, what and op), its verification, its config. Three or four columns whose cells wrap at
    spaces, so the table fits 80 columns as well as 200.

    ``keys`` are the config knobs shown (the searched or varying ones; None: all); ``causes`` maps
    a trial number to the divergence cause its MLflow run names (``tuner.driver.report``), shown
    before the op the record names. The verified column shows only when a trial was verified.
    """
    causes = causes or {}
    verified = any(r.verification is not None for r in records)
    table = Table(title="trials", caption=LEGEND if records else None)
    table.add_column("trial", overflow="fold")
    table.add_column("outcome", overflow="fold", ratio=1)
    if verified or any(r.chosen for r in records):
        table.add_column("verified" if verified else "best", overflow="fold")
        verified = True
    table.add_column("config", overflow="fold", ratio=1)
    for r in records:
        table.add_row(str(r.number), outcome_text(r, causes.get(r.number)),
                      *([verified_text(r)] if verified else []), knobs_text(r.config, keys))
    return table


def outcome_text(record: TrialRecord, cause: str | None = None) -> str:
    """``diverged`` / ``seeds 2: 33x, 40c / 600`` / ``step 34: loss; iter_2/recompute_input/Log``, one
    per line; a stopped or failed trial's first line is its reason (``stopped: first seed 0.167 > 1.2 x
    best 0.0545``); a survivor that is not the incumbent gets a last line saying why not."""
    val = "" if record.value is None or not math.isfinite(record.value) else f", val loss {record.value:.4g}"
    why = reason_text(record)
    ended = record.state in (TrialState.STOPPED, TrialState.FAILED) and why  # "stopped: ...", "failed: ..."
    lines = [why if ended else status_text(record) + val, f"seeds {seeds_text(record)}: {steps_text(record)}"]
    divergence = divergence_text(record, cause)
    return "\n".join(line for line in (*lines, divergence, "" if divergence or ended else why) if line)


def reason_text(record: TrialRecord) -> str:
    """Why the trial lost, short: its joined ``why`` (:func:`tuner.driver.trialrecord.why_not`), else how
    it ended (a record read without its study: :func:`tuner.driver.trialrecord.short_reason`)."""
    if record.chosen:
        return ""
    return record.why or trialrecord.short_reason(record)


def best_so_far(records: Sequence[TrialRecord], keys: Sequence[str] | None = None, race_seeds: int = 0) -> str:
    """The incumbent as one line (``trial 4: survived, val_loss 0.0545, raced on 6 more seeds | ...``),
    then, where the lowest validation loss is another trial, why that one is not it; ``-`` if none."""
    found = trialrecord.incumbent(records, race_seeds=race_seeds)
    if found is None:
        return "-"
    top = found[0]
    text = describe(top, keys)
    lowest = min((r for r in records if r.state is TrialState.SURVIVED and r.value is not None),
                 key=lambda r: (r.value, r.number), default=None)
    if lowest is not None and lowest.number != top.number:
        text += f" (lowest val loss: trial {lowest.number}, {trialrecord.why_not(lowest, top, race_seeds)})"
    return text


def describe(record: TrialRecord, keys: Sequence[str] | None = None) -> str:
    """One line about a finished trial: its state, how each seed ended where it matters, its knobs."""
    text = f"trial {record.number}: {record.state.value}"
    first = record.divergence
    if record.state is TrialState.SURVIVED and record.value is not None:
        text += f", val_loss {record.value:.4g}"
        if record.learned is False:
            text += " (did not learn: not below its loss at init)"
        if record.raced:
            text += f", raced on {record.raced} more seeds"
        if record.reason:  # why it was not raced on
            text += f" ({trialrecord.short_reason(record)})"
    elif first is not None:
        detail = ", ".join(x for x in (first.diverged_on, first.op, f"seed {first.seed}") if x)
        text += f" at step {first.step} ({detail}{', a race seed' if first.phase == 'race' else ''})"
        others = [s.text().removeprefix("seed ") for s in record.seeds if s is not first
                  and s.status is not SeedStatus.SURVIVED]
        text += f"; seed {'; seed '.join(others)}" if others else ""
    elif record.reason:
        text = f"trial {record.number}: {trialrecord.short_reason(record)}"
    return text + " | " + knobs_text(record.config, keys)


def best_yaml(config: Mapping[str, object]) -> str:
    """The config as best_config.yaml holds it (YAML, key order kept)."""
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False).rstrip()
