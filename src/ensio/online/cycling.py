"""The run-directory side of a coupled model program (``ensio cycle --mode online``).

``ensio cycle CONFIG --mode online`` writes the analysis config of every cycle
it will run (``DIR/cycle_CCC/analysis.yaml``, the same file the offline
driver writes) and starts ``mpiexec -n N_e*P`` with ``workflow.online.command``.
That program builds a :class:`CoupledRun` and, per cycle, integrates its
member and calls :meth:`CoupledRun.assimilate` (the examples:
:mod:`ensio.models.l96_coupled`, :mod:`ensio.models.synthetic_coupled`; their
command-line arguments, the placeholders of ``workflow.online.command``, are
parsed in :mod:`ensio.cli.model`)::

    run = CoupledRun(workdir, MPI.COMM_WORLD, first=first, last=cycles,
                     initial=initial, tasks_per_member=P)
    x = my_model.read(run.initial_path)[run.rows]
    for cycle in run.cycles():
        x = my_model.forecast(x)                 # on ens.model_comm
        x = run.assimilate(cycle, x)
    run.close()

:class:`CoupledRun` keeps the offline layout so one example runs either way
and a run can even switch modes between cycles: the analysis members (and
``mean.nc``/``spread.nc``) land in ``DIR/cycle_CCC/analysis/``, a cycle is
complete when ``DIR/cycle_CCC/.done`` exists (written by world rank 0 after
the filter wrote every file), and every cycle appends the same kind of
records to ``DIR/records.jsonl`` as the job pool does (one ``member`` record
per member, one ``analysis`` record), so ``ensio report`` and ``ensio bench
modes`` treat both modes alike. A rerun of ``ensio cycle`` starts from the
analysis of the last complete cycle: nothing is lost but the cycle in flight.

Records of the online mode: a member record spans the member's forecast
(``started`` = the cycle's start on that member — for the job's first cycle
the start of the job's processes —, ``ended`` = its call of
:meth:`assimilate`); its ``io_seconds`` are what the model reports with
:meth:`CoupledRun.add_io` (as an offline member task reports through
``ENSIO_REPORT``). The analysis record spans the
coupled call on filter rank 0 (gather, analysis, writing the analysis files,
scatter); its ``io_seconds`` are the filter's file writes. ``submitted`` is
the job's submission (``ENSIO_SUBMITTED``, set by the driver) for the job's
first cycle and the end of the previous cycle for later ones: a coupled job
queues once.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config import load_config
from ..config.schema import Config
from ..errors import EnsioError
from ..parallel.agree import root_call
from ..workflow.records import append_record
from ..workflow.rundir import (
    analysis_config_path,
    done_marker,
    forecast_pattern,
    restart_pattern,
)
from .ensemble import Ensemble, OnlineReport

__all__ = [
    "CoupledRun",
    "print_reports",
    "process_start_time",
]


def process_start_time() -> float:
    """When this process started (epoch seconds; Linux ``/proc``, else now).

    The first cycle of a coupled job starts when its processes do, not after
    the imports and the set-up of the coupled communicators, which belong to
    the job's running time like any model's start-up.
    """
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])  # 10 ms resolution
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def _env_float(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


class CoupledRun:
    """Collective over ``world``: cycles ``first..last`` of a coupled job in ``workdir``.

    Parameters
    ----------
    workdir : Path
        The run directory; ``cycle_CCC/analysis.yaml`` must exist for every
        cycle to run (``ensio cycle --mode online`` writes them).
    world : MPI.Comm
        N_e × P ranks, member after member.
    first, last : int
        The cycles to run.
    initial : str
        Pattern (``{member}``) of the restarts cycle ``first`` starts from;
        relative patterns are resolved against ``workdir``.
    tasks_per_member : int
        P.
    timeout : float, optional
        Hang guard of every coupled call (:class:`~ensio.online.Ensemble`);
        default: ``workflow.online.timeout``, which the driver passes as
        ``ENSIO_ONLINE_TIMEOUT``.
    forecast_files : bool
        Whether the program writes the forecast files of the offline layout
        (``cycle_CCC/forecast/memMMM.nc``, :meth:`forecast_path`) before
        each :meth:`assimilate`. Analysis member m is written as a copy of
        its forecast file with the state replaced; without forecast files it
        is a copy of the restart member m started the cycle from (its
        initial file, then its previous analysis), which carries the same
        auxiliary variables when the model does not change them.

    Attributes
    ----------
    ens : Ensemble
        The coupled ensemble (``member``, ``model_comm``, ``rows`` …).
    initial_path : Path
        This member's restart of cycle ``first``.
    """

    def __init__(
        self,
        workdir: Path | str,
        world: MPI.Comm,
        *,
        first: int,
        last: int,
        initial: str,
        tasks_per_member: int = 1,
        timeout: float | None = None,
        forecast_files: bool = True,
    ) -> None:
        if not 1 <= first <= last:
            raise EnsioError(f"cycles: need 1 <= first <= last, got {first}..{last}")
        self.workdir = Path(workdir).resolve()
        self.world = world
        self.first, self.last = first, last
        if timeout is None:
            timeout = _env_float("ENSIO_ONLINE_TIMEOUT")
        pattern = initial if Path(initial).is_absolute() else str(self.workdir / initial)
        self.configs: dict[int, Config] = root_call(world, self._load_configs)
        if not forecast_files:
            for c in self.configs:
                restart = pattern if c == first else restart_pattern(self.workdir, c, initial)
                cfg = self.configs[c]
                self.configs[c] = dataclasses.replace(
                    cfg, ensemble=dataclasses.replace(cfg.ensemble, members=restart))
        self.ens = Ensemble(
            self.configs[first], world, tasks_per_member=tasks_per_member, timeout=timeout,
            template=Path(pattern.format(member=1)),
        )  # fmt: skip
        self.initial_path = Path(pattern.format(member=self.ens.member))
        self.job = (os.environ.get("ENSIO_JOB_ID") or os.environ.get("SLURM_JOB_ID")
                    or f"online-{os.getpid()}")
        self.host = socket.gethostname()
        self._submitted = _env_float("ENSIO_SUBMITTED")
        self._job_start = float(world.allreduce(process_start_time(), op=MPI.MIN))
        self._start: float | None = None
        self._io = 0.0
        self.reports: list[OnlineReport] = []

    def _load_configs(self) -> dict[int, Config]:
        out = {}
        for c in range(self.first, self.last + 1):
            path = analysis_config_path(self.workdir, c)
            if not path.exists():
                raise EnsioError(
                    f"{path}: missing; start coupled programs with "
                    "`ensio cycle CONFIG --mode online`, which writes it"
                )
            out[c] = load_config(path)
        return out

    # ------------------------------------------------------------ accessors

    @property
    def member(self) -> int:
        """1-based member of this rank."""
        return self.ens.member

    @property
    def rows(self) -> slice:
        """This model rank's rows of the state vector."""
        return self.ens.rows

    def config(self, cycle: int) -> Config:
        """The analysis config of ``cycle``."""
        return self.configs[cycle]

    def forecast_path(self, cycle: int) -> Path:
        """Where the offline mode keeps this member's forecast of ``cycle``."""
        return Path(forecast_pattern(self.workdir, cycle).format(member=self.member))

    # --------------------------------------------------------------- cycles

    def cycles(self) -> Iterator[int]:
        """The cycle numbers; marks each cycle's start on this rank."""
        for c in range(self.first, self.last + 1):
            self._start = self._job_start if c == self.first else time.time()
            yield c

    def add_io(self, seconds: float) -> None:
        """Count ``seconds`` of file I/O of this member in the current cycle."""
        self._io += seconds

    def assimilate(self, cycle: int, block: np.ndarray) -> np.ndarray:
        """Collective: the analysis of this rank's ``block`` for ``cycle``, with records.

        Also writes ``cycle_CCC/.done`` (world rank 0) once the filter has
        written every analysis file of the cycle.
        """
        start = self._start if self._start is not None else time.time()
        submitted = self._submitted if cycle == self.first else start
        ended = time.time()
        xa = self.ens.assimilate(block, cycle=cycle, config=self.configs[cycle])
        report = self.ens.last
        assert report is not None
        self.reports.append(report)
        # records only for a cycle whose analysis is complete: a lost cycle is
        # redone by the rerun and must not be counted twice
        records = self.workdir / "records.jsonl"
        if self.ens.model_rank == 0:
            append_record(records, {
                "kind": "member", "task": f"mem{self.member:03d}", "member": self.member,
                "cycle": cycle, "job": self.job, "host": self.host, "owner": self.job,
                "submitted": submitted, "started": start, "ended": ended, "finished": ended,
                "status": "done", "exit": 0, "io_seconds": self._io, "attempt": 1,
                "mode": "online",
            })  # fmt: skip
        if self.world.rank == 0:
            s = report.seconds
            done = time.time()
            append_record(records, {
                "kind": "analysis", "task": "analysis", "member": None, "cycle": cycle,
                "job": self.job, "host": self.host, "owner": self.job,
                "submitted": submitted, "started": ended, "ended": done, "finished": done,
                "status": "done", "exit": 0,
                "io_seconds": s.get("write", 0.0) + s.get("products", 0.0), "attempt": 1,
                "mode": "online", "seconds": s,
            })  # fmt: skip
            done_marker(self.workdir, cycle).write_text("")
        self._io = 0.0
        self._start = None
        return xa

    def close(self) -> None:
        """Collective: release the coupled communicators."""
        self.ens.close()


def print_reports(world: MPI.Comm, reports: list[OnlineReport]) -> None:
    """One line per cycle on world rank 0: innovation statistics and time."""
    if world.rank != 0:
        return
    for r in reports:
        print(f"cycle {r.cycle}: prior rms {r.prior.rms:.4g}  posterior rms "
              f"{r.posterior.rms:.4g}  accepted {r.qc.accepted}  "
              f"total {r.seconds['total']:.3f} s", flush=True)
