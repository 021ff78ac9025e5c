"""YAML → typed frozen dataclasses, with ``--set a.b=c`` overrides.

The conversion is driven by the dataclass type hints, so adding a field to a
section is the only step needed to add a config key. Unknown keys, wrong types
and missing required keys raise :class:`ConfigError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .plain import from_plain
from .schema import Config, ConfigError
from .workflow import check_transfer_file
from .yamlfile import read_yaml

__all__ = [
    "apply_overrides",
    "config_from_dict",
    "from_plain",
    "load_config",
    "parse_override",
]


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config file (safely) and resolve it into a :class:`Config`.

    Relative paths in the config are resolved against the file's directory,
    so a config can be run from anywhere.
    """
    path = Path(path)
    raw = read_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    raw = apply_overrides(raw, overrides)
    return config_from_dict(raw, base_dir=path.resolve().parent)


def config_from_dict(raw: Mapping[str, Any], base_dir: str | Path = ".") -> Config:
    """Build a :class:`Config` from plain data (already parsed YAML)."""
    data = dict(raw)
    if "base_dir" in data:
        raise ConfigError("base_dir: not a config key")
    cfg = from_plain(Config, data, "", skip={"base_dir"})
    cfg = dataclasses.replace(cfg, base_dir=Path(base_dir))
    if cfg.ensemble.grid is not None:  # relative to the config, resolved once
        grid = str(cfg.resolve(cfg.ensemble.grid))
        cfg = dataclasses.replace(cfg, ensemble=dataclasses.replace(cfg.ensemble, grid=grid))
    if cfg.workflow is not None and cfg.workflow.transfer is not None:
        check_transfer_file(cfg.resolve(cfg.workflow.transfer))
    return cfg


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b=c`` into (``["a", "b"]``, parsed YAML scalar ``c``)."""
    import yaml  # where used (as in read_yaml): importing this module stays free of PyYAML

    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted key")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {key}: value {value!r} is not valid YAML") from None
    return key.strip().split("."), parsed


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with every ``a.b=c`` override applied."""
    out: dict[str, Any] = _deepcopy(raw)
    for item in overrides:
        keys, value = parse_override(item)
        node = out
        for i, k in enumerate(keys[:-1]):
            nxt = node.get(k)
            if nxt is None:
                nxt = node[k] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(
                    f"--set {'.'.join(keys)}: {'.'.join(keys[: i + 1])} is not a section"
                )
            node = nxt
        node[keys[-1]] = value
    return out


def _deepcopy(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _deepcopy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deepcopy(v) for v in x]
    return x
