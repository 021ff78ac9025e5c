"""What a test needs from its machine: skip locally without it, FAIL under ``CI=true``.

Why one rule: CI installs every outside tool the tests use (``.ci/run``: netcdf-bin
with ncdump/ncgen/nccopy, nco, cdo, gfortran, iproute2, a one-node SLURM; the
``[test]`` extra: xarray, compliance-checker; the mpich wheel: mpiexec and mpicc next
to the interpreter) and runs as root. A test that finds one of them missing there
means CI is broken, and letting it turn into a skip would let the suite pass without
running it. On a developer's machine a missing tool is normal: the test skips and
says which tool. Every "needs X" in tests/ goes through :func:`capability`.

Two ways to use it:

* inside a test or fixture: ``needs.tool("cdo")``, ``needs.module("xarray")``,
  ``needs.root("mount a tmpfs")``, ``needs.capability("chattr +i", reason)``;
* as a mark on a test, a class or a module (``pytestmark``):
  ``@needs.tools_mark("ncgen", "nccopy")`` or, for any check,
  ``@needs.mark(needs.root, "run a daemon as another user")``; ``tests/conftest.py``
  runs the marked checks before the test's fixtures (:func:`run_marks`).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: The marker name; ``tests/conftest.py`` registers it and runs its checks.
MARKER = "needs"


def in_ci() -> bool:
    """Whether this run is CI's (``CI=true``), where nothing it needs may be missing."""
    return os.environ.get("CI") == "true"


def capability(what: str, reason: str | None) -> None:
    """The one rule: ``reason`` None → nothing; else skip locally, fail under CI=true.

    ``what`` names what the test needs ("SLURM", "cdo on PATH"); ``reason`` says why
    this machine does not have it (None: it does).
    """
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI=true requires {what}: {reason}", pytrace=False)
    # reported at the test's location, not this line (as a skip mark's would be)
    raise pytest.skip.Exception(f"needs {what}: {reason}", _use_item_location=True)


def tool(*names: str) -> None:
    """Every program in ``names`` is on PATH."""
    missing = [n for n in names if shutil.which(n) is None]
    capability(", ".join(names) + " on PATH",
               f"not found: {', '.join(missing)}" if missing else None)


def venv_tool(name: str, path_fallback: bool = False) -> Path:
    """The program ``name`` next to the interpreter (the mpich wheel puts mpiexec and
    mpicc there), or with ``path_fallback`` the one on PATH; returns its path."""
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name) if path_fallback else None
    where = f"next to {sys.executable}" + (" or on PATH" if path_fallback else "")
    capability(f"{name} {where}", None if found else "not found (install the mpich wheel)")
    return Path(str(found))  # found: capability raised otherwise


def mpiexec(path_fallback: bool = False) -> Path:
    """The mpiexec the tests launch: the mpich wheel's, next to the interpreter."""
    return venv_tool("mpiexec", path_fallback)


def module(name: str) -> ModuleType:
    """Import ``name``; only its own absence counts as missing.

    Any other import error (a broken dependency, a bug in the module) propagates
    and fails the test: unlike ``pytest.importorskip`` it never becomes a skip.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise
        capability(f"the Python module {name}", f"not installed ({exc})")
        raise  # unreachable: capability skipped or failed


def root(what: str) -> None:
    """The test runs as root (to ``what``: mount, chattr, setpriv …)."""
    uid = os.geteuid()
    capability(f"root to {what}", None if uid == 0 else f"running as uid {uid}")


def mark(check: Callable[..., Any], *args: Any, **kwargs: Any) -> pytest.MarkDecorator:
    """A mark that runs ``check(*args, **kwargs)`` before the test's fixtures."""
    return getattr(pytest.mark, MARKER).with_args(check, *args, **kwargs)


def tools_mark(*names: str) -> pytest.MarkDecorator:
    """Mark: every program in ``names`` is on PATH (see :func:`tool`)."""
    return mark(tool, *names)


def register(config: pytest.Config) -> None:
    """Declare the ``needs`` marker (from ``pytest_configure``)."""
    config.addinivalue_line(
        "markers", f"{MARKER}(check, *args): runs check(*args) before the test's fixtures; "
        "skips without the tool or capability, FAILS with the reason when CI=true")


def run_marks(item: pytest.Item) -> None:
    """Run the checks of every ``needs`` mark of ``item`` (test, class and module)."""
    for m in item.iter_markers(MARKER):
        check, *args = m.args
        check(*args, **m.kwargs)
