"""``ensio model ...``: the example models and their coupled programs as commands.

The commands that ``workflow.setup``, ``workflow.member_command`` and
``workflow.online.command`` of ``examples/*/cycle.yaml`` run:

``ensio model l96 setup|run|rmse|compare``
    :mod:`ensio.models.l96case` (Lorenz-96 with netCDF restarts).
``ensio model synthrun``
    :mod:`ensio.models.synthrun` (one forecast of the synthetic field).
``ensio model l96-coupled``, ``ensio model synthetic-coupled``
    :mod:`ensio.models.l96_coupled`, :mod:`ensio.models.synthetic_coupled`:
    every cycle of ``ensio cycle --mode online`` in one MPI job
    (``mpiexec -n N_e*P ensio model l96-coupled ...``).
``ensio model stencil``
    :mod:`ensio.models.stencil` (3-D diffusion sending its output through the
    I/O server; the model that ``ensio bench ioserver`` runs).

Why the model modules are imported only by the handlers: a member task is
started once per member and cycle, so ``ensio model synthrun`` must not pay
for MPI or the analysis (``ensio`` builds only this sub-command's parser when
the command line names it, see :mod:`ensio.cli.main`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser", "add_run_arguments"]

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``model`` and its sub-commands on the ``ensio`` sub-command parser."""
    p = subparsers.add_parser(
        "model", help="the example models (Lorenz-96, synthetic field, stencil) and coupled "
                      "programs",
        description="The example models (Lorenz-96, the synthetic field) and their coupled "
                    "programs: the commands that workflow.setup, workflow.member_command and "
                    "workflow.online.command of examples/*/cycle.yaml run.",
    )  # fmt: skip
    sub = p.add_subparsers(dest="model", metavar="MODEL", required=True)
    for add in (_add_l96, _add_synthrun, _add_l96_coupled, _add_synthetic_coupled,
                _add_stencil):
        add(sub)


# ----------------------------------------------------------------- Lorenz-96


