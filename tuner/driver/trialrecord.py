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

One winner and one set of counts for every view: :func:`incumbent` is the trial best_config.yaml
exports (the trial the selection rule chose after a verification; before one, the first config a
verification would try: the lowest validation loss among the trials raced to ``--race-seeds``); the
terminal's "best so far", the tables' ``*``, ``tuner report`` and the plots' star name it.
:func:`why_not` says in one short line why any other trial is not it, and
:class:`tuner.driver.counts.Counts` defines finished, survived, diverged, stopped, failed and the
diverged fraction.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tuner.driver.evidence import Choice, Margin, Verification
from tuner.errors import ConfigError
from tuner.records import RunRecord, RunStatus, TrialOutcome, TrialState

if TYPE_CHECKING:
    import optuna

# Every Optuna trial user attr tuner writes (no other module spells one):
ATTR = "tuner.trial"  # the record itself (TrialRecord.to_dict())
REASON = "reason"  # why a trial ended without a record: failed by liveness, or a skipped duplicate
DRIVER = "tuner.driver"  # the id of the driver that runs it (tuner.driver.liveness)
RERUN_OF = "rerun_of"  # the number of the interrupted trial it reruns
DUPLICATE_OF = "duplicate_of"  # the trial whose config it repeated (not trained)
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
        chosen: whether it is the incumbent, the trial best_config.yaml exports (joined from the
            study: :func:`incumbent`).
        why: why it is not the incumbent, in one short line (joined: :func:`why_not`; "" for the incumbent).

    The search builds it from the trial's judged outcome; a view reads it back from the study's
    user attr (:func:`read`), never from the raw attrs:

    >>> from tuner.records import DivergedOn, RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState
    >>> runs = (RunRecord(7, 0, 600, RunStatus.SURVIVED, final=True, steps_survived=600, val_loss=0.05),
    ...         RunRecord(7, 1, 212, RunStatus.DIVERGED, final=True, steps_survived=211,
    ...                   diverged_on=DivergedOn.LOSS))
    >>> outcome = TrialOutcome(7, TrainConfig(learning_rate=0.3), TrialState.DIVERGED, runs)
    >>> record = TrialRecord.from_outcome(outcome, steps=600)
    >>> record.state, record.divergence_step, record.diverged_on, record.weakest
    (<TrialState.DIVERGED: 'diverged'>, 212, 'loss', 211)
    >>> [s.status.value for s in record.seeds]
    ['survived', 'diverged']
    >>> TrialRecord.from_dict(record.to_dict()) == record
    True
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
    why: str = field(default="", compare=False)

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


def read(trial: optuna.trial.FrozenTrial) -> TrialRecord | None:
    """The record of an Optuna (frozen) trial; None if tuner recorded none (running, interrupted,
    a duplicate); a study written before the record existed is read from its separate attrs."""
    attrs = trial.user_attrs
    if ATTR in attrs:
        return TrialRecord.from_dict(attrs[ATTR])
    if all(k in attrs for k in _LEGACY_KEYS):
        return _legacy(trial.number, attrs)
    return None


def study_records(study: optuna.Study) -> list[TrialRecord]:
    """Every recorded trial of ``study`` in trial order, with its verification, margin, whether it
    is the incumbent (``chosen``) and why not (``why``)."""
    from tuner.driver import studyrecord

    verified, margins = studyrecord.verifications(study), studyrecord.margins(study)
    out = []
    for trial in study.get_trials(deepcopy=False):
        record = read(trial) if trial.state.is_finished() else None
        if record is not None:
            out.append(replace(record, verification=verified.get(record.number), margin=margins.get(record.number)))
    return mark_incumbent(out, studyrecord.choice(study), studyrecord.race_seeds(study))


