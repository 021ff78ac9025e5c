"""Typed, frozen configuration: schema, YAML loading, ``--set`` overrides.

The package namespace is lazy (PEP 562): ``from ensio.config import X``
imports only the submodule that defines ``X``. Every ensio process imports
:class:`ConfigError` (through ``ensio.errors``); loading the whole schema
and PyYAML for it would tax commands that never read a config, e.g.
``ensio --version`` and ``ensio run --transfer`` (issue 24).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the submodule that defines it.
_WHERE = {
    "AnalysisSection": "analysis",
    "InflationSection": "analysis",
    "LocalizationSection": "analysis",
    "ObservationFile": "analysis",
    "OutputSection": "analysis",
    "QCSection": "analysis",
    "ConfigError": "errors",
    "apply_overrides": "load",
    "config_from_dict": "load",
    "from_plain": "load",
    "load_config": "load",
    "parse_override": "load",
    "Config": "schema",
    "Coordinates": "schema",
    "EnsembleSection": "schema",
    "IOSection": "schema",
    "VariableSpec": "schema",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
