"""best_config.yaml as a type: :class:`BestConfig`, the one definition of the file's shape.

``tuner.driver.export`` builds the document and validates it here before it is written, so the
file, ``tuner.launch(...).answer`` and ``tuner.load(...).answer`` are the same object. Reading a
file back (``BestConfig.read``) accepts what earlier versions wrote: keys this version does not
know are kept, not refused.

Importing this module is cheap (pydantic and PyYAML; no Optuna, Ray or TensorFlow).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.errors import ConfigError


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Verified(_Part):
    """``stability.verified``: the config retrained on seeds that played no part in choosing it."""

    seeds: list[int]
    steps: int
    survived: int
    runs: int
    rate: float
    rate_low: float  # the 95% Wilson lower bound of the survival rate
    min_survival: float  # the bar rate_low had to reach
    met: bool
    divergences: list[list[int]] = []  # [seed, step] of each diverged run
    failed: int = 0
    val_loss: float | None = None
    init_val_loss: float | None = None


class LrMargin(_Part):
    """``stability.margin``: how far the learning rate can rise before the config diverges."""

    lr_factor: float
    steps: int
    seeds: int
    tried: dict[float, str] = {}
    losses: dict[float, float | None] = {}
    init_val_loss: float | None = None
    lr_sensitivity: float | None = None


class Stability(_Part):
    """``stability``: the evidence that the exported config does not diverge."""

    steps: int
    seeds: list[int]
    steps_survived: list[int]
    diverged: bool
    val_loss: float | None = None
    learned: bool | None = None
    init_val_loss: float | None = None
    rule: str = ""
    verified: Verified | None = None
    margin: LrMargin | None = None
    divergence_step: int | None = None  # only when diverged
    diverged_on: str | None = None
    seed_status: list[str] | None = None


class StudyRef(_Part):
    """``study``: where the answer came from."""

    name: str
    model: str | None = None
    storage: str  # passwords masked
    trial: int
    mlflow_run_id: str | None = None
    searched_at_steps: list[int] | None = None  # only for a study continued at another --steps


class BestConfig(_Part):
    """The content of best_config.yaml: the exported config, its evidence, its study.

    ``config`` holds the knob values to train with; ``trusted`` says whether the evidence shows it
    stable, ``reason`` says why in one phrase.

    >>> answer = BestConfig.of({
    ...     "config": {"learning_rate": 0.004, "clip_norm": 1.0},
    ...     "stability": {"steps": 600, "seeds": [11, 12], "steps_survived": [600, 600], "diverged": False,
    ...                   "learned": True},
    ...     "study": {"name": "iterated_mlp", "storage": "sqlite:///tuner.db", "trial": 7}})
    >>> answer.trusted, answer.reason
    (True, 'survived 2 seeds; not verified on fresh seeds')
    >>> answer.config["learning_rate"]
    0.004
    >>> BestConfig.of({"config": {}}, "mine.yaml")
    Traceback (most recent call last):
    ...
    tuner.errors.ConfigError: mine.yaml: not a best_config.yaml document: stability: Field required; study: ...
    """

    config: dict[str, Any]
    stability: Stability
    study: StudyRef
    note: str | None = None

    @classmethod
    def of(cls, doc: object, where: str = "best config") -> BestConfig:
        """``doc`` (best_config.yaml's mapping) as a BestConfig.

        Raises:
            ConfigError: naming each key that is missing or of the wrong type.
        """
        if isinstance(doc, BestConfig):
            return doc
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            raise ConfigError(f"{where}: not a best_config.yaml document: {problems}") from None

    @classmethod
    def read(cls, path: str | Path) -> BestConfig:
        """Read a best_config.yaml (safely).

        Raises:
            ConfigError: the file cannot be read or is not such a document.
        """
        from tuner.config import read_yaml

        return cls.of(read_yaml(path, "best config"), str(path))

    def to_dict(self) -> dict[str, Any]:
        """The YAML's mapping, key for key as the exporter wrote it (keys it left out stay out)."""
        return self.model_dump(mode="python", exclude_unset=True)

    @property
    def trusted(self) -> bool:
        """Whether the evidence shows the config stable: it survived every seed, learned, and (if
        it was verified) met the bar. The CLI exits 0 exactly when this holds, else 3."""
        s = self.stability
        return not s.diverged and s.learned is not False and (s.verified is None or s.verified.met)

    @property
    def reason(self) -> str:
        """What the evidence says, in one phrase (the line the terminal prints after ``best config:``)."""
        s, v = self.stability, self.stability.verified
        if s.diverged:
            return "no trial survived: NOT stable"
        if s.learned is False:
            return "survived but did not learn: NOT a success"
        if v is None:
            return f"survived {len(s.seeds)} seeds; not verified on fresh seeds"
        bar = f">= bar {v.min_survival:g}" if v.met else f"does NOT meet the bar {v.min_survival:g}"
        return f"verified {v.survived}/{v.runs} fresh seeds x {v.steps} steps, 95% lower bound {v.rate_low:.2f} {bar}"
