"""Verification: retrain a config on seeds that played no part in choosing it.

Used at the end of a launch (:func:`verify_study`: the best raced configs, in order of validation
loss, until one meets the bar; then the winner's learning-rate margin) and by ``tuner verify``
(:func:`run_verify`: any config in best_config.yaml's shape). Runs go through the same executor
and streaming as the search. The survival figure is ``k`` of ``n`` with a 95% Wilson lower bound
(``tuner.driver.evidence``); a config passes when that bound reaches ``--min-survival``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from tuner.driver import signals
from tuner.driver.evidence import MARGIN_FACTORS, Choice, Margin, SeedStream, Verification, bar_reachable, choose
from tuner.driver.outcome import Callback, Compute, Executor, judge
from tuner.records import Phase, RunRecord, RunSpec, RunStatus, Skip, TrainConfig, TrialOutcome

if TYPE_CHECKING:
    import argparse

    import optuna
    from rich.console import Console

    from tuner.config import VerifyOptions
    from tuner.models.base import Knob


@dataclass(frozen=True)
class Plan:
    """How verification runs: seeds, steps, the bar, and what else is spent on it.

    Attributes:
        seeds: verification seeds per config (0: no verification).
        steps: steps per verification run.
        min_survival: the bar for the 95% lower bound of the survival rate.
        candidates: at most this many configs are verified at the end of a launch.
        margin: whether the winner's learning-rate margin is measured.
        margin_steps: steps per margin run.
        fail_fast: stop a config's runs once the bar is out of reach.
    """

    seeds: int = 16
    steps: int = 1200
    min_survival: float = 0.8
    candidates: int = 3
    margin: bool = True
    margin_steps: int = 600
    fail_fast: bool = True


class Runner:
    """Runs one config on a set of seeds through an executor and waits for every final record."""

    def __init__(self, executor: Executor, model: str, callbacks: Sequence[Callback] = (),
                 report_every: int = 25, threads: int = 1, skip: Skip | None = None) -> None:
        self.executor, self.model, self.callbacks = executor, model, list(callbacks)
        self.report_every, self.threads, self.skip = report_every, threads, skip or Skip()
        self.compute = Compute()

    def run(self, number: int, phase: Phase, config: TrainConfig, seeds: Sequence[int], steps: int,
            stop: Callable[[list[RunRecord]], bool] = lambda finals: False) -> TrialOutcome:
        """Train ``config`` on ``seeds``; cancel the rest once ``stop(finals so far)`` is true."""
        for cb in self.callbacks:
            cb.on_phase_start(number, phase, config, seeds)
        for seed in seeds:
            self.executor.submit(RunSpec(number, seed, self.model, config, steps, self.report_every,
                                         self.threads, skip=self.skip, phase=phase))
        finals: dict[int, RunRecord] = {}
        cancelled = False
        while len(finals) < len(seeds):
            signals.raise_if_dropped()
            for record in self.executor.poll(timeout=0.5):
                if record.trial != number or record.phase is not phase or record.seed not in seeds:
                    continue
                for cb in self.callbacks:
                    cb.on_trial_result(record)
                if record.final:
                    finals[record.seed] = record
                    self.compute.add(record)
                if not cancelled and stop([r for r in finals.values()] + _alarms(record)):
                    cancelled = True
                    self.executor.cancel(number)
        outcome = judge(number, config, {s: finals[s] for s in seeds}, phase=phase)
        for cb in self.callbacks:
            cb.on_phase_end(outcome)
        return outcome


def _alarms(record: RunRecord) -> list[RunRecord]:
    """A divergence alarm (streamed before the forensics) counts at once, before its final record."""
    return [record] if record.status is RunStatus.DIVERGED and not record.final else []


def verify(runner: Runner, number: int, config: TrainConfig, seeds: Sequence[int], steps: int,
           min_survival: float, fail_fast: bool) -> Verification:
    """Retrain ``config`` on ``seeds`` (see the module docs)."""

    def out_of_reach(finals: list[RunRecord]) -> bool:
        diverged = len({r.seed for r in finals if r.status is RunStatus.DIVERGED})
        return fail_fast and diverged > 0 and not bar_reachable(diverged, len(seeds), min_survival)

    outcome = runner.run(number, Phase.VERIFY, config, seeds, steps, stop=out_of_reach)
    return summarise(outcome, seeds, steps, min_survival)


def summarise(outcome: TrialOutcome, seeds: Sequence[int], steps: int, min_survival: float) -> Verification:
    """A :class:`Verification` from the final records of a verification's runs."""
    ended = [r for r in outcome.seeds if r.status in (RunStatus.SURVIVED, RunStatus.DIVERGED)]
    survivors = [r for r in ended if r.status is RunStatus.SURVIVED]
    vals = [r.val_loss for r in survivors if r.val_loss is not None]
    inits = [r.init_val_loss for r in outcome.seeds if r.init_val_loss is not None]
    return Verification(
        seeds=tuple(seeds), steps=steps, survived=len(survivors), runs=len(ended), min_survival=min_survival,
        divergences=tuple((r.seed, r.step) for r in ended if r.status is RunStatus.DIVERGED),
        failed=sum(r.status is RunStatus.FAILED for r in outcome.seeds),
        val_loss=statistics.fmean(vals) if vals else None,
        init_val_loss=statistics.fmean(inits) if inits else None,
    )


