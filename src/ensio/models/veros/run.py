"""One Veros forecast, run as the unmodified model and checked: the OSSE's member command.

``python -m ensio.models.veros.run SETUP ANALYSIS FORECAST --days D [--grid grid.nc]``
runs ``veros run SETUP -s restart_input_filename ANALYSIS -s restart_output_filename
FORECAST -s runlen D*86400`` (``-n PX PY`` under ``mpiexec`` when asked) and fails
loudly — non-zero exit, one line naming the log — when Veros did not finish or its
result is not sane.

Why a wrapper around ``veros run`` and not the bare command in
``workflow.member_command``:

* Veros refuses to start when its diagnostic output files (``acc.snapshot.nc`` …) exist
  in the working directory, and ``force_overwrite`` is refused in restart runs; a retried
  task would fail for ever. Every attempt runs in a fresh directory ``veros/`` under the
  task's working directory (the previous attempt's is removed first).
* ``veros run`` exits 0 in cases a cycle must not go on from. The ``acc`` setup does not
  switch Veros's CFL monitor on (its output frequency is unset), so the checks are made
  here, from the log and from the restart Veros wrote: the log has ``Integration done``
  and no line about a NaN, a CFL violation or a stopped integration; every state array
  of ``core`` is finite; and the maximal horizontal CFL number of the restart's
  velocities, computed with the CFL monitor's formula (|u|·Δt / (cos φ·Δx), |v|·Δt / Δy
  over the interior), is below :data:`CFL_LIMIT`.

Only the standard library, numpy and h5py: a member task starts once per member and cycle.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CFL_LIMIT", "VerosFailed", "check_log", "check_restart", "run_veros",
           "veros_argv", "veros_executable"]

#: Largest horizontal CFL number a forecast may end with (Veros's own monitor only
#: prints it; an explicit advection scheme is unstable well before 1).
CFL_LIMIT = 0.5
#: Earth radius and tracer time step of the ``acc`` setup, for the CFL number.
EARTH_RADIUS = 6370e3
#: Log lines that mean the run must not be trusted, whatever the exit status.
_BAD_LOG = re.compile(r"\bnan\b|CFL number (is|exceeds)|Stopping integration|Traceback",
                      re.IGNORECASE)


class VerosFailed(RuntimeError):
    """A Veros run failed or left an unusable restart; the message is one line."""


def veros_executable() -> str:
    """``veros`` beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("veros")
    if beside.exists():
        return str(beside)
    found = shutil.which("veros")
    if found is None:
        raise VerosFailed("veros: command not found (pip install -e '.[veros]')")
    return found


def veros_argv(setup: str | Path, *, restart_in: str | Path | None, restart_out: str | Path,
               seconds: float, restart_every: float = 0.0,
               procs: tuple[int, int] = (1, 1)) -> list[str]:
    """The ``veros run`` command line of one run (settings as ``-s NAME VALUE`` overrides).

    ``restart_out`` may hold Veros's placeholders (``{itt:0>5d}``) when ``restart_every``
    writes several restarts; without ``restart_in`` the run starts from the setup's
    initial conditions.
    """
    argv = [veros_executable(), "run", str(setup)]
    if procs != (1, 1):
        argv += ["-n", str(procs[0]), str(procs[1])]
    if restart_in is not None:
        argv += ["-s", "restart_input_filename", str(restart_in)]
    argv += ["-s", "restart_output_filename", str(restart_out),
             "-s", "runlen", repr(float(seconds)),
             "-s", "restart_frequency", repr(float(restart_every))]
    return argv


def run_veros(argv: Sequence[str], rundir: str | Path, log: str | Path,
              mpiexec: Sequence[str] = ()) -> None:
    """Run Veros in a fresh ``rundir`` (removed first), its output into ``log``.

    Raises
    ------
    VerosFailed
        Non-zero exit, no ``Integration done``, or a log line of :data:`_BAD_LOG`.
    """
    rundir = Path(rundir)
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with open(log, "w") as out:
        rc = subprocess.run([*mpiexec, *argv], cwd=rundir, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env).returncode
    text = Path(log).read_text(errors="replace")
    if rc != 0:
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        raise VerosFailed(f"{log}: veros run exit status {rc}: {last}")
    check_log(text, log)


