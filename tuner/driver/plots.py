"""The study's stability plots, as PNG files (matplotlib's Agg canvas; no display, no pyplot).

- **Stability map**: learning rate (log axis) against ``max_iter``, or else the knob that moves
  the steps survived most (on a log axis when it was searched on a log scale); a circle per
  survived trial, a cross per diverged one, shaded by the fraction of the budget its weakest seed
  survived (a seed cancelled because a sibling diverged is left out of that), and a hollow grey
  circle per trial the pruner stopped (it neither survived its budget on every seed nor diverged).
  A config verified on fresh seeds is labelled with its verified survival (``16/16``); the
  incumbent (the exported trial: ``tuner.driver.trialrecord.incumbent``) is a star. The title gives the
  counts (``tuner.driver.counts.Counts``).
- **Survival curves**: the fraction of seed runs still finite at each step (Kaplan-Meier: a seed
  cancelled because a sibling diverged or the pruner stopped it counts as finite up to its
  cancellation, not after, and is marked ``|`` there; a stopped trial's seeds count as far as they
  ran), for the whole study and per learning-rate band.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Collection, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tuner import atomic
from tuner.driver.counts import Counts
from tuner.driver.trialrecord import SeedStatus, TrialRecord, varying
from tuner.errors import OutputError
from tuner.names import file_safe
from tuner.records import TrialState

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import XAxis, YAxis
    from matplotlib.collections import PathCollection
    from matplotlib.figure import Figure

STABILITY_MAP = "stability_map.png"
SURVIVAL = "survival.png"


def seed_runs(record: TrialRecord) -> list[tuple[int, bool]]:
    """(last finite step, went non-finite) per seed; a cancelled sibling is censored, not diverged."""
    return [(s.steps_survived, s.status is SeedStatus.DIVERGED) for s in record.seeds
            if s.status is not SeedStatus.FAILED]


def survived_fraction(record: TrialRecord) -> float:
    """Steps the weakest seed that ran to its own end survived, as a fraction of the budget
    (a seed cancelled because a sibling diverged does not count: it did not end by itself)."""
    return record.weakest / record.steps if record.steps else 0.0


def write_plots(rows: Sequence[TrialRecord], out_dir: str | Path, study: str = "",
                log_knobs: Collection[str] = ()) -> list[Path]:
    """Write the stability map and the survival curves into ``out_dir``; return their paths.

    The files are ``<study>_stability_map.png`` and ``<study>_survival.png``, the study's name made
    a plain file name (``tuner.names.file_safe``: "../../x" stays in ``out_dir``).

    ``log_knobs`` are the knobs searched on a log scale (``tuner.driver.trialrecord.log_knobs``): drawn on
    log axes; the learning rate always is.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the plots' folder {out}: {exc.strerror or exc}") from exc
    prefix = f"{file_safe(study)}_" if study else ""
    return [_save(figure(name, rows, log_knobs), out / f"{prefix}{name}") for name in (STABILITY_MAP, SURVIVAL)]


def figure(name: str, rows: Sequence[TrialRecord], log_knobs: Collection[str] = ()) -> Figure:
    """The matplotlib Figure of one plot (``name``: :data:`STABILITY_MAP` or :data:`SURVIVAL`) of a
    study's trial records, titled with their counts; shown inline in a notebook (``tuner.Result``)."""
    from matplotlib.figure import Figure

    counts = Counts.of(rows)
    rows = [r for r in rows if r.state in (TrialState.SURVIVED, TrialState.DIVERGED, TrialState.STOPPED)]
    draws: dict[str, Callable[[Axes, Sequence[TrialRecord]], None]] = {
        STABILITY_MAP: partial(stability_map, log_knobs=log_knobs), SURVIVAL: survival_curves}
    draw = draws[name]
    fig = Figure(figsize=(7, 4.8), layout="constrained")
    draw(fig.add_subplot(), rows)
    fig.suptitle(f"{counts.text()}\n{counts.fraction_text()}", fontsize=10)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Render ``fig`` as PNG in memory, then write it atomically (tuner.atomic): a full disk leaves
    the earlier plot whole."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    return atomic.write_bytes(path, png.getvalue())


