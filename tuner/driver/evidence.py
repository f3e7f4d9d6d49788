"""The evidence behind an exported config: seed streams, the Wilson bound, verification, margin.

Divergence is random over seeds, so a config has a *survival rate*, and the seeds it was chosen
on cannot measure it (a winner chosen on seeds 0 and 1 diverged on 7 of 16 fresh seeds). So:

- each study has its own seed stream (:class:`SeedStream`, its base recorded in the study): a
  trial's search seeds are its own, race seeds are shared by every raced trial (a challenger is
  compared with the incumbent on the same seeds, as SMAC3's intensifier does), and verification
  seeds come from a range no search or race seed is drawn from;
- a verified config's survival is ``k`` of ``n`` fresh seeds with a 95% Wilson lower bound
  (:func:`wilson_lower`); with 16 seeds only 16/16 reaches the default bar of 0.8 (0.806);
- the margin is the largest learning-rate factor at which the config still survives the
  verification seeds, and the LR sensitivity (Wortsman et al. 2023) is how far the validation
  loss moves over that sweep: mean over factors of min(loss, loss at init) minus the best loss.

Everything here is plain data (no Optuna, Ray or TensorFlow); ``tuner.driver.studyrecord`` stores it.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Z95 = 1.959963984540054  # two-sided 95% normal quantile
SEARCH_RANGE = 2**30  # search and race seeds are drawn from [0, 2^30)
VERIFY_RANGE = (2**30, 2**31)  # verification seeds from [2^30, 2^31): never a search or race seed
MARGIN_FACTORS = (1.5, 2.0, 3.0, 5.0)


def wilson_lower(survived: int, runs: int, z: float = Z95) -> float:
    """The Wilson score lower bound of a binomial proportion (0.0 for no runs)."""
    if runs <= 0:
        return 0.0
    p = survived / runs
    centre = p + z * z / (2 * runs)
    spread = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs))
    return max(0.0, (centre - spread) / (1 + z * z / runs))


def bar_reachable(diverged: int, total: int, min_survival: float) -> bool:
    """Whether ``total`` runs with ``diverged`` divergences could still reach the bar (if every run
    not yet ended survived)."""
    return wilson_lower(total - diverged, total) >= min_survival


@dataclass(frozen=True)
class SeedStream:
    """A study's seeds: a trial's search seeds, the shared race seeds, the verification seeds.

    Each seed is a hash of the study's ``base`` and its place in the stream, so nothing but the
    base has to be stored, and a resumed study draws the same seeds.
    """

    base: int

    @classmethod
    def new(cls, seed: int | None) -> SeedStream:
        """A stream for a new study: derived from the sampler's seed when one is given (a
        reproducible launch), else random."""
        return cls(secrets.randbits(62) if seed is None else _hash(f"study-seed:{seed}") % 2**62)

    def search(self, trial: int, count: int) -> tuple[int, ...]:
        """The ``count`` seeds of trial ``trial``'s search runs (its own)."""
        return tuple(self._draw(f"search:{trial}:{i}") % SEARCH_RANGE for i in range(count))

    def race(self, count: int) -> tuple[int, ...]:
        """The first ``count`` race seeds (the same for every raced trial)."""
        return tuple(self._draw(f"race:{i}") % SEARCH_RANGE for i in range(count))

    def verify(self, count: int) -> tuple[int, ...]:
        """The first ``count`` verification seeds (the same for every verified config)."""
        low, high = VERIFY_RANGE
        return tuple(low + self._draw(f"verify:{i}") % (high - low) for i in range(count))

    def _draw(self, where: str) -> int:
        return _hash(f"{self.base}:{where}")


