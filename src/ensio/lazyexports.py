"""A package surface whose names load on first access (PEP 562).

A package ``__init__`` that names heavy objects (numpy, netCDF4, mpi4py behind
them) would load them for every light module of the package imported below it
(the worker, ``ensio --version``). With :func:`lazy_exports` the package lists
where each public name lives and imports that module only when the name is
used. Standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` for ``homes``.

    ``homes`` maps each public name to the module (relative to ``package``)
    that defines it; any other name is an ``AttributeError`` as usual.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(home, package), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
