"""Plain data (parsed YAML) -> typed frozen dataclasses, checked: :func:`from_plain`.

Its own module, apart from :mod:`.load`, so that a section converted on its own
(the transfer config of ``ensio run --transfer``, started once per program)
does not import the whole config schema (issue 24: start-up time).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["SHORT_FORMS", "from_plain"]

#: Dataclasses a config may give as a bare string, and the field the string fills
#: (``variables: [t]`` for ``[{name: t}]``); each class registers itself where it is
#: defined, so the entry exists whenever the type can be asked for.
SHORT_FORMS: dict[type, str] = {}


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
    if isinstance(value, str) and tp in SHORT_FORMS:
        return tp(**{SHORT_FORMS[tp]: value})
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
    # a field's config key is its name, or metadata["key"] where the name is a keyword
    fields = {f.metadata.get("key", f.name): f for f in dataclasses.fields(tp)
              if f.init and f.name not in (skip or ())}
    for k in value:
        if k not in fields:
            dotted = f"{key}.{k}" if key else str(k)
            raise ConfigError(f"{dotted}: unknown config key")
    kwargs = {}
    for name, f in fields.items():
        sub = f"{key}.{name}" if key else name
        if name in value:
            kwargs[f.name] = from_plain(hints[f.name], value[name], sub)
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
