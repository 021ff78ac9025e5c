"""The analysis: ensemble-space kernels, localization, inflation, filters, one pipeline.

Kernels (``transforms``, ``basis``, ``batched``, ``pointwise``) work on
arrays in memory (member-major ensemble blocks, ``(k, n)``) and know no
files and no communicators; the filter variants (``variants``) and drivers
(``filters``) compose them; :func:`~ensio.analysis.pipeline.analyse_rows`
is the one pipeline, given communicators explicitly. ``inputs`` is the one
module that reads (observation) files.
"""

from .api import analyse, assimilate
from .filters import FILTERS, localization_from_config, make_filter
from .local import local_analysis
from .localization import Geometry, Localization
from .obsspace import ObsSpace
from .pipeline import AnalysisSettings, analyse_rows
from .result import AnalysisResult, InnovationStats
from .variants import VARIANTS, Variant

__all__ = [
    "FILTERS",
    "VARIANTS",
    "AnalysisResult",
    "AnalysisSettings",
    "InnovationStats",
    "Variant",
    "analyse",
    "analyse_rows",
    "assimilate",
    "localization_from_config",
    "make_filter",
    "ObsSpace",
    "local_analysis",
    "Geometry",
    "Localization",
]
