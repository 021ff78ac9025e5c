"""YAML → typed frozen dataclasses, with ``--set a.b=c`` overrides.

The conversion is driven by the dataclass type hints, so adding a field to a
section is the only step needed to add a config key. Unknown keys, wrong types
and missing required keys raise :class:`ConfigError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .analysis import ObservationFile
from .schema import Config, ConfigError, VariableSpec
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


def from_plain(tp: Any, value: Any, key: str = "", skip: set[str] | None = None) -> Any:
    """Convert plain data ``value`` (parsed YAML) into type ``tp``, checking it.

    Public because a section can be converted on its own (tests and tools build
    one section from YAML without a whole config). ``key`` is the dotted path of
    ``value`` for error messages; ``skip`` names dataclass fields that are not
    config keys.

    Raises
    ------
    ConfigError
        Naming the dotted key: unknown key, wrong type, missing required key.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _union(tp, value, key)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            choices = " | ".join(map(str, allowed))
            raise ConfigError(f"{key or 'config'}: {value!r} is not one of {choices}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, (str, Mapping)) or not isinstance(value, Iterable):
            value = [value]
        return tuple(from_plain(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key or 'config'}: expected a mapping, got {value!r}")
        _, vt = typing.get_args(tp)
        return {str(k): from_plain(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is VariableSpec and isinstance(value, str):
        return VariableSpec(name=value)
    if tp is ObservationFile and isinstance(value, str):
        return ObservationFile(file=value)
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, value, key, skip)
    return _scalar(tp, value, key or "config")


def _union(tp: Any, value: Any, key: str) -> Any:
    """The first member type of the union ``tp`` that accepts ``value``."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for a in args:
        if a is type(None):
            continue
        try:
            return from_plain(a, value, key)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0] if len(errors) == 1
                      else f"{key or 'config'}: invalid value {value!r}")


def _dataclass(tp: Any, value: Any, key: str, skip: set[str] | None) -> Any:
    """A config section: every key known, every required key present, fields converted."""
    where = key or "config"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.init and f.name not in (skip or ())}
    for k in value:
        if k not in fields:
            dotted = f"{key}.{k}" if key else str(k)
            raise ConfigError(f"{dotted}: unknown config key")
    kwargs = {}
    for name, f in fields.items():
        sub = f"{key}.{name}" if key else name
        if name in value:
            kwargs[name] = from_plain(hints[name], value[name], sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{sub}: required config key is missing")
    try:
        return tp(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{where}: {exc}") from None


def _scalar(tp: Any, value: Any, where: str) -> Any:
    """A leaf value: bool, int, float, str, Path or Any, strictly typed (no coercion)."""
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a path, got {value!r}")
        return Path(value)
    if tp is Any:
        return value
    raise ConfigError(f"{where}: unsupported config type {tp!r}")
