"""Observations: batches, operators, quality control, reading."""

from .batch import ObsBatch
from .operators import ObsOperator, RegularGrid, bilinear_operator, build_operator
from .qc import QCCounts, quality_control
from .read import read_obs_netcdf

__all__ = [
    "ObsBatch",
    "ObsOperator",
    "RegularGrid",
    "bilinear_operator",
    "build_operator",
    "QCCounts",
    "quality_control",
    "read_obs_netcdf",
]