def check_log(text: str, log: str | Path) -> None:
    """The run's log says it finished and nothing alarming (see the module docstring)."""
    bad = next((ln.strip() for ln in text.splitlines() if _BAD_LOG.search(ln)), None)
    if bad is not None:
        raise VerosFailed(f"{log}: {bad}")
    if "Integration done" not in text:
        raise VerosFailed(f"{log}: no 'Integration done' in the Veros log")


def check_restart(path: str | Path, dt: float = 43200.0) -> float:
    """Check a Veros restart's ``core`` arrays and return its maximal horizontal CFL number.

    The CFL number is the one Veros's CFL monitor prints: over the interior (the halo of
    2 cells cut), max of |u|·Δt / (cos φ · Δx) and |v|·Δt / Δy on the time level ``tau``,
    with Δx, Δy from the restart's own grid spacing (``acc``: 2° both ways) as stored
    in the setup; here they are taken as the grid's 2° and φ from ``yt`` of ``acc``.
    """
    import h5py
    import numpy as np

    with h5py.File(path, "r") as f:
        if "core" not in f:
            raise VerosFailed(f"{path}: no group 'core' in the Veros restart")
        core = f["core"]
        for name, ds in core.items():
            if ds.dtype.kind == "f" and not np.all(np.isfinite(ds[...])):
                raise VerosFailed(f"{path}: core/{name} holds NaN or Inf")
        tau = int(core["tau"][()])
        u = np.abs(core["u"][2:-2, 2:-2, :, tau])
        v = np.abs(core["v"][2:-2, 2:-2, :, tau])
    ny = u.shape[1]
    dx = dy = 2.0 * math.pi / 180.0 * EARTH_RADIUS  # acc: dxt = dyt = 2 degrees
    lat = -41.0 + 2.0 * np.arange(ny)                # acc: yt = -41, -39, ..., 41
    cos = np.cos(np.deg2rad(lat))[None, :, None]
    cfl = float(max(np.max(u * dt / (cos * dx)), np.max(v * dt / dy)))
    if not cfl < CFL_LIMIT:
        raise VerosFailed(f"{path}: horizontal CFL number {cfl:.3g} >= {CFL_LIMIT} "
                          "(the forecast is unstable)")
    return cfl


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensio.models.veros.run",
                                description="One checked Veros forecast (the OSSE's member "
                                            "command).")
    p.add_argument("setup", help="the setup file (acc.py)")
    p.add_argument("analysis", help="restart to start from")
    p.add_argument("forecast", help="restart to write at the end")
    p.add_argument("--days", type=float, required=True, help="forecast length in days")
    p.add_argument("--procs", type=int, nargs=2, default=(1, 1), metavar=("PX", "PY"),
                   help="Veros's -n PX PY (run under mpiexec -n PX*PY)")
    a = p.parse_args(argv)
    procs = (a.procs[0], a.procs[1])
    mpiexec: list[str] = []
    if procs != (1, 1):
        launcher = Path(sys.executable).with_name("mpiexec")
        mpiexec = [str(launcher) if launcher.exists() else "mpiexec",
                   "-n", str(procs[0] * procs[1])]
    forecast = Path(a.forecast).resolve()
    work = Path.cwd()
    try:
        run_veros(veros_argv(Path(a.setup).resolve(), restart_in=Path(a.analysis).resolve(),
                             restart_out=forecast, seconds=a.days * 86400.0, procs=procs),
                  work / "veros", work / "veros.log", mpiexec)
        if not forecast.exists():
            raise VerosFailed(f"{work / 'veros.log'}: Veros wrote no restart {forecast}")
        cfl = check_restart(forecast)
    except VerosFailed as exc:
        print(f"veros member: error: {exc}", file=sys.stderr)
        return 1
    print(f"veros member: {forecast.name} written, max horizontal CFL {cfl:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
