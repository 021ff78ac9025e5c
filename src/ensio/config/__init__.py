"""Typed, frozen configuration: schema, YAML loading, ``--set`` overrides."""

from .analysis import (
    AnalysisSection,
    InflationSection,
    LocalizationSection,
    ObservationFile,
    OutputSection,
    QCSection,
)
from .errors import ConfigError
from .load import apply_overrides, config_from_dict, from_plain, load_config, parse_override
from .schema import Config, Coordinates, EnsembleSection, IOSection, VariableSpec

__all__ = [
    "AnalysisSection",
    "InflationSection",
    "LocalizationSection",
    "ObservationFile",
    "OutputSection",
    "QCSection",
    "Config",
    "ConfigError",
    "Coordinates",
    "EnsembleSection",
    "IOSection",
    "VariableSpec",
    "apply_overrides",
    "config_from_dict",
    "from_plain",
    "load_config",
    "parse_override",
]
