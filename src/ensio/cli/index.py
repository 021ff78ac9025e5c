"""``ensio index CONFIG --lon X --lat Y``: the state row of a place (an observation's ``index``).

Reads the layout from the first member (no MPI, no data) and prints the row
of the nearest grid point, with where that point is, so that a hand-written
observation file can give ``index`` (H = identity at that row).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..config import load_config
from ..errors import InputError
from ..io.scan.members import layout_from_member
from ..io.tiles.tiled import TiledEnsemble
from ..layout.index import state_index
from .options import add_set_option

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``index`` sub-command."""
    p = subparsers.add_parser(
        "index",
        help="print the state-vector row (an observation's index) nearest to lon/lat",
        description=(
            "Print the 0-based state-vector row of the grid point nearest (great circle) "
            "to LON/LAT on a state variable (default: the first), at a level of a 3-D "
            "variable (the nearest level to --level, or --level-index), as the 'index' of "
            "an observation file means it. The layout comes from the first member file."
        ),
    )
    p.add_argument("config", type=Path, metavar="CONFIG", help="YAML configuration file")
    p.add_argument("--lon", type=float, required=True, help="longitude, degrees")
    p.add_argument("--lat", type=float, required=True, help="latitude, degrees")
    p.add_argument("--variable", default=None, help="state variable (default: the first)")
    lev = p.add_mutually_exclusive_group()
    lev.add_argument("--level", type=float, default=None, help="level coordinate value")
    lev.add_argument("--level-index", type=int, default=None, help="0-based level")
    add_set_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print ``row N  variable V  lon .. lat .. [level ..]``; exit 2 if masked."""
    config = load_config(args.config, args.overrides)
    if config.ensemble.tiled:  # the global layout, coordinates put together from the tiles
        tiled = TiledEnsemble(config.ensemble, config.base_dir, check_tiles=False)
        first, layout = tiled.paths[0][0], tiled.layout
    else:
        first = config.member_paths()[0]
        layout = layout_from_member(config.ensemble, first)
    row = int(state_index(layout, args.lon, args.lat, args.variable, args.level, args.level_index))
    name = args.variable or layout.variables[0].name
    if row < 0:
        raise InputError(
            f"{first}: the grid point of '{name}' nearest to lon {args.lon:g}, lat "
            f"{args.lat:g} is masked out of the state (no row)"
        )
    at = layout.coordinates(row, row + 1)
    where = f"lon {at['lon'][0]:g}  lat {at['lat'][0]:g}"
    if "level" in at and np.isfinite(at["level"][0]):
        where += f"  level {at['level'][0]:g}"
    print(f"{row}\tvariable {name}  {where}")
    return 0
