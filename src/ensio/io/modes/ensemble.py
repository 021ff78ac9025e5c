"""The ensemble-I/O object of a run, chosen by ``io.mode``, and one-call wrappers.

An ensemble-I/O object is built once per run from (member paths, the layout
or the ``ensemble`` section, the ``io`` section, the filter communicator) and
then reads the prior into the row-distributed matrix and writes the analysis
back, as often as needed, until it is closed::

    with open_ensemble(config.member_paths(), config.ensemble, config.io, comm) as ens:
        block = ens.read()
        ...
        ens.write(analysis)

Implementations are registered in :data:`ENSEMBLE_IO` by ``io.mode``; each
provides the :class:`EnsembleIO` interface. ``files`` is
:class:`~ensio.io.modes.files.FileEnsembleIO`. A new mode is one module with its
class, one entry here and its ``Literal`` value in
:data:`ensio.config.schema.IOMode`. Tiled members (``{tile}``) have their own
registry, :data:`TILED_IO` (constructor ``(ensemble section, base, io, comm)``):
``files`` is :class:`~ensio.io.modes.tiledio.TiledEnsembleIO`, ``shuffle`` the
group all-to-all of :class:`~ensio.io.modes.shuffle.ShuffleEnsembleIO`;
:func:`open_tiled` opens either.

:func:`read_ensemble` / :func:`write_ensemble` build, use and close an object
in one call, for callers that read or write once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from mpi4py import MPI

from ...config.errors import ConfigError
from ...config.schema import Config, EnsembleSection, IOSection
from ...layout.block import EnsembleBlock
from ...layout.state import StateLayout
from ...progress import Advance, no_progress
from .files import FileEnsembleIO
from .shuffle import ShuffleEnsembleIO
from .stats import IOStats
from .tiledio import TiledEnsembleIO

__all__ = ["ENSEMBLE_IO", "TILED_IO", "EnsembleIO", "IOStats", "open_ensemble", "open_tiled",
           "read_ensemble", "write_ensemble"]


class EnsembleIO(Protocol):
    """What every ``io.mode`` implementation offers (see :class:`FileEnsembleIO`)."""

    layout: StateLayout
    n_io: int
    stats: IOStats | None

    def read(
        self, out: EnsembleBlock | None = None, *, overlap: bool = True,
        progress: Advance = no_progress,
    ) -> EnsembleBlock:
        """Collective: this rank's rows of every member (``progress()`` per member)."""

    def write(
        self, block: EnsembleBlock, *, overlap: bool = True, journal: bool | None = None,
        progress: Advance = no_progress,
    ) -> IOStats:
        """Collective: the rows back into the members (``progress()`` per member)."""

    def close(self) -> None:
        """Collective: free the object's communicators."""

    def __enter__(self) -> EnsembleIO: ...

    def __exit__(self, *exc: object) -> None: ...


#: ``io.mode`` → implementation (constructor ``(paths, layout_or_section, io, comm)``).
ENSEMBLE_IO: dict[str, type[EnsembleIO]] = {"files": FileEnsembleIO}

#: ``io.mode`` → implementation for tiled members (constructor ``(ens, base, io, comm)``).
TILED_IO: dict[str, type] = {"files": TiledEnsembleIO, "shuffle": ShuffleEnsembleIO}


def open_tiled(ens: EnsembleSection, base: Path, io: IOSection, comm: MPI.Comm) -> EnsembleIO:
    """Collective: the ensemble-I/O object of ``io.mode`` for tiled members (``{tile}``)."""
    return TILED_IO[io.mode](ens, base, io, comm)


def open_ensemble(
    paths: Sequence[Path],
    layout: StateLayout | EnsembleSection,
    io: IOSection,
    comm: MPI.Comm,
) -> EnsembleIO:
    """Collective: the ensemble-I/O object of ``io.mode`` for these member files.

    Parameters
    ----------
    paths : sequence of Path
        The member files, in matrix order (``config.member_paths()``).
    layout : StateLayout or EnsembleSection
        A ready layout, or the ``ensemble`` section to build it from member 1.
    io : IOSection
    comm : MPI.Comm
        The filter communicator (``MPI.COMM_SELF`` for a serial run).
    """
    if io.mode not in ENSEMBLE_IO:
        raise ConfigError(f"io.mode: {io.mode} reads tiled members only ({{tile}} in "
                          "ensemble.members)")  # fmt: skip
    return ENSEMBLE_IO[io.mode](paths, layout, io, comm)


def read_ensemble(
    config: Config, comm: MPI.Comm, *, out: EnsembleBlock | None = None, overlap: bool = True
) -> EnsembleBlock:
    """Collective: read all members of ``config`` once (see :meth:`FileEnsembleIO.read`)."""
    with open_ensemble(config.member_paths(), config.ensemble, config.io, comm) as ens:
        return ens.read(out, overlap=overlap)


def write_ensemble(
    config: Config, comm: MPI.Comm, block: EnsembleBlock, *, overlap: bool = True
) -> IOStats:
    """Collective: write ``block`` into the members of ``config`` once (in place, journaled)."""
    with open_ensemble(config.member_paths(), config.ensemble, config.io, comm) as ens:
        return ens.write(block, overlap=overlap)
