"""Global geometry of a domain, assembled from the model ranks' parts.

Placeholder with exactly the spec's fields so the server core can be tested
before H-writer's module (the owner of this file) is merged; take theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import DomainDef

__all__ = ["DomainGeometry"]


@dataclass(frozen=True)
class DomainGeometry:
    """Global coordinates of one domain (shapes: see ``ioserver-spec`` / parts.py)."""

    domain: DomainDef
    lon: np.ndarray
    lat: np.ndarray
    lon_bounds: np.ndarray | None = None
    lat_bounds: np.ndarray | None = None
    area: np.ndarray | None = None
    mask: np.ndarray | None = None
