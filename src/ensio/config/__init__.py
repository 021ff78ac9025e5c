"""Typed, frozen configuration: schema, YAML loading, ``--set`` overrides."""

from .load import apply_overrides, config_from_dict, load_config, parse_override
from .schema import Config, ConfigError, Coordinates, EnsembleSection, IOSection, VariableSpec

__all__ = [
    "Config",
    "ConfigError",
    "Coordinates",
    "EnsembleSection",
    "IOSection",
    "VariableSpec",
    "apply_overrides",
    "config_from_dict",
    "load_config",
    "parse_override",
]
