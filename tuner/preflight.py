"""Data preflight: check a model's data once, in the driver, before any trial starts.

The arrays come from ``model.data(knobs)`` (numpy only: the driver never imports TensorFlow). By
the contract (``tuner.models.base``) the last array of each split is the label and the others are
inputs, one sample per row of the first axis; one array alone is an input (unlabelled data). A
sample is flagged when:

- it is corrupt: every value of its inputs is NaN/Inf (an unreadable image, say);
- an input holds some NaN/Inf values;
- its label is NaN/Inf;
- its label is outside the dataset's declared ``label_range`` (a negative count);
- an input is outside the declared ``input_range``: unscaled input where the model expects
  scaled input (16-bit pixels in an 8-bit pipeline, raw pixels where [0, 1] is expected);
- an input or label is finite as stored but not as fed: the arrays are checked as the
  placeholders get them, after the cast to their dtype (1.2e39 in float64 is Inf in float32),
  named by sample, feature and value. The driver has no graph: it takes every floating array to
  be fed as float32, the dtype of nearly every TF1 placeholder (``check-model`` knows the dtypes).

Any finding stops the launch with a :class:`~tuner.errors.DataError` that says what, how many and
the first indices, unless the launch allows bad data: then the flagged samples are left out of
every run (:class:`~tuner.records.Skip`, applied on the workers by :func:`without`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from tuner.errors import DataError
from tuner.models.base import Dataset, has_label
from tuner.records import Skip

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from tuner.models.base import Knob, Model

SHOWN = 10  # indices shown per finding
FED_AS = np.dtype(np.float32)  # what a floating array becomes when fed, unless its placeholder says otherwise


@dataclass(frozen=True)
class Finding:
    """One kind of problem in one split: which samples, and what was seen."""

    split: str  # "train" or "val"
    what: str
    indices: tuple[int, ...]
    detail: str = ""

    def line(self) -> str:
        """One line for the report: count, what, detail and the first indices."""
        first = ", ".join(map(str, self.indices[:SHOWN])) + (", ..." if len(self.indices) > SHOWN else "")
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.split}: {len(self.indices)} sample(s) with {self.what}{detail}; first indices: {first}"


@dataclass(frozen=True)
class PreflightReport:
    """What the preflight found in both splits."""

    findings: tuple[Finding, ...]
    sizes: Mapping[str, int]  # split -> number of samples

    @property
    def skip(self) -> Skip:
        """Every flagged sample, per split."""
        def flagged(split: str) -> tuple[int, ...]:
            return tuple(sorted({i for f in self.findings if f.split == split for i in f.indices}))

        return Skip(train=flagged("train"), val=flagged("val"))

    def text(self, model: str) -> str:
        """The findings, one line each, under a header naming the model and the sizes."""
        header = (f"data preflight found problems in {model}'s data ({self.sizes['train']} training, "
                  f"{self.sizes['val']} validation samples):")
        return "\n".join([header, *(f"  {f.line()}" for f in self.findings)])


def check_data(data: Dataset, dtypes: Sequence[DTypeLike] | None = None) -> PreflightReport:
    """Check both splits of ``data`` (see the module docs), as fed to placeholders of ``dtypes``
    (one per array; None: float32 for every floating array)."""
    findings = [
        *_check_split("train", data.train, data, dtypes),
        *_check_split("val", data.val, data, dtypes),
    ]
    return PreflightReport(tuple(findings), {"train": len(data.train[0]), "val": len(data.val[0])})


def preflight(model: Model, knobs: Mapping[str, object], name: str, allow_bad: bool) -> tuple[Skip, str]:
    """Check the model's data; return the samples to skip and a line saying what was skipped.

    Raises:
        DataError: the data has problems and ``allow_bad`` is false, or too few samples are left.
    """
    data = model.data(knobs)
    report = check_data(data)
    if not report.findings:
        return Skip(), ""
    skip = report.skip
    if not allow_bad:
        count = len(skip.train) + len(skip.val)
        raise DataError(f"{report.text(name)}\nFix the data, or pass --allow-bad-data to skip these {count} sample(s).")
    left = report.sizes["train"] - len(skip.train)
    if left < data.batch_size or report.sizes["val"] == len(skip.val):
        raise DataError(f"{report.text(name)}\nToo few samples are left to train and validate on.")
    line = (f"data preflight: skipping {len(skip.train)} of {report.sizes['train']} training and "
            f"{len(skip.val)} of {report.sizes['val']} validation samples (--allow-bad-data)")
    return skip, f"{report.text(name)}\n{line}"


def data_knobs(model_knobs: Mapping[str, Knob], fixed: Mapping[str, object]) -> dict[str, object]:
    """The knobs the preflight builds the data with: the space's fixed values, else the defaults."""
    return {name: fixed.get(name, knob.default) for name, knob in model_knobs.items()}


def without(data: Dataset, skip: Skip) -> tuple[Dataset, np.ndarray | None]:
    """``data`` less the skipped samples, and each kept training sample's original index."""
    if not skip:
        return data, None
    kept = np.setdiff1d(np.arange(len(data.train[0])), np.asarray(skip.train, int))
    val_kept = np.setdiff1d(np.arange(len(data.val[0])), np.asarray(skip.val, int))
    trimmed = replace(data, train=tuple(a[kept] for a in data.train), val=tuple(a[val_kept] for a in data.val))
    return trimmed, kept