def mark_incumbent(records: Sequence[TrialRecord], choice: Choice | None = None,
                   race_seeds: int = 0) -> list[TrialRecord]:
    """``records`` with the incumbent marked ``chosen`` and every other trial's ``why`` filled in."""
    found = incumbent(records, choice, race_seeds)
    top = found[0] if found else None
    return [replace(r, chosen=top is not None and r.number == top.number, why=why_not(r, top, race_seeds))
            for r in records]


def log_knobs(study: optuna.Study) -> set[str]:
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
        if state is TrialState.DIVERGED and first is not None and (
                survived == first - 1 or (on == "validation" and survived == first)):
            seeds.append(SeedResult(seed, SeedStatus.DIVERGED, first, survived, phase, diverged_on=on))
        elif state is TrialState.SURVIVED:
            seeds.append(SeedResult(seed, SeedStatus.SURVIVED, survived, survived, phase))
        elif state is TrialState.FAILED:
            seeds.append(SeedResult(seed, SeedStatus.FAILED, survived, survived, phase, reason=attrs.get(REASON)))
        else:
            seeds.append(SeedResult(seed, SeedStatus.CANCELLED, survived, survived, phase))
    return TrialRecord(
        number=number, state=state, config=dict(attrs["config"]), steps=int(attrs.get("steps", 0)),
        seeds=tuple(seeds), value=attrs.get("val_loss"), learned=attrs.get("learned"),
        init_val_loss=attrs.get("init_val_loss"), reason=str(attrs.get("reason") or ""),
        run_id=attrs.get("mlflow_run_id"), version=0,
    )


UNVERIFIED_RULE = "lowest validation loss among the COMPLETE trials that learned (not verified on fresh seeds)"


def candidates(records: Iterable[TrialRecord], race_seeds: int = 0) -> list[TrialRecord]:
    """The trials the selection rule may export, best validation loss first: COMPLETE trials that
    learned and (when racing) survived ``race_seeds`` seeds; if none was raced that far, every
    COMPLETE trial that learned. End-of-launch verification takes its configs from here, in this order."""
    done = [r for r in records if r.state is TrialState.SURVIVED and r.value is not None and r.learned is not False]
    raced = [r for r in done if len(r.seeds) >= race_seeds]
    return sorted(raced or done, key=lambda r: (r.value, r.number))


def incumbent(records: Iterable[TrialRecord], choice: Choice | None = None,
              race_seeds: int = 0) -> tuple[TrialRecord, str] | None:
    """The incumbent: the trial best_config.yaml exports if the launch ended now, and the rule that
    picked it; None if no trial finished. The terminal's "best so far", the trials table's ``*``,
    ``tuner report``, the plots' star and the YAML all name this one trial.

    The trial the selection rule chose after a verification (``choice``) wins; else the first of
    :func:`candidates` (the config a verification would try first); else the lowest-loss survivor
    that did not learn; else the trial whose weakest seed survived longest (a trial stopped by the
    pruner never counts).
    """
    records = [r for r in records if r.state is not TrialState.FAILED]
    found = next((r for r in records if choice is not None and r.number == choice.trial), None)
    if found is not None and choice is not None:
        return found, choice.rule
    pool = candidates(records, race_seeds)
    if pool:
        raced = race_seeds > 0 and len(pool[0].seeds) >= race_seeds
        return pool[0], UNVERIFIED_RULE if not raced else UNVERIFIED_RULE.replace(
            "that learned", f"that learned and were raced to {race_seeds} seeds")
    complete = [r for r in records if r.state is TrialState.SURVIVED and r.value is not None]
    if complete:
        rule = "no COMPLETE trial learned: the lowest validation loss of those that survived"
        return min(complete, key=lambda r: (r.value, r.number)), rule
    pruned = [r for r in records if r.state is TrialState.DIVERGED]
    if not pruned:
        return None
    rule = "no trial survived the budget: the one whose weakest seed survived longest"
    return max(pruned, key=lambda r: (r.weakest, -r.number)), rule


def best(records: Iterable[TrialRecord], choice: Choice | None = None,
         race_seeds: int = 0) -> tuple[TrialRecord, str] | None:
    """:func:`incumbent` (the name its first callers used)."""
    return incumbent(records, choice, race_seeds)


