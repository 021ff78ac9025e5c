"""Machine description attached to every benchmark result.

Why: a throughput number means nothing without the machine it was measured
on, and numbers from different machines must never be compared by accident.
Every benchmark driver stores :func:`describe_machine` in its JSON and the
docs print it with :func:`machine_markdown`. Only standard-library sources are
used (``/proc`` on Linux, :mod:`platform`), so this works without root.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["cpu_model", "describe_machine", "filesystem_of", "machine_markdown", "memory_bytes"]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU model name (``model name`` of ``/proc/cpuinfo``), else :func:`platform.processor`."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Total physical memory in bytes (``MemTotal``), or ``None`` if unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def filesystem_of(path: str | Path, mounts: Path = Path("/proc/mounts")) -> dict[str, str] | None:
    """Mount point, file-system type and device holding ``path`` (longest mount prefix)."""
    target = os.path.realpath(path)
    best: dict[str, str] | None = None
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mnt, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) > len(best["mount"])):
            best = {"mount": mnt, "type": fstype, "device": device}
    return best


def _mpi_library() -> str | None:
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - mpi4py is a dependency
        return None
    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def _netcdf_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        import netCDF4

        out["netCDF4-python"] = netCDF4.__version__
        out["netcdf-c"] = netCDF4.__netcdf4libversion__.split()[0]
        out["hdf5"] = netCDF4.__hdf5libversion__
    except ImportError:  # pragma: no cover - netCDF4 is a dependency
        pass
    return out


def describe_machine(data_dir: str | Path | None = None) -> dict[str, Any]:
    """Plain-data description of this machine (JSON-serialisable).

    Parameters
    ----------
    data_dir : path, optional
        Directory of the benchmark's files: its file system is recorded, since
        it bounds the I/O numbers as much as the CPU does.

    Returns
    -------
    dict
        ``platform``, ``python``, ``cpu_model``, ``logical_cpus``,
        ``memory_bytes``, ``mpi_library``, library versions, ``filesystem``
        (when ``data_dir`` is given) and ``timestamp`` (UTC, ISO 8601).
    """
    import numpy

    desc: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "mpi_library": _mpi_library(),
        "versions": {"numpy": numpy.__version__, **_netcdf_versions()},
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if data_dir is not None:
        desc["filesystem"] = filesystem_of(data_dir)
    return desc


def machine_markdown(desc: Mapping[str, Any]) -> str:
    """A Markdown bullet list of a :func:`describe_machine` result, for docs."""
    mem = desc.get("memory_bytes")
    fs = desc.get("filesystem") or {}
    versions = ", ".join(f"{k} {v}" for k, v in (desc.get("versions") or {}).items())
    lines = [
        f"- CPU: {desc.get('cpu_model')} ({desc.get('logical_cpus')} logical CPUs)",
        f"- Memory: {mem / 1e9:.1f} GB" if mem else "- Memory: unknown",
        f"- OS: {desc.get('platform')}",
        f"- File system: {fs.get('type', 'unknown')} on {fs.get('device', '?')}"
        f" (mounted at {fs.get('mount', '?')})",
        f"- MPI: {desc.get('mpi_library')}",
        f"- Python {desc.get('python')}; {versions}",
        f"- Measured: {desc.get('timestamp')}",
    ]
    return "\n".join(lines)