def as_fed(array: np.ndarray, dtype: DTypeLike | None = None) -> np.ndarray:
    """``array`` as a placeholder of ``dtype`` gets it (None: float32 if floating); NaN/Inf where it overflows."""
    array = np.asarray(array)
    target = np.dtype(dtype) if dtype is not None else FED_AS
    if not (np.issubdtype(array.dtype, np.floating) and np.issubdtype(target, np.floating)):
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        return array.astype(target, copy=False)


def overflow(array: np.ndarray, fed: np.ndarray) -> tuple[np.ndarray, int, str]:
    """Per sample: a value finite in ``array`` but not in ``fed``; the first such sample (-1: none)
    and its first such value (``feature 2: 1.2e+39 overflows float32 (largest 3.4e+38)``)."""
    array = np.asarray(array)
    if fed is array or not np.issubdtype(array.dtype, np.number):
        return np.zeros(len(array), bool), -1, ""
    values = _rows(array)
    over = np.isfinite(values) & ~np.isfinite(_rows(fed))
    rows = over.any(axis=1)
    if not rows.any():
        return rows, -1, ""
    sample, feature = (int(i) for i in np.argwhere(over)[0])
    where = np.unravel_index(feature, array.shape[1:]) if array.ndim > 2 else (feature,)
    value = float(values[sample, feature])
    text = (f"feature {', '.join(map(str, where))}: {value:g} overflows {fed.dtype} "
            f"(largest {np.finfo(fed.dtype).max:.3g})")
    return rows, sample, text


def _check_split(
    split: str, arrays: Sequence[np.ndarray], data: Dataset, dtypes: Sequence[DTypeLike] | None
) -> list[Finding]:
    stored = [np.asarray(a) for a in arrays]
    fed = [as_fed(a, dtypes[i] if dtypes is not None else None) for i, a in enumerate(stored)]
    inputs = list(fed)
    label = inputs.pop() if has_label(len(inputs)) else None
    size = len(inputs[0])
    findings: list[Finding] = []

    def add(mask: np.ndarray, what: str, detail: str = "") -> None:
        if mask.any():
            findings.append(Finding(split, what, tuple(int(i) for i in np.flatnonzero(mask)), detail))

    overflowed = np.zeros(size, bool)  # flagged as overflowing: not again as non-finite
    for i, (original, cast) in enumerate(zip(stored, fed, strict=True)):
        flagged, sample, what = overflow(original, cast)
        kind = "a label" if label is not None and i == len(stored) - 1 else "an input"
        add(flagged, f"{kind} that overflows {cast.dtype} when fed", f"sample {sample}, {what}")
        overflowed |= flagged

    rows = [_rows(a) for a in inputs if np.issubdtype(a.dtype, np.number)]
    finite = [np.isfinite(r) for r in rows]
    corrupt = np.zeros(size, bool)
    for ok in finite:
        corrupt |= ~ok.any(axis=1)
    corrupt &= ~overflowed
    add(corrupt, "a corrupt input", "every value NaN or Inf")
    partial = np.zeros(size, bool)
    for ok in finite:
        partial |= ~ok.all(axis=1)
    add(partial & ~corrupt & ~overflowed, "a non-finite input", "some values NaN or Inf")
    labels = _rows(label) if label is not None and np.issubdtype(label.dtype, np.number) else None
    if labels is not None:
        add(~np.isfinite(labels).all(axis=1) & ~overflowed, "a non-finite label", "NaN or Inf")
        if data.label_range is not None:
            add(*_outside(labels, data.label_range, "a label outside the declared range"))
    if data.input_range is not None:
        for r in rows:
            mask, what, detail = _outside(r, data.input_range, "an input outside the expected range")
            add(mask & ~corrupt, what, detail + _scaling_hint(r[mask], data.input_range))
    return findings


def _rows(array: np.ndarray) -> np.ndarray:
    return array.reshape(len(array), -1)


def _outside(rows: np.ndarray, bounds: tuple[float, float], what: str) -> tuple[np.ndarray, str, str]:
    """Samples with a finite value outside ``bounds`` (NaN/Inf are the other checks' business)."""
    low, high = bounds
    with np.errstate(invalid="ignore"):
        finite = np.where(np.isfinite(rows), rows, (low + high) / 2)
    mask = np.asarray(((finite < low) | (finite > high)).any(axis=1))
    seen = []
    if mask.any() and finite[mask].min() < low:
        seen.append(f"down to {finite[mask].min():g}")
    if mask.any() and finite[mask].max() > high:
        seen.append(f"up to {finite[mask].max():g}")
    return mask, f"{what} [{low:g}, {high:g}]", "values " + " and ".join(seen) if seen else ""


def _scaling_hint(bad_rows: np.ndarray, bounds: tuple[float, float]) -> str:
    """Say "unscaled input" when the values overshoot the expected range by a scale factor."""
    if not bad_rows.size:
        return ""
    peak = float(np.nanmax(np.abs(np.where(np.isfinite(bad_rows), bad_rows, 0.0))))
    span = max(abs(bounds[0]), abs(bounds[1]))
    return ": unscaled input where the model expects scaled input" if span > 0 and peak > 2 * span else ""
