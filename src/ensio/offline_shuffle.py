"""The offline analysis in ``io.mode: shuffle``: local tiles in, the analysis in place.

:func:`ensio.offline.run_analysis` hands a shuffle configuration here. The
member files are on node-local disks, so what ``files`` mode keeps next to
the global member files does not apply: there is no ensemble lock and no run
record on the global file system (a rerun analyses again), and products
(``output.mean``/``spread``) are refused as for every tiled run. The write
is all or nothing over every rank, with one undo journal per local directory
(:class:`~ensio.io.shuffle.ShuffleEnsembleIO`); ``ensio recover LOCAL_DIR``
undoes an interrupted one. With ``io.backup_dir`` the local files are then
copied there in the background (:func:`ensio.io.backup.start_cycle_backup`),
as after a ``files`` analysis. A 4-D analysis (``analysis.time_slots``) is not
supported on row sets yet and is refused before anything is read.
"""

from __future__ import annotations

import time

from mpi4py import MPI

from .analysis.inputs import assimilate_block, observation_sources
from .config.schema import Config, ConfigError
from .errors import file_op
from .io.backup import start_cycle_backup
from .io.shuffle import ShuffleEnsembleIO
from .io.tiled import check_tiled_run
from .offline import AnalysisReport
from .progress import PhaseProgress

__all__ = ["run_shuffle_analysis"]


def run_shuffle_analysis(
    config: Config, comm: MPI.Comm, *, cycle: int = 0, progress: PhaseProgress | None = None
) -> AnalysisReport:
    """Collective: read the local tiles, shuffle, analyse the row sets, shuffle back, write."""
    assert config.analysis is not None
    check_tiled_run(config)
    if config.analysis.time_slots is not None:
        raise ConfigError("analysis.time_slots: not supported with io.mode shuffle yet; "
                          "use io.mode files for a 4-D analysis")
    bars = progress or PhaseProgress(enabled=False)
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    obs = observation_sources(config.observations, config.resolve)
    n_e = config.ensemble.size
    with file_op("open"):
        ens = ShuffleEnsembleIO(config.ensemble, config.base_dir, config.io, comm)
    with ens:
        with file_op("read"), bars.phase("read", n_e, "members") as advance:
            block = ens.read(progress=advance)
        seconds["read"] = time.perf_counter() - t0
        flags = block.count_by_variable(block.inactive_rows())
        comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.SUM)
        inactive = {v.name: int(n) for v, n in zip(block.layout.variables, flags, strict=True)}
        with bars.phase("analysis"):
            result = assimilate_block(block, obs, config.analysis, comm, cycle=cycle,
                                      seconds=seconds)  # fmt: skip
        t = time.perf_counter()
        with file_op("write"), bars.phase("write", n_e, "members") as advance:
            ens.write(block.like(result.ensemble), progress=advance)
        seconds["write"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    seconds = {k: float(comm.allreduce(v, op=MPI.MAX)) for k, v in seconds.items()}
    # written and journal committed: copy the local files to io.backup_dir in the background
    backup = start_cycle_backup(config, comm, cycle) if config.io.backup_dir else None
    assert result.qc is not None
    return AnalysisReport(result=result, seconds=seconds, n_obs_read=result.qc.total,
                          inactive=inactive, backup=backup)
