"""The fields of the end-to-end model, as a formula of (step, level, lat, lon)."""

import numpy as np

NI, NJ, NK = 24, 12, 3


def lon():
    return (np.arange(NI) + 0.5) * 15.0


def lat():
    return -90.0 + (np.arange(NJ) + 0.5) * 15.0


def area():
    """Exact spherical cell areas of the 15-degree cells (m^2)."""
    r = 6371e3
    edges = np.deg2rad(np.linspace(-90, 90, NJ + 1))
    band = np.sin(edges[1:]) - np.sin(edges[:-1])
    return np.repeat((r * r * np.deg2rad(15.0) * band)[:, None], NI, axis=1)


def mask():
    m = np.ones((NJ, NI), dtype=bool)
    m[2:4, 5:9] = False  # "land"
    return m


def tas(step):
    la, lo = np.meshgrid(np.deg2rad(lat()), np.deg2rad(lon()), indexing="ij")
    v = 270.0 + 25.0 * np.cos(la) + 3.0 * np.sin(lo + 0.7 * step) + 0.1 * step
    if step % 5 == 0:
        v[7, 3] = np.nan  # a missing sample: excluded from the time operations
    return v


def ta(step):
    levels = np.arange(NK)[:, None, None]
    return tas(step)[None] - 6.5 * levels + 0.01 * step * levels


def pr(step):
    return np.maximum(0.0, np.sin(np.deg2rad(lon()))[None, :] * np.cos(0.3 * step)
                      + 0.0 * lat()[:, None]) * 1e-4


def rows_of(rank, size):
    """Unequal row blocks: rank r gets 1 + 2r rows, the last rank the rest."""
    counts = [min(1 + 2 * r, NJ) for r in range(size - 1)]
    starts = np.cumsum([0, *counts]).tolist()
    if starts[-1] >= NJ:
        raise ValueError("too many ranks for the 12 rows")
    counts.append(NJ - starts[-1])
    return starts[rank], counts[rank]