def lr_margin(runner: Runner, number: int, config: TrainConfig, base: Verification, steps: int) -> Margin:
    """The largest learning-rate factor (of 1.5, 2, 3, 5) at which ``config`` still survives every
    verification seed and learns, searched from the top: the first factor that passes is the
    answer, and a factor that fails usually fails within a few runs (its runs stop at the first
    divergence), so a robust config costs one pass instead of four."""
    tried: dict[float, str] = {}
    losses: dict[float, float | None] = {1.0: base.val_loss}
    for factor in sorted(MARGIN_FACTORS, reverse=True):
        scaled = replace(config, learning_rate=config.learning_rate * factor)
        outcome = runner.run(number, Phase.MARGIN, scaled, base.seeds, steps,
                             stop=lambda finals: any(r.status is not RunStatus.SURVIVED for r in finals))
        first = outcome.divergence
        if first is not None or any(r.status is not RunStatus.SURVIVED for r in outcome.seeds):
            tried[factor] = f"diverged at step {first.step} (seed {first.seed})" if first else "a run failed"
            losses[factor] = None
            continue
        tried[factor] = f"survived {len(outcome.seeds)}/{len(outcome.seeds)}"
        losses[factor] = outcome.value
        if outcome.learned is False:  # finite, but no better than at initialisation: not a margin
            tried[factor] += f" but did not learn (val_loss {outcome.value:.4g})"
            continue
        return Margin(factor, steps, len(base.seeds), tried, losses, base.init_val_loss)
    return Margin(1.0, steps, len(base.seeds), tried, losses, base.init_val_loss)


def candidates(study: optuna.Study, race_seeds: int) -> list[tuple[int, float, TrainConfig]]:
    """The configs that may be exported, best validation loss first (``tuner.driver.trialrecord.candidates``:
    the selection rule's pool, the same the incumbent is drawn from)."""
    import optuna

    from tuner.driver.trialrecord import candidates as pool
    from tuner.driver.trialrecord import read
    from tuner.spaces import config_from_flat

    done = [r for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if (r := read(t)) is not None]
    return [(r.number, float(r.value or 0.0), config_from_flat(r.config)) for r in pool(done, race_seeds)]


def verify_study(study: optuna.Study, runner: Runner, plan: Plan, stream: SeedStream, race_seeds: int,
                 say: Callable[[str], None] = print) -> Choice | None:
    """Verify the best candidates until one meets the bar (at most ``plan.candidates``), choose the
    winner by the selection rule (``tuner.driver.evidence.choose``), and measure its margin.

    A candidate already verified on the same seeds and steps (a continued study) is not rerun.
    """
    from tuner.driver import studyrecord

    seeds = stream.verify(plan.seeds)
    known = studyrecord.verifications(study)
    verified: dict[int, tuple[float, Verification]] = {}
    configs: dict[int, TrainConfig] = {}
    for number, value, config in candidates(study, race_seeds)[: plan.candidates]:
        configs[number] = config
        found = known.get(number)
        if found is None or found.seeds != seeds or found.steps != plan.steps:
            say(f"verifying trial {number} on {len(seeds)} fresh seeds x {plan.steps} steps")
            found = verify(runner, number, config, seeds, plan.steps, plan.min_survival, plan.fail_fast)
            studyrecord.save_verification(study, number, found)
        say(f"trial {number}: {found.text()}: {'meets' if found.met else 'does not meet'} the bar "
            f"{plan.min_survival:g}")
        verified[number] = (value, found)
        if found.met:
            break
    choice = choose(verified, plan.min_survival)
    if choice is None:
        return None
    studyrecord.save_choice(study, choice)
    if plan.margin and choice.met and choice.trial not in studyrecord.margins(study):
        factors = ", x".join(f"{f:g}" for f in sorted(MARGIN_FACTORS, reverse=True))
        say(f"trial {choice.trial}: measuring its learning-rate margin (x{factors}, until one survives)")
        margin = lr_margin(runner, choice.trial, configs[choice.trial], verified[choice.trial][1], plan.margin_steps)
        studyrecord.save_margin(study, choice.trial, margin)
        say(f"trial {choice.trial}: survives up to {margin.lr_factor:g}x its learning rate")
    return choice


