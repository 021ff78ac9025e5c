"""The analysis: ensemble-space kernels, localization, inflation, filters.

Works on arrays in memory (member-major ensemble blocks, ``(k, n)``); knows no
files and no communicators.
"""

from .filters import (
    FILTERS,
    AnalysisResult,
    Assimilation,
    InnovationStats,
    analyse,
    assimilate,
    localization_from_config,
    make_filter,
)
from .local import LocalResult, ObsSpace, local_analysis
from .localization import Geometry, Localization

__all__ = [
    "FILTERS",
    "AnalysisResult",
    "Assimilation",
    "InnovationStats",
    "analyse",
    "assimilate",
    "localization_from_config",
    "make_filter",
    "LocalResult",
    "ObsSpace",
    "local_analysis",
    "Geometry",
    "Localization",
]
