"""Deterministic synthetic data for the built-in models (numpy only, no TensorFlow).

``lotka_volterra``: initial populations of a 4-species competitive Lotka-Volterra system (a
chaotic one, Vano et al. 2006) and the populations at a fixed horizon, integrated with RK4 on a
fine grid. The target depends only on the horizon, never on how many learned steps reach it.

``block_images``: RGB uint8 images with 0..max_blocks non-overlapping coloured blocks, the label
being the count. It can plant the faults of a real pipeline: NaN labels, negative labels, corrupt
(all-NaN) images and unscaled images (16-bit values, 0..65535, in an 8-bit pipeline).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

# Vano, Wildenberg, Anderson, Noel, Sprott (2006): chaotic 4-species competitive LV.
LV_RATES = np.array([1.0, 0.72, 1.53, 1.27])
LV_INTERACTIONS = np.array(
    [[1.0, 1.09, 1.52, 0.0], [0.0, 1.0, 0.44, 1.36], [2.33, 0.0, 1.0, 0.47], [1.21, 0.51, 0.35, 1.0]]
)


def lv_rates(n: np.ndarray) -> np.ndarray:
    """Per-capita growth rate of each species, for populations ``n`` of shape (..., 4)."""
    return LV_RATES * (1.0 - n @ LV_INTERACTIONS.T)


@functools.lru_cache(maxsize=4)
def lotka_volterra(
    size: int, horizon: float, seed: int, substeps: int = 400
) -> tuple[np.ndarray, np.ndarray]:
    """Initial log-populations and log-populations at ``horizon``, each of shape (size, 4).

    Made once per process for the same arguments (a worker runs many configs on the same data),
    and read-only, since every caller gets the same arrays.
    """
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(0.01), np.log(2.0), size=(size, 4)))
    start = n.copy()
    h = horizon / substeps

    def flow(m: np.ndarray) -> np.ndarray:
        return m * lv_rates(m)

    for _ in range(substeps):
        k1 = flow(n)
        k2 = flow(n + 0.5 * h * k1)
        k3 = flow(n + 0.5 * h * k2)
        k4 = flow(n + h * k3)
        n = n + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    x, y = np.log(start).astype(np.float32), np.log(n).astype(np.float32)
    x.flags.writeable = y.flags.writeable = False
    return x, y


@dataclass(frozen=True)
class Faults:
    """Data faults to plant, as fractions of the training samples."""

    nan_labels: float = 0.0
    negative_labels: float = 0.0
    corrupt_images: float = 0.0
    unscaled_images: float = 0.0  # pixels scaled to 16 bits (x 257) where 0..255 is expected


def block_images(
    size: int, image_size: int, max_blocks: int, seed: int, faults: Faults = Faults()
) -> tuple[np.ndarray, np.ndarray]:
    """Images (size, H, W, 3) as float32 holding uint8 values 0..255, and counts (size,)."""
    rng = np.random.default_rng(seed)
    images = np.zeros((size, image_size, image_size, 3), np.float32)
    images += rng.integers(0, 40, size=(size, 1, 1, 3))  # background tint
    counts = rng.integers(0, max_blocks + 1, size=size)
    cells = (image_size // 4) ** 2  # blocks sit on a 4-pixel grid, never overlapping
    for i, count in enumerate(counts):
        for cell in rng.choice(cells, size=count, replace=False):
            row, col = divmod(int(cell), image_size // 4)
            colour = rng.integers(120, 256, size=3)
            images[i, row * 4 : row * 4 + 3, col * 4 : col * 4 + 3] = colour
    labels = counts.astype(np.float32)
    _plant(images, labels, faults, rng)
    return images, labels


def _plant(images: np.ndarray, labels: np.ndarray, faults: Faults, rng: np.random.Generator) -> None:
    """Overwrite random samples in place with the faults asked for."""
    size = len(labels)
    for fraction, fault in (
        (faults.nan_labels, "nan"),
        (faults.negative_labels, "negative"),
        (faults.corrupt_images, "corrupt"),
        (faults.unscaled_images, "unscaled"),
    ):
        picked = rng.choice(size, size=round(fraction * size), replace=False)
        if fault == "nan":
            labels[picked] = np.nan
        elif fault == "negative":
            labels[picked] = -1.0
        elif fault == "corrupt":
            images[picked] = np.nan
        else:
            images[picked] *= 257.0