def fresh_seeds(count: int, exclude: Sequence[int] = (), seed: int | None = None) -> tuple[int, ...]:
    """``count`` verification-range seeds not in ``exclude`` (random, or derived from ``seed``)."""
    stream = SeedStream.new(seed) if seed is not None else SeedStream(secrets.randbits(62))
    taken, out, i = set(exclude), list[int](), 0
    while len(out) < count:
        low, high = VERIFY_RANGE
        candidate = low + stream._draw(f"fresh:{i}") % (high - low)
        i += 1
        if candidate not in taken:
            taken.add(candidate)
            out.append(candidate)
    return tuple(out)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Verification:
    """A config retrained on seeds that played no part in choosing it.

    Attributes:
        seeds: the seeds it was given (some may not have run: see ``runs``).
        steps: steps per seed run.
        survived: runs that reached ``steps`` with every value finite.
        runs: runs that ended (survived or diverged); a run cancelled once the bar was out of
            reach, or one that failed, is not counted.
        min_survival: the bar ``rate_low`` had to reach.
        divergences: (seed, divergence step) of each diverged run.
        failed: runs that failed (a crash or a model error).
        val_loss: mean validation loss of the surviving runs.
        init_val_loss: mean validation loss at initialisation.
    """

    seeds: tuple[int, ...]
    steps: int
    survived: int
    runs: int
    min_survival: float
    divergences: tuple[tuple[int, int], ...] = ()
    failed: int = 0
    val_loss: float | None = None
    init_val_loss: float | None = None

    @property
    def rate(self) -> float:
        """Survived / runs (0.0 when nothing ran)."""
        return self.survived / self.runs if self.runs else 0.0

    @property
    def rate_low(self) -> float:
        """The 95% Wilson lower bound of the survival rate."""
        return wilson_lower(self.survived, self.runs)

    @property
    def learned(self) -> bool | None:
        """Whether the surviving runs' validation loss fell below the loss at initialisation."""
        if self.val_loss is None or self.init_val_loss is None:
            return None
        return self.val_loss < self.init_val_loss

    @property
    def met(self) -> bool:
        """Whether the lower bound reached the bar and the config learned."""
        return self.rate_low >= self.min_survival and self.learned is not False

    def text(self) -> str:
        """``survived 16/16 (rate 1.00, 95% lower bound 0.81)``."""
        return (f"survived {self.survived}/{self.runs} (rate {self.rate:.2f}, "
                f"95% lower bound {self.rate_low:.2f})")

    def to_dict(self) -> dict[str, object]:
        """The ``stability.verified`` mapping of best_config.yaml (and what the study stores)."""
        return {
            "seeds": list(self.seeds), "steps": self.steps, "survived": self.survived, "runs": self.runs,
            "rate": round(self.rate, 4), "rate_low": round(self.rate_low, 4), "min_survival": self.min_survival,
            "met": self.met, "divergences": [list(d) for d in self.divergences], "failed": self.failed,
            "val_loss": self.val_loss, "init_val_loss": self.init_val_loss,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Verification:
        """Inverse of :meth:`to_dict` (derived keys are recomputed)."""
        return cls(
            seeds=tuple(doc["seeds"]), steps=int(doc["steps"]), survived=int(doc["survived"]),
            runs=int(doc["runs"]), min_survival=float(doc["min_survival"]),
            divergences=tuple((int(s), int(t)) for s, t in doc.get("divergences", ())),
            failed=int(doc.get("failed", 0)), val_loss=doc.get("val_loss"), init_val_loss=doc.get("init_val_loss"),
        )


@dataclass(frozen=True)
class Margin:
    """How far the learning rate of a config can rise before it diverges on the verification seeds.

    Attributes:
        lr_factor: the largest factor at which the config survived every seed and learned (1.0:
            none of them); the sweep runs from the top and stops at the first that passes.
        steps: steps per run.
        seeds: how many verification seeds each factor was run on.
        tried: factor -> what happened (``survived 16/16`` or ``diverged at step 212 (seed S)``);
            factors below the first that passed are not run.
        losses: factor -> mean validation loss (None where it diverged); factor 1.0 is the
            verification itself.
        init_val_loss: the loss at initialisation (the loss a diverged factor counts as).
    """

    lr_factor: float
    steps: int
    seeds: int
    tried: Mapping[float, str] = field(default_factory=dict)
    losses: Mapping[float, float | None] = field(default_factory=dict)
    init_val_loss: float | None = None

    @property
    def lr_sensitivity(self) -> float | None:
        """Wortsman et al.'s LR sensitivity over the factors run (see the module docs); None if unknown.

        A factor that diverged counts as the loss at initialisation; factors below the margin
        that the top-down sweep did not need to run are left out.
        """
        init = self.init_val_loss
        factors = (1.0, *(f for f in MARGIN_FACTORS if f in self.losses))
        if init is None or self.losses.get(1.0) is None:
            return None
        losses = [self.losses.get(f) for f in factors]
        capped = [init if v is None else min(v, init) for v in losses]
        return sum(capped) / len(capped) - min(v for v in losses if v is not None)

    def to_dict(self) -> dict[str, object]:
        """The ``stability.margin`` mapping of best_config.yaml."""
        sensitivity = self.lr_sensitivity
        return {
            "lr_factor": self.lr_factor, "steps": self.steps, "seeds": self.seeds,
            "tried": {float(k): v for k, v in self.tried.items()},
            "losses": {float(k): v for k, v in self.losses.items()},
            "init_val_loss": self.init_val_loss,
            "lr_sensitivity": None if sensitivity is None else round(sensitivity, 6),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Margin:
        """Inverse of :meth:`to_dict`."""
        return cls(
            lr_factor=float(doc["lr_factor"]), steps=int(doc["steps"]), seeds=int(doc["seeds"]),
            tried={float(k): v for k, v in doc.get("tried", {}).items()},
            losses={float(k): v for k, v in doc.get("losses", {}).items()},
            init_val_loss=doc.get("init_val_loss"),
        )


@dataclass(frozen=True)
class Choice:
    """Which verified config is exported, and by what rule."""

    trial: int
    met: bool
    rule: str


def choose(verified: Mapping[int, tuple[float, Verification]], min_survival: float) -> Choice | None:
    """The selection rule: the best validation loss among the configs whose ``rate_low`` reaches
    ``min_survival`` (and that learned); if none does, the highest ``rate_low``.

    Args:
        verified: trial number -> (its search validation loss, its verification).
        min_survival: the bar.
    """
    if not verified:
        return None
    passed = {n: v for n, v in verified.items() if v[1].met}
    count = f"{len(verified)} config(s) verified"
    if passed:
        number = min(passed, key=lambda n: (passed[n][0], n))
        rule = (f"lowest validation loss among the configs whose verified 95% lower bound of the survival "
                f"rate reached {min_survival:g} ({count}, {len(passed)} met the bar)")
        return Choice(number, True, rule)
    number = max(verified, key=lambda n: (verified[n][1].rate_low, -verified[n][0], -n))
    rule = (f"no config met the bar (verified 95% lower bound >= {min_survival:g}, and learned): "
            f"this is the highest lower bound of the {count}")
    return Choice(number, False, rule)