def _add_l96(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "l96", help="the Lorenz-96 example with netCDF restarts",
        description="The Lorenz-96 cycling example (40 variables, F = 8): the seeded set-up, "
                    "one member forecast, and two summaries of a run directory.",
    )  # fmt: skip
    cmd = p.add_subparsers(dest="l96_command", metavar="COMMAND", required=True)
    s = cmd.add_parser(
        "setup", help="truth, observations, initial ensemble",
        description="Create (or extend to --cycles, idempotently) the truth run, the "
                    "observations of every cycle and the initial ensemble in --workdir. The "
                    "same seed gives the same files bit for bit.",
    )  # fmt: skip
    s.add_argument("--workdir", type=Path, required=True)
    s.add_argument("--members", type=int, required=True)
    s.add_argument("--cycles", type=int, required=True)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--steps", type=int, default=1, help="RK4 steps per cycle")
    s.add_argument("--sigma", type=float, default=1.0, help="observation error std")
    s.set_defaults(func=_l96_setup)
    r = cmd.add_parser(
        "run", help="one member forecast",
        description="Read x from --init, integrate --steps RK4 steps, write --out atomically.",
    )  # fmt: skip
    r.add_argument("--init", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--steps", type=int, default=1)
    r.add_argument("--sleep", type=float, default=0.0, help="seconds to imitate a longer run")
    r.set_defaults(func=_l96_run)
    e = cmd.add_parser("rmse", help="RMSE against the truth per cycle")
    e.add_argument("--workdir", type=Path, required=True)
    e.set_defaults(func=_l96_rmse)
    d = cmd.add_parser("compare", help="relative difference of two runs' analyses per cycle")
    d.add_argument("--workdir", type=Path, required=True)
    d.add_argument("--other", type=Path, required=True)
    d.set_defaults(func=_l96_compare)


def _l96_setup(args: argparse.Namespace) -> int:
    from ..models.l96case import setup

    setup(args.workdir, args.members, args.cycles, args.seed, args.steps, args.sigma)
    return 0


def _l96_run(args: argparse.Namespace) -> int:
    from ..models.l96case import run

    run(args.init, args.out, args.steps, args.sleep)
    return 0


def _l96_rmse(args: argparse.Namespace) -> int:
    from ..models.l96case import rmse_table

    print(f"{'cycle':>5}  {'prior RMSE':>10}  {'analysis RMSE':>13}")
    for c, prior, post in rmse_table(args.workdir):
        post_s = "—" if post is None else f"{post:.4f}"
        print(f"{c:>5}  {prior:>10.4f}  {post_s:>13}")
    return 0


def _l96_compare(args: argparse.Namespace) -> int:
    from ..models.l96case import compare

    print(f"{'cycle':>5}  {'max rel. difference':>19}")
    for c, rel in compare(args.workdir, args.other):
        print(f"{c:>5}  {rel:>19.2e}")
    return 0


# ---------------------------------------------------------- synthetic field


def _add_synthrun(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synthrun", help="one forecast of the synthetic field (a member task)",
        description="Copy the member file --init of `ensio synth` to --out (atomically), "
                    "optionally sleeping --sleep seconds (the cost of a real forecast) and "
                    "advecting --variable eastward by --shift grid points. With --ioserver "
                    "IODEF (run under mpiexec -n P+S): P model ranks each advect their rows "
                    "and send them to the dedicated restart writers, which write --out while "
                    "the model goes on; several --init/--out pairs (members) per run.",
    )  # fmt: skip
    p.add_argument("--init", type=Path, required=True, nargs="+")
    p.add_argument("--out", type=Path, required=True, nargs="+")
    p.add_argument("--ioserver", type=Path, default=None, metavar="IODEF",
                   help="ioserver config (YAML with an ioserver: section): write the "
                        "restarts through the I/O server (mode server, attached or sync)")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--shift", type=int, default=0)
    p.add_argument("--variable", default="state")
    p.set_defaults(func=_synthrun)


def _synthrun(args: argparse.Namespace) -> int:
    if len(args.init) != len(args.out):
        print(f"ensio model synthrun: --init: {len(args.init)} files for {len(args.out)} "
              "--out files", file=sys.stderr)
        return 2
    pairs = list(zip(args.init, args.out, strict=True))
    if args.ioserver is None:
        from ..models.synthrun import run

        for init, out in pairs:
            run(init, out, args.sleep, args.shift, args.variable)
        return 0
    from mpi4py import MPI

    from ..models.synthrun import run_ioserver

    run_ioserver(MPI.COMM_WORLD, args.ioserver, pairs, args.sleep, args.shift, args.variable)
    return 0


# ---------------------------------------------------------- coupled programs


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments every coupled program takes from ``workflow.online.command``.

    ``--workdir``, ``--first``, ``--cycles``, ``--initial``,
    ``--tasks-per-member`` and ``--timeout``, filled from the placeholders of
    the same names (see :class:`ensio.online.cycling.CoupledRun`). Public so a
    user's own coupled program can take the same command line.
    """
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--first", type=int, default=1, help="first cycle to run (default 1)")
    p.add_argument("--cycles", type=int, required=True, help="last cycle, K")
    p.add_argument("--initial", required=True,
                   help="restarts of cycle FIRST, a pattern with {member}")
    p.add_argument("--tasks-per-member", type=int, default=1, help="P (default 1)")
    p.add_argument("--timeout", type=float, default=None, help="hang guard per cycle (s)")


def _add_l96_coupled(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "l96-coupled", help="the Lorenz-96 example coupled (ensio cycle --mode online)",
        description="Cycles FIRST..K of the Lorenz-96 example in one MPI job of N_e*P ranks: "
                    "each member integrates --steps RK4 steps, writes its forecast file, and "
                    "the filter assimilates in memory.",
    )  # fmt: skip
    add_run_arguments(p)
    p.add_argument("--steps", type=int, default=1, help="RK4 steps per cycle")
    p.set_defaults(func=_l96_coupled)


def _l96_coupled(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from ..models.l96_coupled import run_coupled
    from ..online.cycling import print_reports

    world = MPI.COMM_WORLD
    reports = run_coupled(world, args.workdir, args.first, args.cycles, args.initial,
                          tasks_per_member=args.tasks_per_member, steps=args.steps,
                          timeout=args.timeout)
    print_reports(world, reports)
    return 0


def _add_synthetic_coupled(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synthetic-coupled", help="the synthetic field coupled (ensio cycle --mode online)",
        description="Cycles FIRST..K of the synthetic example in one MPI job of N_e*P ranks: "
                    "per cycle every rank sleeps --sleep seconds, the field is advected by "
                    "--shift points and assimilated in memory; no forecast file is written.",
    )  # fmt: skip
    add_run_arguments(p)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds of 'forecast' per cycle")
    p.add_argument("--shift", type=int, default=0, help="eastward advection per cycle (points)")
    p.add_argument("--variable", default="state")
    p.set_defaults(func=_synthetic_coupled)


def _synthetic_coupled(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from ..models.synthetic_coupled import run_coupled
    from ..online.cycling import print_reports

    world = MPI.COMM_WORLD
    reports = run_coupled(world, args.workdir, args.first, args.cycles, args.initial,
                          tasks_per_member=args.tasks_per_member, sleep=args.sleep,
                          shift=args.shift, variable=args.variable, timeout=args.timeout)
    print_reports(world, reports)
    return 0


# ----------------------------------------------------------- stencil model


def _add_stencil(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stencil", help="3-D diffusion model writing through the I/O server (run under mpiexec)",
        description="The 3-D diffusion stencil of ensio bench ioserver: --steps time steps of "
                    "--sweeps sweeps each on --nz x --ny x --nx points, rows decomposed over "
                    "the model ranks, sending --fields 3-D fields and a surface field through "
                    "the I/O server of --iodef. Run under mpiexec (-n P, or P+S in server "
                    "mode); --mode none runs without output (the baseline).",
    )  # fmt: skip
    p.add_argument("--iodef", type=Path, help="YAML with the ioserver: section")
    p.add_argument("--mode", default="server", choices=("none", "server", "attached", "sync"),
                   help="none: no output at all (the baseline); else the iodef's mode is used")
    p.add_argument("--nx", type=int, default=128, help="longitudes (default 128)")
    p.add_argument("--ny", type=int, default=64, help="latitudes (default 64)")
    p.add_argument("--nz", type=int, default=16, help="levels (default 16)")
    p.add_argument("--fields", type=int, default=4, help="3-D output fields (default 4)")
    p.add_argument("--steps", type=int, default=96, help="time steps (default 96)")
    p.add_argument("--sweeps", type=int, default=4,
                   help="diffusion sweeps per time step (default 4)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write the result (model rank 0)")
    p.set_defaults(func=_stencil)


def _stencil(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from ..models.stencil import StencilSettings, run

    st = StencilSettings(iodef=args.iodef, mode=args.mode, nx=args.nx, ny=args.ny, nz=args.nz,
                         fields=args.fields, steps=args.steps, sweeps=args.sweeps)
    from mpi4py import MPI

    res = run(MPI.COMM_WORLD, st)
    if res is not None and args.json is not None:
        args.json.write_text(json.dumps(asdict(res), indent=2) + "\n")
    return 0