def stability_map(ax: Axes, rows: Sequence[TrialRecord], log_knobs: Collection[str] = ()) -> None:
    """Learning rate against the most telling other knob, survived vs diverged (see module docs)."""
    if not rows:
        ax.text(0.5, 0.5, "no finished trial", ha="center", transform=ax.transAxes)
        return
    knob = other_knob(rows)
    x = np.array([float(r.config["learning_rate"]) for r in rows])
    values = [r.config.get(knob) for r in rows] if knob else [r.weakest for r in rows]
    log_y = knob in log_knobs and _numeric(values) and all(v is None or v > 0 for v in values)
    y, labels, null_at = _axis_values(values, log=log_y)
    points = _markers(ax, x, y, rows)
    _log_axis(ax.xaxis, x)
    if log_y:
        _log_axis(ax.yaxis, y)
    ax.set_xlabel("learning rate")
    ax.set_ylabel(knob or "steps survived (weakest seed)")
    if labels is not None:
        ax.set_yticks(range(len(labels)), labels)
    if null_at is not None:
        ax.axhline(null_at, linestyle=":", color="grey")
        ax.annotate("null", (0.01, null_at), xycoords=("axes fraction", "data"), va="bottom", fontsize=8)
    ax.legend(loc="best", fontsize=8)
    ax.figure.colorbar(points, ax=ax, label="fraction of the budget survived (weakest seed)")


def _markers(ax: Axes, x: np.ndarray, y: np.ndarray, rows: Sequence[TrialRecord]) -> PathCollection:
    """Circles (survived), crosses (diverged), a star (the incumbent), verified survival labels.

    Returns:
        The survived trials' scatter (for the colour bar).
    """
    shade = np.array([survived_fraction(r) for r in rows])
    state = np.array([r.state.value for r in rows])
    chosen = np.array([r.chosen for r in rows])
    ok, bad = (state == TrialState.SURVIVED.value) & ~chosen, (state == TrialState.DIVERGED.value) & ~chosen
    stopped = state == TrialState.STOPPED.value
    if stopped.any():
        ax.scatter(x[stopped], y[stopped], marker="o", facecolors="none", edgecolors="grey",
                   label="stopped by the pruner")
    shaded = partial(ax.scatter, cmap="viridis", vmin=0.0, vmax=1.0)
    points = shaded(x[ok], y[ok], c=shade[ok], marker="o", edgecolors="k", label="survived")
    shaded(x[bad], y[bad], c=shade[bad], marker="X", s=70, label="diverged")
    if chosen.any():
        number = next(r.number for r in rows if r.chosen)
        shaded(x[chosen], y[chosen], c=shade[chosen], marker="*", s=260, edgecolors="red", linewidths=1.2,
               label=f"exported (trial {number})", zorder=3)
    for xi, yi, r in zip(x, y, rows, strict=True):
        if r.verification is not None:
            ax.annotate(f"{r.verification.survived}/{r.verification.runs}", (xi, yi), xytext=(6, 4),
                        textcoords="offset points", fontsize=7)
    return points


def survival_curves(ax: Axes, rows: Sequence[TrialRecord]) -> None:
    """Fraction of seed runs still finite against the step (see module docs)."""
    budget = max((r.steps for r in rows), default=1)
    runs = [run for r in rows for run in seed_runs(r)]
    if not runs:
        ax.text(0.5, 0.5, "no finished trial", ha="center", transform=ax.transAxes)
        return
    steps, alive = kaplan_meier(runs, budget)
    ax.step(steps, alive, where="post", color="k", linewidth=2, label=f"all ({len(runs)} seed runs)")
    cancelled = [s.steps_survived for r in rows for s in r.seeds if s.status is SeedStatus.CANCELLED]
    if cancelled:  # censored: they stopped because a sibling diverged or the pruner stopped them
        at = np.array(cancelled, float)
        ax.plot(at, alive[np.searchsorted(steps, at, side="right") - 1], "|", color="k", markersize=9,
                label=f"cancelled seed ({len(cancelled)}, censored)")
    # bands that never diverge all sit at 1.0: wider, solid lines under narrower, dashed ones keep each visible
    styles = (("-", 3.2), ("--", 2.0), (":", 1.4))
    for (label, band), (linestyle, width) in zip(_lr_bands(rows), styles, strict=False):
        band_runs = [run for r in band for run in seed_runs(r)]
        ax.step(*kaplan_meier(band_runs, budget), where="post", linestyle=linestyle, linewidth=width,
                label=f"{label} ({len(band_runs)})")
    ax.set_xlim(0, budget)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of seed runs still finite")
    ax.legend(loc="lower left", fontsize=8)


