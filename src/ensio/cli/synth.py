"""``ensio synth``: write the synthetic problem of the seed paper.

Thin layer: parse arguments, drive a progress bar (standard error, when it is
a terminal), call :func:`ensio.models.synthetic.write_synthetic`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from ensio.models.synthetic import SyntheticSpec, write_synthetic
from ensio.progress import PhaseProgress

__all__ = ["add_parser", "main", "run"]

DESCRIPTION = """\
Write the synthetic global problem of Zheng et al.: OUT/mem001.nc ... (state(lat, lon)
and an auxiliary variable aux(lat, lon)), OUT/truth.nc, OUT/obs.nc (10 % of the grid
points, error 0.25, with state-vector index) and OUT/ensio.yaml, a ready config:
`ensio analyse OUT/ensio.yaml` runs an LETKF (support radius 8 grid spacings) and
writes OUT/an/mean.nc and OUT/an/spread.nc.

The paper's members differ by one phase shift, so their anomalies span two
dimensions. --perturbation A adds to each member A times its own smooth random
field (unit variance; white noise smoothed by a Gaussian of --perturbation-scale
grid points, periodic in longitude), so anomalies are locally full-rank like a
real ensemble's; A = 0 (default) writes the paper's members unchanged.
"""


def add_parser(subparsers: Any) -> None:
    """Register ``synth`` on the ``ensio`` sub-command parser."""
    p = subparsers.add_parser(
        "synth", help="write a synthetic ensemble, truth and observations",
        description=DESCRIPTION,
    )
    configure(p)


def configure(p: argparse.ArgumentParser) -> None:
    """Add the arguments of ``synth`` to ``p`` (shared by ``ensio synth`` and ``main``)."""
    p.add_argument("out", metavar="OUT", help="output directory (created if needed)")
    p.add_argument("--nx", type=int, required=True, help="grid points in longitude (>= 2)")
    p.add_argument("--ny", type=int, required=True, help="grid points in latitude (>= 2)")
    p.add_argument("--members", type=int, required=True, help="ensemble size N_e")
    p.add_argument("--seed", type=int, required=True, help="seed of all random draws")
    p.add_argument("--format", choices=("netcdf4", "cdf5"), default="netcdf4",
                   help="netcdf4 (contiguous HDF5 datasets, default) or cdf5 "
                        "(NETCDF3_64BIT_DATA)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="on-disk dtype of state and aux (default float64)")
    p.add_argument("--levels", type=int, default=None, metavar="L",
                   help="make state 3-D: state(lev, lat, lon) with L levels")
    p.add_argument("--perturbation", type=float, default=0.0, metavar="A",
                   help="standard deviation of a smooth random field added to each member "
                        "(full-rank anomalies; default 0: none)")
    p.add_argument("--perturbation-scale", type=float, default=4.0, metavar="S",
                   help="Gaussian smoothing of that field, standard deviation in grid points "
                        "(default 4)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the case; prints a one-line summary. Returns the exit status."""
    try:
        spec = SyntheticSpec(
            nx=args.nx, ny=args.ny, members=args.members, seed=args.seed,
            format=args.format, dtype=args.dtype, levels=args.levels,
            perturbation=args.perturbation, perturbation_scale=args.perturbation_scale,
        )
    except ValueError as exc:
        print(f"ensio synth: error: {exc}", file=sys.stderr)
        return 2
    console = Console()
    with PhaseProgress.for_rank(0) as progress:
        with progress.phase("write", spec.members, "members") as advance:
            case = write_synthetic(args.out, spec, on_member=lambda _k: advance())
    itemsize = 8 if spec.dtype == "float64" else 4
    console.print(
        f"wrote {spec.members} members ({_size(spec.n_state * itemsize * spec.members)} of "
        f"state), truth.nc, obs.nc ({case.n_obs} observations) and {case.config.name} "
        f"to {case.directory}",
        highlight=False, soft_wrap=True,
    )
    return 0


def _size(nbytes: int) -> str:
    """Decimal (SI) size, as the benchmarks report GB = 1e9 bytes."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m ensio.cli.synth``), same arguments as ``ensio synth``."""
    p = argparse.ArgumentParser(prog="ensio synth", description=DESCRIPTION)
    configure(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
