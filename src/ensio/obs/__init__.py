"""Observations: batches, operators, quality control, reading."""

from .batch import ObsBatch
from .operators import Locator, ObsOperator, RegularGrid, bilinear_operator, build_operator
from .qc import QC_FLAGS, QCCounts, quality_control, quality_flags
from .read import read_obs_netcdf
from .sources import ObsSource, read_source
from .stategrid import StateGrid

__all__ = [
    "Locator",
    "ObsBatch",
    "ObsOperator",
    "ObsSource",
    "RegularGrid",
    "StateGrid",
    "bilinear_operator",
    "build_operator",
    "QC_FLAGS",
    "QCCounts",
    "quality_control",
    "quality_flags",
    "read_obs_netcdf",
    "read_source",
]