def varying(records: Sequence[TrialRecord]) -> list[str]:
    """``learning_rate``, then the knobs whose value differs between the trials."""
    keys = list(records[0].config) if records else []
    moving = [k for k in keys if k != "learning_rate" and len({repr(r.config.get(k)) for r in records}) > 1]
    return ["learning_rate", *moving] if "learning_rate" in keys else moving


_STOPS = (  # the pruners' and the first-seed policy's reasons (tuner.driver.pruning, .seeding) -> their short form
    (re.compile(r"validation loss (\S+) was more than (\S+)x the best trial's (\S+?);"),
     "stopped: first seed {0} > {1} x best {2}"),
    (re.compile(r"at step (\d+) its first seed's loss was more than (\S+)x"),
     "stopped at step {0}: first seed's loss > {1} x the best first seed's"),
    (re.compile(r"at step (\d+) its loss was more than (\S+)x"), "stopped at step {0}: loss > {1} x the best"),
    (re.compile(r"at step (\d+) its loss was not in the best third"), "stopped at step {0}: not in the best third"),
    (re.compile(r"at step (\d+) its loss was behind the median"), "stopped at step {0}: behind the median"),
)
SHORT = 90  # characters a short reason keeps


def clip(text: str, limit: int = SHORT) -> str:
    """The first line of ``text``, cut at a word boundary to ``limit`` characters (``...`` marks a cut)."""
    line = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    if len(line) <= limit:
        return line
    return line[: limit - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def short_reason(record: TrialRecord) -> str:
    """How the trial ended, when it did not survive, in one short line (``stopped: first seed 0.167
    > 1.2 x best 0.0545``, ``diverged at step 41 (seed 7): loss``, ``failed: ...``); a survivor's
    search-time reason (``not raced``); else ""."""
    if record.state is TrialState.DIVERGED and record.divergence is not None:
        first = record.divergence
        race = ", a race seed" if first.phase == "race" else ""
        return f"diverged at step {first.step} (seed {first.seed}{race}): {first.diverged_on or '?'}"
    if record.state is TrialState.STOPPED:
        for pattern, form in _STOPS:
            found = pattern.search(record.reason)
            if found:
                return form.format(*found.groups())
        return clip(f"stopped: {record.reason or 'by the pruner'}")
    if record.state is TrialState.FAILED:
        return clip(f"failed: {record.reason or '?'}")
    return clip(record.reason)


def why_not(record: TrialRecord, top: TrialRecord | None, race_seeds: int = 0) -> str:
    """Why ``record`` is not the incumbent ``top``, in one short line ("" for the incumbent).

    A trial that did not survive says how it ended (:func:`short_reason`); a survivor says what
    the selection rule held against it: it did not learn, was not raced (the search's reason), fell
    below the bar on fresh seeds, or has the higher validation loss.
    """
    if top is None or record.number == top.number:
        return ""
    if record.state is not TrialState.SURVIVED:
        return short_reason(record)
    value, v = record.value, record.verification
    if record.learned is False:
        return f"did not learn: val loss {_g(value)} not below {_g(record.init_val_loss)} at init"
    if v is not None and not v.met:
        return f"verified {v.survived}/{v.runs} (lower bound {v.rate_low:.2f}): below the bar {v.min_survival:g}"
    if record.reason:
        return short_reason(record)
    if race_seeds and len(record.seeds) < race_seeds <= len(top.seeds):
        return f"{_g(value)} on {len(record.seeds)} seeds; not raced to {race_seeds}"
    if value is not None and top.value is not None and value > top.value:
        text = f"val loss {_g(value)} > trial {top.number}'s {_g(top.value)}"
    else:
        text = f"val loss {_g(value)} on {len(record.seeds)} seeds"
    return text + ("; not verified" if v is None and top.verification is not None else "")


def _g(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"
