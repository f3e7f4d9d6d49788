"""One typed, versioned record per trial: what every view reads about a trial.

The search (``tuner.driver.search``) alone writes it, once, when it tells the trial: one Optuna user attr,
``tuner.trial``, holding :meth:`TrialRecord.to_dict` (JSON). Export, report, plots, progress and the
benchmarks read it through :func:`read` / :func:`study_records`, which also join what the study
keeps about the trial's config after it was told (its verification on fresh seeds, its margin and
whether the selection rule chose it, ``tuner.driver.studyrecord``). Studies written before the record
existed (separate attrs ``status``, ``steps_survived``, ...) are read too (``version`` 0), their
per-seed statuses inferred as well as those attrs allow.

Per seed the record says how the run ended: survived, diverged at step s on what (and the op the
forensics named), cancelled at step t (a sibling diverged or the pruner stopped the trial) or
failed with a reason. The trial's earliest divergence is the lowest divergence step of its seeds;
the search lets every sibling pass that step before it cancels it (``tuner.driver.search``), so the
earliest divergence does not depend on which worker ran faster.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.driver.evidence import Choice, Margin, Verification
from tuner.errors import ConfigError
from tuner.records import RunRecord, RunStatus, TrialOutcome, TrialState

ATTR = "tuner.trial"  # the Optuna trial user attr that holds the record
VERSION = 1
_LEGACY_KEYS = ("config", "status", "steps_survived", "seeds")


class SeedStatus(enum.StrEnum):
    """How one seed run of a trial ended."""

    SURVIVED = "survived"
    DIVERGED = "diverged"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(frozen=True)
class SeedResult:
    """One seed run of a trial.

    Attributes:
        seed: the run's seed.
        status: how it ended.
        step: the divergence step (diverged), the step it was cancelled at, or the last step reached.
        steps_survived: steps it trained without a non-finite value.
        phase: ``search`` or ``race``.
        diverged_on: loss / gradient / weight / validation (diverged runs); for a model with
            several losses, which one (``gradient of loss "g_loss"``: :func:`tuner.records.cause_text`).
        op: the first non-finite op the forensics named (``iter_2/recompute_input/Log``), if any.
        reason: why it failed or was cancelled.
        val_loss: its validation loss (survivors).
        init_val_loss: its validation loss at initialisation.
        node: the Ray node it ran on.
    """

    seed: int
    status: SeedStatus
    step: int
    steps_survived: int
    phase: str = "search"
    diverged_on: str | None = None
    op: str | None = None
    reason: str | None = None
    val_loss: float | None = None
    init_val_loss: float | None = None
    node: str | None = None

    def text(self) -> str:
        """``seed 7: diverged at step 34 (loss, iter_2/recompute_input/Log)``, ``... cancelled at step 50``."""
        if self.status is SeedStatus.DIVERGED:
            detail = ", ".join(x for x in (self.diverged_on, self.op) if x)
            return f"seed {self.seed}: diverged at step {self.step}" + (f" ({detail})" if detail else "")
        if self.status is SeedStatus.CANCELLED:
            return f"seed {self.seed}: cancelled at step {self.step}"
        if self.status is SeedStatus.FAILED:
            return f"seed {self.seed}: failed: {self.reason or '?'}"
        return f"seed {self.seed}: survived {self.steps_survived} steps"

    @classmethod
    def from_run(cls, record: RunRecord) -> SeedResult:
        """The seed's result from its run's final record."""
        status = {RunStatus.SURVIVED: SeedStatus.SURVIVED, RunStatus.DIVERGED: SeedStatus.DIVERGED,
                  RunStatus.FAILED: SeedStatus.FAILED}.get(record.status, SeedStatus.CANCELLED)
        forensics = record.forensics
        op = None
        if forensics is not None:
            op = forensics.op or (f"data: sample(s) {list(forensics.samples)}" if forensics.samples else None)
        node = record.info.get("node_id")
        return cls(
            seed=record.seed, status=status, step=record.step, steps_survived=record.steps_survived,
            phase=record.phase.value, diverged_on=record.cause,
            op=op, reason=record.error if status in (SeedStatus.FAILED, SeedStatus.CANCELLED) else None,
            val_loss=record.val_loss, init_val_loss=record.init_val_loss, node=str(node) if node else None,
        )


@dataclass(frozen=True)
class TrialRecord:
    """Everything tuner knows about one finished trial (see the module docs).

    Attributes:
        number: the Optuna trial number.
        state: survived / diverged / stopped / failed.
        config: the flat config (tuner's knobs, then the model's).
        steps: the budget per seed run.
        seeds: each seed run, search seeds first, then race seeds.
        value: the validation loss, mean over seeds (survivors).
        learned: whether it fell below the loss at initialisation (None: unknown).
        init_val_loss: the validation loss at initialisation, mean over seeds.
        reason: why it failed or was stopped.
        run_id: its MLflow run id, in records the search wrote before it stopped asking the tracker
            (``tuner.driver.mlflow_runs`` finds the run of a newer record by its tags).
        stopped_at: the step the pruner stopped it at.
        version: the record's schema (0: read from a study written before the record existed).
        verification: its config's run on fresh seeds (joined from the study at read time).
        margin: its learning-rate margin (joined from the study).
        chosen: whether the selection rule exported it (joined from the study).
    """

    number: int
    state: TrialState
    config: Mapping[str, Any]
    steps: int
    seeds: tuple[SeedResult, ...]
    value: float | None = None
    learned: bool | None = None
    init_val_loss: float | None = None
    reason: str = ""
    run_id: str | None = None
    stopped_at: int | None = None
    version: int = VERSION
    verification: Verification | None = field(default=None, compare=False)
    margin: Margin | None = field(default=None, compare=False)
    chosen: bool = field(default=False, compare=False)

    @classmethod
    def from_outcome(cls, outcome: TrialOutcome, steps: int, stopped_at: int | None = None) -> TrialRecord:
        """The record of a trial the search has just judged."""
        return cls(
            number=outcome.number, state=outcome.state, config=outcome.config.flat(), steps=steps,
            seeds=tuple(SeedResult.from_run(r) for r in outcome.seeds), value=outcome.value,
            learned=outcome.learned, init_val_loss=outcome.init_val_loss, reason=outcome.reason,
            stopped_at=stopped_at,
        )

    @property
    def divergence(self) -> SeedResult | None:
        """The seed that diverged first (lowest step, then seed order), if any."""
        diverged = [s for s in self.seeds if s.status is SeedStatus.DIVERGED]
        return min(diverged, key=lambda s: s.step) if diverged else None

    @property
    def divergence_step(self) -> int | None:
        """The earliest divergence step of its seeds."""
        first = self.divergence
        return first.step if first else None

    @property
    def diverged_on(self) -> str | None:
        """What went non-finite first at the earliest divergence."""
        first = self.divergence
        return first.diverged_on if first else None

    @property
    def op(self) -> str | None:
        """The op the forensics named for the earliest divergence."""
        first = self.divergence
        return first.op if first else None

    @property
    def steps_survived(self) -> tuple[int, ...]:
        """Steps survived per seed, in seed order."""
        return tuple(s.steps_survived for s in self.seeds)

    @property
    def seed_numbers(self) -> tuple[int, ...]:
        """The seeds, in order."""
        return tuple(s.seed for s in self.seeds)

    @property
    def phases(self) -> tuple[str, ...]:
        """Each seed's phase (``search`` or ``race``)."""
        return tuple(s.phase for s in self.seeds)

    @property
    def raced(self) -> int:
        """How many of its seeds were race seeds."""
        return sum(p == "race" for p in self.phases)

    @property
    def nodes(self) -> list[str]:
        """The Ray nodes its runs ran on."""
        return sorted({s.node for s in self.seeds if s.node})

    @property
    def weakest(self) -> int:
        """Steps survived by its weakest seed that ran to its own end (a cancelled seed is left out:
        it stopped because of a sibling, not by itself); 0 if none did."""
        ended = [s.steps_survived for s in self.seeds if s.status is not SeedStatus.CANCELLED]
        return min(ended, default=0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (the Optuna user attr); the joined study figures are left out, and so is
        ``run_id`` unless an old record held one (a reader of version 1 takes it as optional)."""
        return {
            "version": self.version, "number": self.number, "state": self.state.value,
            "config": dict(self.config), "steps": self.steps,
            "seeds": [{k: getattr(s, k) for k in SeedResult.__dataclass_fields__} for s in self.seeds],
            "value": self.value, "learned": self.learned, "init_val_loss": self.init_val_loss,
            "reason": self.reason, **({"run_id": self.run_id} if self.run_id else {}), "stopped_at": self.stopped_at,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TrialRecord:
        """The record :meth:`to_dict` wrote.

        Raises:
            ConfigError: a record of a newer version than this tuner reads.
        """
        version = int(doc.get("version", 0))
        if version > VERSION:
            raise ConfigError(f"trial {doc.get('number')}: its record has version {version}, newer than this tuner "
                              f"reads ({VERSION}): upgrade tuner to read this study")
        known = SeedResult.__dataclass_fields__
        seeds = tuple(SeedResult(**{**{k: v for k, v in s.items() if k in known}, "status": SeedStatus(s["status"])})
                      for s in doc["seeds"])
        return cls(
            number=int(doc["number"]), state=TrialState(doc["state"]), config=dict(doc["config"]),
            steps=int(doc["steps"]), seeds=seeds, value=doc.get("value"), learned=doc.get("learned"),
            init_val_loss=doc.get("init_val_loss"), reason=str(doc.get("reason") or ""),
            run_id=doc.get("run_id"), stopped_at=doc.get("stopped_at"), version=version,
        )


def read(trial: Any) -> TrialRecord | None:
    """The record of an Optuna (frozen) trial; None if tuner recorded none (running, interrupted,
    a duplicate); a study written before the record existed is read from its separate attrs."""
    attrs = trial.user_attrs
    if ATTR in attrs:
        return TrialRecord.from_dict(attrs[ATTR])
    if all(k in attrs for k in _LEGACY_KEYS):
        return _legacy(trial.number, attrs)
    return None


def study_records(study: Any) -> list[TrialRecord]:
    """Every recorded trial of ``study`` in trial order, with its verification, margin and choice."""
    from tuner.driver import studyrecord

    verified, margins, chosen = studyrecord.verifications(study), studyrecord.margins(study), studyrecord.choice(study)
    out = []
    for trial in study.get_trials(deepcopy=False):
        record = read(trial) if trial.state.is_finished() else None
        if record is not None:
            out.append(replace(record, verification=verified.get(record.number), margin=margins.get(record.number),
                               chosen=chosen is not None and chosen.trial == record.number))
    return out


def log_knobs(study: Any) -> set[str]:
    """The knobs the study searched on a log scale (from its trials' Optuna distributions)."""
    found: set[str] = set()
    for trial in study.get_trials(deepcopy=False):
        found |= {name for name, d in trial.distributions.items() if getattr(d, "log", False)}
    return found


def _legacy(number: int, attrs: Mapping[str, Any]) -> TrialRecord:
    """A record from the separate attrs of a study written before the record existed.

    Per seed those attrs hold only the steps survived: a seed of a diverged trial that survived
    ``divergence_step - 1`` steps (or, for a validation divergence, all of them) diverged; the
    others were cancelled.
    """
    state = TrialState(attrs["status"])
    first, on = attrs.get("divergence_step"), attrs.get("diverged_on")
    phases = attrs.get("phases") or ["search"] * len(attrs["seeds"])
    seeds = []
    for seed, survived, phase in zip(attrs["seeds"], attrs["steps_survived"], phases, strict=False):
        if state is TrialState.PRUNED and first is not None and (
                survived == first - 1 or (on == "validation" and survived == first)):
            seeds.append(SeedResult(seed, SeedStatus.DIVERGED, first, survived, phase, diverged_on=on))
        elif state is TrialState.COMPLETE:
            seeds.append(SeedResult(seed, SeedStatus.SURVIVED, survived, survived, phase))
        elif state is TrialState.FAIL:
            seeds.append(SeedResult(seed, SeedStatus.FAILED, survived, survived, phase, reason=attrs.get("reason")))
        else:
            seeds.append(SeedResult(seed, SeedStatus.CANCELLED, survived, survived, phase))
    return TrialRecord(
        number=number, state=state, config=dict(attrs["config"]), steps=int(attrs.get("steps", 0)),
        seeds=tuple(seeds), value=attrs.get("val_loss"), learned=attrs.get("learned"),
        init_val_loss=attrs.get("init_val_loss"), reason=str(attrs.get("reason") or ""),
        run_id=attrs.get("mlflow_run_id"), version=0,
    )


UNVERIFIED_RULE = "lowest validation loss among the COMPLETE trials that learned (not verified on fresh seeds)"


def best(records: Iterable[TrialRecord], choice: Choice | None = None) -> tuple[TrialRecord, str] | None:
    """The trial to export (or show as best so far) and the rule that picked it; None if none finished.

    The trial the selection rule chose (``choice``, after a verification) wins; else the survivor
    that learned with the lowest validation loss; else the lowest-loss survivor; else the trial
    whose weakest seed survived longest (a trial stopped by the pruner never counts).
    """
    records = [r for r in records if r.state is not TrialState.FAIL]
    found = next((r for r in records if choice is not None and r.number == choice.trial), None)
    if found is not None and choice is not None:
        return found, choice.rule
    complete = [r for r in records if r.state is TrialState.COMPLETE and r.value is not None]
    learned = [r for r in complete if r.learned is not False]
    if learned:
        return min(learned, key=lambda r: (r.value, r.number)), UNVERIFIED_RULE
    if complete:
        rule = "no COMPLETE trial learned: the lowest validation loss of those that survived"
        return min(complete, key=lambda r: (r.value, r.number)), rule
    pruned = [r for r in records if r.state is TrialState.PRUNED]
    if not pruned:
        return None
    rule = "no trial survived the budget: the one whose weakest seed survived longest"
    return max(pruned, key=lambda r: (r.weakest, -r.number)), rule


def varying(records: Sequence[TrialRecord]) -> list[str]:
    """``learning_rate``, then the knobs whose value differs between the trials."""
    keys = list(records[0].config) if records else []
    moving = [k for k in keys if k != "learning_rate" and len({repr(r.config.get(k)) for r in records}) > 1]
    return ["learning_rate", *moving] if "learning_rate" in keys else moving


def diverged_share(records: Sequence[TrialRecord]) -> str:
    """``3 of 8 finished trials diverged (38%)``: the study's infeasible fraction (the Playbook's)."""
    done = [r for r in records if r.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    diverged = sum(r.state is TrialState.PRUNED for r in done)
    share = f" ({diverged / len(done):.0%})" if done else ""
    return f"{diverged} of {len(done)} finished trials diverged{share}"


def diverged_line(records: Sequence[TrialRecord]) -> str:
    """:func:`diverged_share`, then how many failed and how many the pruner stopped."""
    done = sum(r.state in (TrialState.COMPLETE, TrialState.PRUNED) for r in records)
    stopped = sum(r.state is TrialState.STOPPED for r in records)
    text = f"{diverged_share(records)}; {len(records) - done - stopped} failed"
    return text + (f"; {stopped} stopped by the pruner (behind)" if stopped else "")