def kaplan_meier(runs: Sequence[tuple[int, bool]], budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps and survival fractions of (last finite step, diverged) runs, from step 0 to ``budget``.

    A diverged run went non-finite at ``last finite step + 1``; the others are censored there.
    """
    steps, alive, fraction = [0], [1.0], 1.0
    for t in sorted({s + 1 for s, diverged in runs if diverged}):
        at_risk = sum(1 for s, _ in runs if s + 1 >= t)
        died = sum(1 for s, diverged in runs if diverged and s + 1 == t)
        fraction *= 1.0 - died / at_risk
        steps.append(t)
        alive.append(fraction)
    steps.append(budget)
    alive.append(fraction)
    return np.array(steps), np.array(alive)


def other_knob(rows: Sequence[TrialRecord]) -> str | None:
    """``max_iter`` if it varies, else the varying knob most associated with the steps survived."""
    moving = varying(rows)[1:] if "learning_rate" in rows[0].config else varying(rows)
    if "max_iter" in moving:
        return "max_iter"
    survived = np.array([r.weakest for r in rows], float)
    scores = {k: _association([r.config.get(k) for r in rows], survived) for k in moving}
    return max(scores, key=lambda k: scores[k]) if scores else None


def _association(values: Sequence[object], target: np.ndarray) -> float:
    """|Spearman correlation| for a numeric knob (null or not counts as a choice), else the correlation ratio."""
    if np.std(target) == 0:
        return 0.0
    if not _numeric(values):
        return _correlation_ratio([repr(v) for v in values], target)
    present = np.array([v is not None for v in values])
    score = _correlation_ratio([str(p) for p in present], target) if not present.all() else 0.0
    numbers = np.array([v for v in values if v is not None], float)
    if len(numbers) > 2 and np.std(numbers) > 0 and np.std(target[present]) > 0:
        ranks = np.argsort(np.argsort(numbers)).astype(float)
        target_ranks = np.argsort(np.argsort(target[present])).astype(float)
        score = max(score, float(abs(np.corrcoef(ranks, target_ranks)[0, 1])))
    return score


def _correlation_ratio(keys: list[str], target: np.ndarray) -> float:
    groups = [target[[k == g for k in keys]] for g in set(keys)]
    between = sum(len(g) * (g.mean() - target.mean()) ** 2 for g in groups)
    return float(np.sqrt(between / (len(target) * np.var(target))))


def _numeric(values: Sequence[object]) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)


def _log_axis(axis: XAxis | YAxis, values: np.ndarray) -> None:
    """A log axis whose labels never run together: decades over two decades or more, else 1-2-5
    steps, written plainly (``0.0002``), no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if axis.axis_name == "x":
        axis.axes.set_xscale("log")
    else:
        axis.axes.set_yscale("log")
    finite = values[np.isfinite(values) & (values > 0)]
    span = np.log10(finite.max() / finite.min()) if finite.size else 0.0
    axis.set_major_locator(LogLocator(base=10, subs=(1.0,) if span >= 2 else (1.0, 2.0, 5.0), numticks=8))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _axis_values(values: Sequence[object], log: bool = False) -> tuple[np.ndarray, list[str] | None, float | None]:
    """Axis positions: numbers as they are (nulls on a line below them), choices as labelled slots.

    Returns:
        The positions, the labels of a choice axis (None for numbers), where the nulls sit.
    """
    if _numeric(values):
        numbers = np.array([np.nan if v is None else v for v in values], float)
        if not np.isnan(numbers).any():
            return numbers, None, None
        low, high = np.nanmin(numbers), np.nanmax(numbers)
        null_at = low / 3 if log else low - 0.15 * ((high - low) or 1.0)
        return np.where(np.isnan(numbers), null_at, numbers), None, null_at
    labels = sorted({_label(v) for v in values})
    index = {label: i for i, label in enumerate(labels)}
    jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else np.zeros(1)
    return np.array([index[_label(v)] for v in values]) + jitter, labels, None


def _label(value: object) -> str:
    return value if isinstance(value, str) else repr(value)


def _lr_bands(rows: Sequence[TrialRecord]) -> list[tuple[str, list[TrialRecord]]]:
    """The trials in three learning-rate bands (terciles), when there are enough to split."""
    rates = sorted({float(r.config["learning_rate"]) for r in rows})
    if len(rates) < 3:
        return []
    cuts = np.quantile(rates, [1 / 3, 2 / 3])
    bands: list[tuple[str, list[TrialRecord]]] = []
    for label, low, high in (
        (f"lr < {cuts[0]:.2g}", -np.inf, cuts[0]),
        (f"lr {cuts[0]:.2g} to {cuts[1]:.2g}", cuts[0], cuts[1]),
        (f"lr >= {cuts[1]:.2g}", cuts[1], np.inf),
    ):
        band = [r for r in rows if low <= float(r.config["learning_rate"]) < high]
        if band:
            bands.append((label, band))
    return bands