def run_verify(args: argparse.Namespace) -> int:
    """``tuner verify CONFIG.yaml``: retrain the file's config on fresh seeds; 0 if it meets the bar, else 3.

    Its progress: a line per run that ended, piped or redirected; a live line on a terminal
    (``tuner.driver.progress``).
    """
    from tuner.config import VerifyOptions, load_options
    from tuner.driver.progress import output_console

    console = output_console(highlight=False)
    options = load_options(VerifyOptions, vars(args))  # every count in range, before anything is read
    check_bar(options.min_survival, options.seeds)
    result = verify_doc(options, read_config_file(options.config), console)
    return _verdict(console, result, options.min_survival)


def verify_doc(options: VerifyOptions, doc: Mapping[str, object], console: Console) -> Verification:
    """Retrain ``doc``'s config (best_config.yaml's shape) on fresh seeds as ``options`` say; print
    the progress and the result on ``console``; return the evidence (``tuner verify`` and
    ``tuner.verify``).

    Raises:
        ConfigError, ModelError: the document or the model is not usable (before anything starts).
        KeyboardInterrupt: a stop signal; the runs and the embedded cluster are stopped first.
    """
    from pathlib import Path

    from tuner.driver.eta import Work
    from tuner.driver.evidence import fresh_seeds
    from tuner.driver.executor import ClusterConfig, RayExecutor
    from tuner.driver.progress import ProgressView
    from tuner.environ import prepare_process
    from tuner.models import load_model, runtime_env

    model_name = model_to_verify(options, doc, say=lambda line: console.print(line, markup=False))
    steps = verify_steps(options, doc)
    prepare_process()
    config = validated_config(doc, model_name, load_model(model_name).knobs, options.config)
    seeds = fresh_seeds(options.seeds, exclude=_seeds_in(doc), seed=options.seed)
    console.print(f"verifying {options.config} ({model_name}) on {len(seeds)} fresh seeds x {steps} steps")
    restore_signals = signals.noted()  # SIGTERM, SIGHUP as Ctrl-C: the cluster is stopped, one line, 128 + signal
    try:
        executor = RayExecutor(ClusterConfig(
            address=options.address, cpus_per_trial=options.cpus_per_trial, gpus_per_trial=options.gpus_per_trial,
            num_cpus=options.num_cpus, runtime_env=runtime_env(model_name),
        ))
    except BaseException:
        restore_signals()
        raise
    try:
        signals.raise_if_dropped()  # tuner's handlers back in place of the one ray.init set
        work = Work(0, steps, verify_seeds=len(seeds), verify_steps=steps, slots=executor.slots)
        with ProgressView(0, console=console, work=work, label=lambda _: Path(options.config).name) as view:
            runner = Runner(executor, model_name, [view])
            result = verify(runner, 0, config, seeds, steps, options.min_survival, options.fail_fast)
    finally:
        with signals.cleaning():
            executor.close()
        restore_signals()
    for seed, step in result.divergences:
        console.print(f"  seed {seed}: diverged at step {step}")
    console.print(result.text())
    if result.val_loss is not None and result.init_val_loss is not None:
        console.print(f"validation loss {result.val_loss:.4g} (mean over the seeds that survived; "
                      f"{result.init_val_loss:.4g} at initialisation)")
    return result


def _verdict(console: Console, result: Verification, bar: float) -> int:
    if result.met:
        console.print(f"stable: the 95% lower bound {result.rate_low:.2f} reaches --min-survival {bar:g}")
        return 0
    if result.learned is False:
        console.print(f"unstable: it survived but did not learn (validation loss {result.val_loss:.4g} is not "
                      f"below {result.init_val_loss:.4g} at initialisation)")
    else:
        console.print(f"unstable: the 95% lower bound {result.rate_low:.2f} is below --min-survival {bar:g} "
                      f"({len(result.divergences)} of {result.runs} seeds diverged)")
    return 3


