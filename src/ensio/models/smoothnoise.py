"""Smooth random fields on a lon/lat grid: white noise under a Gaussian kernel.

Why this module exists: the members of ``ensio synth`` differ by one phase
shift, so their anomalies span two dimensions and a local analysis on them
is a degenerate (rank-2) problem. Real ensembles are locally full-rank. A
field with a finite correlation length added to each member, independently,
makes the anomalies full-rank within any localization radius that holds more
than a few correlation lengths, while keeping the members smooth like model
states (white noise would be full-rank too, but is no model state).

The field is white noise convolved with a Gaussian of standard deviation
``scale`` grid points (truncated at ``TRUNCATE · scale``) in each horizontal
direction: **periodic in longitude** (the kernel wraps around the globe) and
**not periodic in latitude** — the noise is drawn on ``halo`` extra rows
beyond each pole row and the convolution keeps only the valid part, so the
field's statistics are the same in every row and nothing wraps from one
pole to the other. It is divided by the kernel's exact standard deviation
factor ``sqrt(Σ g_lon² · Σ g_lat²)``, so every point has unit variance in
expectation and ``amplitude`` is the standard deviation of what is added.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["TRUNCATE", "gaussian_kernel", "smooth_field"]

#: Kernel half-width in units of ``scale`` (exp(-8) ≈ 3e-4 of the peak is dropped).
TRUNCATE = 4.0


def gaussian_kernel(scale: float) -> np.ndarray:
    """Normalized Gaussian weights at offsets ``-h..h``, ``h = ceil(TRUNCATE·scale)``."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"perturbation scale must be a finite number > 0, got {scale}")
    halo = math.ceil(TRUNCATE * scale)
    off = np.arange(-halo, halo + 1, dtype=np.float64)
    w = np.exp(-0.5 * (off / scale) ** 2)
    return w / w.sum()


def smooth_field(
    rng: np.random.Generator, ny: int, nx: int, scale: float, count: int = 1
) -> np.ndarray:
    """``count`` independent unit-variance smooth fields, shape ``(count, ny, nx)``.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of the white noise (``count · (ny + 2h) · nx`` normals, in
        that C order, so the result is a pure function of the stream).
    ny, nx : int
        Grid rows (latitude) and columns (longitude).
    scale : float
        Standard deviation of the Gaussian kernel, in grid points.
    count : int
        Number of fields (e.g. one per level).
    """
    g = gaussian_kernel(scale)
    halo = (g.size - 1) // 2
    # the longitude kernel wrapped onto the circle of nx points (periodic)
    g_lon = np.zeros(nx)
    np.add.at(g_lon, np.arange(-halo, halo + 1) % nx, g)
    noise = rng.standard_normal((count, ny + 2 * halo, nx))
    lat = np.zeros((count, ny, nx))
    for t, w in enumerate(g):  # valid convolution along latitude: no wrap at the poles
        lat += w * noise[:, t : t + ny, :]
    out = np.fft.irfft(np.fft.rfft(lat, axis=-1) * np.fft.rfft(g_lon), n=nx, axis=-1)
    return out / math.sqrt(float(g @ g) * float(g_lon @ g_lon))
