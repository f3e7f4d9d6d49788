"""What a study keeps beyond its trials: its seed stream, verifications, margin, choice, compute.

Stored as Optuna study user attrs (JSON), written only by the driver, read by export and report.
A finished Optuna trial cannot take new user attrs, and a config is verified after its trial was
told, so the verification of trial ``n`` lives on the study under ``tuner.verified.<n>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuner.driver.evidence import Choice, Margin, SeedStream, Verification

if TYPE_CHECKING:
    import optuna

    from tuner.spaces import SearchSpace

SEED_BASE = "tuner.seed_base"
VERIFIED = "tuner.verified."
MARGIN = "tuner.margin."
CHOICE = "tuner.choice"
RACE_SEEDS = "tuner.race_seeds"  # the seeds a trial must be raced to before it may be exported (0: no racing)
COMPUTE = "tuner.compute"


def seed_stream(study: optuna.Study, seed: int | None) -> SeedStream:
    """The study's seed stream: the recorded one, or a new one recorded now."""
    base = study.user_attrs.get(SEED_BASE)
    if base is None:
        stream = SeedStream.new(seed)
        study.set_user_attr(SEED_BASE, stream.base)
        return stream
    return SeedStream(int(base))


def save_verification(study: optuna.Study, trial: int, verification: Verification) -> None:
    """Record the verification of ``trial``'s config."""
    study.set_user_attr(f"{VERIFIED}{trial}", verification.to_dict())


def verifications(study: optuna.Study) -> dict[int, Verification]:
    """Trial number -> its config's verification."""
    return {int(k.removeprefix(VERIFIED)): Verification.from_dict(v)
            for k, v in study.user_attrs.items() if k.startswith(VERIFIED)}


def save_margin(study: optuna.Study, trial: int, margin: Margin) -> None:
    """Record the learning-rate margin of ``trial``'s config."""
    study.set_user_attr(f"{MARGIN}{trial}", margin.to_dict())


def margins(study: optuna.Study) -> dict[int, Margin]:
    """Trial number -> its config's margin."""
    return {int(k.removeprefix(MARGIN)): Margin.from_dict(v)
            for k, v in study.user_attrs.items() if k.startswith(MARGIN)}


def save_choice(study: optuna.Study, choice: Choice) -> None:
    """Record which trial the selection rule chose, and the rule."""
    study.set_user_attr(CHOICE, {"trial": choice.trial, "met": choice.met, "rule": choice.rule})


def choice(study: optuna.Study) -> Choice | None:
    """The recorded choice, if a launch made one."""
    doc = study.user_attrs.get(CHOICE)
    return None if doc is None else Choice(int(doc["trial"]), bool(doc["met"]), str(doc["rule"]))


def save_race_seeds(study: optuna.Study, race_seeds: int) -> None:
    """Record the seeds the latest launch raced trials to (0: it raced none): the selection rule's pool."""
    if study.user_attrs.get(RACE_SEEDS) != race_seeds:
        study.set_user_attr(RACE_SEEDS, race_seeds)


def race_seeds(study: optuna.Study) -> int:
    """The recorded race seeds; 0 for a study that recorded none (every learned survivor may be exported)."""
    return int(study.user_attrs.get(RACE_SEEDS, 0))


def add_compute(study: optuna.Study, compute: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Add a launch's runs and steps per phase to the study's totals; return the totals."""
    total: dict[str, dict[str, float]] = {k: dict(v) for k, v in study.user_attrs.get(COMPUTE, {}).items()}
    for phase, counts in compute.items():
        into = total.setdefault(phase, {})
        for key, value in counts.items():
            into[key] = into.get(key, 0) + value
    study.set_user_attr(COMPUTE, total)
    return total


OWNER = "tuner.owner"  # study user attr: the model, space and --steps the study was created for


def model_id(spec: str) -> str:
    """What names a model across machines and folders: a built-in's or module's spec as given, a
    file's name without its folder (``models/mine.py:Mine`` -> ``mine.py:Mine``)."""
    where, sep, name = spec.rpartition(":")
    return f"{where.replace(chr(92), '/').rpartition('/')[2]}{sep}{name}" if where.endswith(".py") else spec


def space_signature(space: SearchSpace) -> dict[str, str]:
    """Knob name -> how it is searched (range, choices or fixed value), comparable across launches."""
    out = {}
    for name, p in space.params.items():
        if p.fixed:
            out[name] = f"fixed {p.value!r}"
        elif p.choices:
            out[name] = f"choices {list(p.choices)!r}"
        else:
            out[name] = f"{'log ' if p.log else ''}range [{p.low!r}, {p.high!r}]{' or null' if p.nullable else ''}"
    return out


def owner(study: optuna.Study) -> dict[str, Any] | None:
    """The recorded owner (``{"model", "space", "steps"}``; ``steps`` lists every budget the study was
    searched at, the first first), or None for a study created before owners were recorded."""
    doc = study.user_attrs.get(OWNER)
    return doc if isinstance(doc, dict) else None


def mismatch(recorded: dict[str, Any], model: str, space: dict[str, str], steps: int,
             steps_change: bool) -> str | None:
    """What differs between the study's owner and this launch, in words; None if it may continue it."""
    if recorded.get("model") != model_id(model):
        return f"was created for model {recorded.get('model')!r}, and this launch's --model is {model_id(model)!r}"
    held = recorded.get("space") or {}
    changed = sorted(k for k in set(held) | set(space) if held.get(k) != space.get(k))
    if changed:
        first = changed[0]
        return (f"was searched in another space: {len(changed)} knob(s) differ ({', '.join(changed[:5])}"
                f"{', ...' if len(changed) > 5 else ''}; {first}: {held.get(first, 'absent')} in the study, "
                f"{space.get(first, 'absent')} now)")
    budgets = recorded.get("steps") or []
    if budgets and steps != budgets[-1] and not steps_change:
        return (f"was searched at --steps {budgets[-1]}, and this launch asks --steps {steps} (pass --steps "
                f"{budgets[-1]} to continue it, or --allow-steps-change to continue it at {steps}: "
                "best_config.yaml then records both budgets)")
    return None


def claim(study: optuna.Study, model: str, space: dict[str, str], steps: int) -> dict[str, Any]:
    """Record this launch as the study's owner (a new study, or one created before owners were
    recorded), or add ``steps`` to its budgets (a change that :func:`mismatch` allowed)."""
    recorded = owner(study)
    if recorded is None:
        recorded = {"model": model_id(model), "space": space, "steps": [steps]}
    elif steps not in recorded.get("steps", []):
        recorded = {**recorded, "steps": [*recorded.get("steps", []), steps]}
    else:
        return recorded
    study.set_user_attr(OWNER, recorded)
    return recorded