def check_bar(min_survival: float, seeds: int) -> None:
    """``--seeds`` can reach ``--min-survival`` (both already in range: ``tuner.config.VerifyOptions``)."""
    from tuner.driver.evidence import wilson_lower
    from tuner.errors import ConfigError

    if wilson_lower(seeds, seeds) < min_survival:
        raise ConfigError(
            f"--seeds {seeds} cannot reach --min-survival {min_survival:g}: even {seeds}/{seeds} has a 95% lower "
            f"bound of {wilson_lower(seeds, seeds):.2f}; use more seeds (16 reach 0.80, 35 reach 0.90)"
        )


def read_config_file(path: str) -> dict[str, object]:
    """A config YAML in best_config.yaml's shape (at least a ``config:`` mapping).

    Raises:
        ConfigError: the file cannot be read, is not YAML, or has no ``config`` mapping.
    """
    from tuner.config import read_yaml
    from tuner.errors import ConfigError

    doc = read_yaml(path, "config")
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise ConfigError(f"{path}: expected a mapping with a 'config:' mapping of knob values "
                          "(the shape of best_config.yaml: config: {learning_rate: 0.001, ...})")
    return doc


def model_to_verify(options: VerifyOptions, doc: Mapping[str, object], say: Callable[[str], None] = print) -> str:
    """The model to retrain with: ``--model``; else the file's ``study.model`` when it is a built-in
    name, or, with ``--trust-file-model``, whatever it names; else ``iterated_mlp``.

    The file is data that may come from anyone: it never chooses by itself which code is imported.

    Raises:
        ConfigError: the file names a ``.py`` file or a module and neither flag was given (one line
            naming what would be imported and both ways on).
    """
    from tuner.errors import ConfigError
    from tuner.models import BUILTIN, model_file

    if options.model:
        return options.model
    study = doc.get("study")
    named = study.get("model") if isinstance(study, dict) else None
    if named is None:
        return "iterated_mlp"
    if not isinstance(named, str):
        raise ConfigError(f"{options.config}: study.model must be a model name; give --model NAME")
    if named in BUILTIN or ":" not in named:  # a name only: imports nothing (an unknown one is refused)
        return named
    file = model_file(named)
    code = f"the file {file}" if file else f"module {named.rpartition(':')[0]!r}"
    if not options.trust_file_model:
        raise ConfigError(f"{options.config}: its study.model {named!r} would import {code}; a config file does "
                          f"not choose the code tuner runs: name the model yourself (--model {named}) or pass "
                          "--trust-file-model")
    say(f"importing {code}, as {options.config}'s study.model says (--trust-file-model)")
    return named


def verify_steps(options: VerifyOptions, doc: Mapping[str, object]) -> int:
    """``--steps`` (already in range), else twice the file's ``stability.steps``."""
    from tuner.config import MAX_STEPS
    from tuner.errors import ConfigError

    if options.steps is not None:
        return options.steps
    stability = doc.get("stability")
    steps = stability.get("steps") if isinstance(stability, dict) else None
    if not isinstance(steps, int) or not 1 <= 2 * steps <= MAX_STEPS:
        raise ConfigError(f"{options.config}: no stability.steps to double; give --steps N")
    return 2 * steps


def validated_config(doc: Mapping[str, object], model: str, knobs: Mapping[str, Knob], where: str) -> TrainConfig:
    """The file's ``config`` checked against tuner's and the model's knobs (left-out knobs default)."""
    from tuner.spaces import space_from

    params = cast("Mapping[str, object]", doc["config"])  # a mapping: read_config_file and tuner.verify check it
    space = space_from(params, model, knobs, f"{where}: config")
    return space.config({name: p.value for name, p in space.params.items()})


def _seeds_in(doc: Mapping[str, object]) -> list[int]:
    """Every seed the file says its config was trained on (never reused as a fresh seed)."""
    stability = doc.get("stability")
    stability = stability if isinstance(stability, dict) else {}
    verified = stability.get("verified")
    verified = verified if isinstance(verified, dict) else {}
    listed = [found for found in (stability.get("seeds"), verified.get("seeds")) if isinstance(found, list)]
    return [int(s) for seeds in listed for s in seeds if isinstance(s, int)]
