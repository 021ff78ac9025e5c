"""The registry of ``io.mode``s, the factory of ensemble-I/O objects, one-call wrappers.

An ensemble-I/O object is built once per run from (member paths, the layout
or the ``ensemble`` section, the ``io`` section, the filter communicator) and
then reads the prior into the row-distributed matrix and writes the analysis
back, as often as needed, until it is closed::

    with open_ensemble(config.member_paths(), config.ensemble, config.io, comm) as ens:
        block = ens.read()
        ...
        ens.write(analysis)

Every mode is a subclass of :class:`~ensio.io.modes.base.EnsembleIO`
registered in :data:`ENSEMBLE_IO` by ``io.mode``: ``files`` is
:class:`~ensio.io.modes.files.FileEnsembleIO` (which opens tiled members,
``{tile}``, as :class:`~ensio.io.modes.tiledio.TiledEnsembleIO` itself),
``shuffle`` is :class:`~ensio.io.modes.shuffle.ShuffleEnsembleIO`. The analysis
driver (:func:`ensio.offline.run_analysis`) opens a run through
:func:`mode_of` and the class's hooks, never by asking which mode it has. A
new mode is one module with its class, one entry here and its ``Literal``
value in :data:`ensio.config.schema.IOMode`.

:func:`read_ensemble` / :func:`write_ensemble` build, use and close an object
in one call, for callers that read or write once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mpi4py import MPI

from ...config.errors import ConfigError
from ...config.schema import Config, EnsembleSection, IOSection
from ...layout.block import EnsembleBlock
from ...layout.state import StateLayout
from ..scan.members import MemberMeta
from .base import EnsembleIO
from .files import FileEnsembleIO
from .shuffle import ShuffleEnsembleIO
from .stats import IOStats

__all__ = ["ENSEMBLE_IO", "EnsembleIO", "IOStats", "mode_of", "open_ensemble",
           "read_ensemble", "write_ensemble"]


#: ``io.mode`` → its class (tiled or not is the class's own choice, :meth:`EnsembleIO.open_run`).
ENSEMBLE_IO: dict[str, type[EnsembleIO]] = {"files": FileEnsembleIO,
                                          "shuffle": ShuffleEnsembleIO}


def mode_of(io: IOSection) -> type[EnsembleIO]:
    """The class registered for ``io.mode`` (a ConfigError naming the key if none is)."""
    try:
        return ENSEMBLE_IO[io.mode]
    except KeyError:
        raise ConfigError(f"io.mode: unknown mode {io.mode!r} (one of "
                          f"{', '.join(sorted(ENSEMBLE_IO))})") from None


def open_ensemble(
    paths: Sequence[Path],
    layout: StateLayout | EnsembleSection,
    io: IOSection,
    comm: MPI.Comm,
    *,
    private: bool = False,
    copies_of: Sequence[MemberMeta] | None = None,
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
    private : bool
        The files are the run's staged copies, renamed into place by its commit:
        library-path writes go straight into them
        (:class:`~ensio.io.modes.files.FileEnsembleIO`).
    copies_of : sequence of MemberMeta, optional
        The files are byte copies, just made, of files a scan checked, with this
        metadata: not checked again.
    """
    return mode_of(io).from_paths(paths, layout, io, comm, private=private,
                                  copies_of=copies_of)


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
