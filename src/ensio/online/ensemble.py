"""The model side of the online mode: ``ens = Ensemble(config, comm, tasks_per_member=P)``.

A coupled job runs N_e × P ranks: every member's model on its own P ranks,
and the filter on the P ranks of member 1 (the seed paper's Fig. 2,
:meth:`ensio.parallel.comms.CommGroups.online`). After integrating its member,
each model rank calls ``xa = ens.assimilate(block)`` with its contiguous block
of the member's state vector (rows ``ens.rows``); the blocks travel along the
coupled communicators to the filter, which runs the analysis of
``ensio analyse`` (:mod:`ensio.online.filter`), and each model rank gets its
analysis block back::

    from mpi4py import MPI
    import ensio.online

    with ensio.online.Ensemble(config, MPI.COMM_WORLD, tasks_per_member=P) as ens:
        x = my_model.initial_state(member=ens.member, comm=ens.model_comm)  # rows ens.rows
        for cycle in range(1, K + 1):
            x = my_model.forecast(x)
            x = ens.assimilate(x, cycle=cycle)

One call of :meth:`Ensemble.assimilate`, on every rank:

1. *Check* (one allgather over the world): every rank reports whether its
   block has the expected length and is finite; if any does not, every rank
   raises the same :class:`OnlineError`, naming the members and model ranks,
   before any data moves. (Different P between ranks is caught when the
   Ensemble is built.)
2. *Gather* along coupled communicator p to filter rank p:
   ``(N_e, count_p)``, member-major, member order = coupled rank = member.
3. *Filter* (filter ranks): :func:`ensio.online.filter.run_filter`.
4. *Status* (one allreduce over the world): the lowest failing filter rank,
   if any; its error is then raised on every rank.
5. *Scatter* the analysis rows back along the coupled communicators.

Failures that happen on some ranks only (a member's model raises or exits
early, a filter rank fails inside a collective, an optional ``timeout``
expires) abort the job with a message naming the member
(:mod:`ensio.online.failure`); build the Ensemble before the model's own
start-up, so that its exception hook covers it.
"""

from __future__ import annotations

import atexit
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np
from mpi4py import MPI

from ..analysis.filters import InnovationStats
from ..config.schema import Config, ConfigError
from ..errors import EnsioError
from ..layout.state import StateLayout
from ..obs import QCCounts
from ..parallel.agree import ErrorNote, note_error, rebuild
from ..parallel.comms import CommGroups
from ..parallel.distribution import block_distribution
from .failure import FailurePolicy, is_agreed, mark_agreed

__all__ = ["Ensemble", "OnlineError", "OnlineReport"]

#: How many offending ranks a mismatch message lists.
_SHOW = 4


class OnlineError(EnsioError):
    """A coupled call that cannot proceed (raised on every rank, same message)."""


@dataclass(frozen=True)
class OnlineReport:
    """What one :meth:`Ensemble.assimilate` did (the same on every rank).

    Attributes
    ----------
    cycle : int
    qc : QCCounts
    prior, posterior : InnovationStats
    seconds : dict
        ``wait`` (this rank, until every rank had arrived), ``gather``,
        ``obs``, ``analysis``, ``write``, ``products`` (filter, maximum over
        filter ranks), ``scatter`` and ``total`` (this rank).
    """

    cycle: int
    qc: QCCounts
    prior: InnovationStats
    posterior: InnovationStats
    seconds: dict[str, float] = field(default_factory=dict)


class Ensemble:
    """One rank's handle on a coupled ensemble (collective constructor over ``comm``).

    Parameters
    ----------
    config : Config
        As for ``ensio analyse``: ``ensemble`` (size N_e, variables),
        ``observations``, ``analysis``, ``io`` and ``output``. With
        ``io.in_place: false`` the filter writes the analysis members at
        ``output.members``; ``output.mean``/``output.spread`` are written
        when set. With ``io.in_place: true`` no member file is written (the
        analysis lives in the models).
    comm : MPI.Comm
        The world of the coupled job: N_e × P ranks, member after member.
    tasks_per_member : int
        P, the number of model ranks of every member.
    layout : StateLayout, optional
        The state layout, for models without files. Default: built by world
        rank 0 from ``template``.
    template : Path, optional
        A member-shaped file: the layout comes from it (unless ``layout`` is
        given), and it is the structure of the product files and of analysis
        members that have no member file of their own. Default: member 1 of
        ``ensemble.members`` (which must then exist when the Ensemble is built).
    timeout : float, optional
        Seconds a rank may spend in one :meth:`assimilate` call (waiting for
        the slowest member included) before it aborts the job; ``None``
        (default): no bound. A guard against hung members, not a schedule.
    agree_timeout : float
        Seconds a filter rank that failed waits for the other filter ranks to
        report before it aborts the job (they never report if the failure
        happened inside a collective of the analysis).
    agree_timeout : float
        Also bounds the exit check (``abort_on_exception``).
    abort_on_exception : bool
        Install ``sys.excepthook`` so that an uncaught exception on one rank
        (e.g. in the model code) aborts the whole job with a message naming
        the member instead of leaving the other ranks waiting; and an exit
        check (``atexit``): a process that ends without :meth:`close` (e.g.
        ``sys.exit`` in one member) waits at most ``agree_timeout`` for all
        other ranks to end too, else aborts the job naming its member. So end
        a coupled program with :meth:`close` or use ``with Ensemble(...)``.

    Attributes
    ----------
    member : int
        1-based member number of this rank.
    model_comm : MPI.Comm
        This member's P ranks (rank = model rank p).
    rows : slice
        This model rank's rows of the state vector,
        ``block_distribution(N_x, P, p)``: the same block in every member,
        and the rows filter rank p owns.
    layout : StateLayout or None
        On filter ranks (and wherever it was passed in).
    last : OnlineReport or None
        Report of the last :meth:`assimilate`.
    """

    def __init__(
        self,
        config: Config,
        comm: MPI.Comm,
        tasks_per_member: int = 1,
        *,
        layout: StateLayout | None = None,
        template: Path | str | None = None,
        timeout: float | None = None,
        agree_timeout: float = 60.0,
        abort_on_exception: bool = True,
    ) -> None:
        self.config = config
        self.groups = CommGroups.online(comm, tasks_per_member)
        g = self.groups
        self.world = comm
        self.tasks_per_member = g.tasks_per_member or 1
        self.n_members = g.n_members
        self.member = g.member_index + 1
        assert g.model is not None and g.coupled is not None
        self.model_comm: MPI.Comm = g.model
        self.coupled_comm: MPI.Comm = g.coupled
        self.model_rank = self.model_comm.rank
        self.timeout = timeout
        self.agree_timeout = agree_timeout
        self.last: OnlineReport | None = None
        self._filter_error: BaseException | None = None
        self.template = Path(template) if template is not None else config.member_paths()[0]
        if config.ensemble.size != self.n_members:
            g.free()
            raise ConfigError(
                f"ensemble.size: {config.ensemble.size} members configured, but the job has "
                f"{comm.size} ranks = {self.n_members} members × P = {self.tasks_per_member}; "
                f"start {config.ensemble.size * self.tasks_per_member} ranks"
            )
        try:
            self.layout, self.n_rows = self._share_layout(layout)
        except Exception:
            g.free()
            raise
        self.start, self.count = block_distribution(
            self.n_rows, self.tasks_per_member, self.model_rank
        )
        self.rows = slice(self.start, self.start + self.count)
        self.failure = FailurePolicy(comm, f"member {self.member}")
        self._closed = False
        if abort_on_exception:
            self.failure.install_excepthook()
            atexit.register(self._at_exit)

    # ---------------------------------------------------------------- set-up

    def _share_layout(self, given: StateLayout | None) -> tuple[StateLayout | None, int]:
        """Collective: N_x everywhere, the layout on filter ranks (built once, on world rank 0)."""
        world, filt = self.world, self.groups.filter
        if given is not None:
            sizes = world.allgather(given.n_rows)
            if len(set(sizes)) != 1:
                bad = sorted({(s, r // self.tasks_per_member + 1) for r, s in enumerate(sizes)})
                raise mark_agreed(
                    OnlineError(
                        "layout: members disagree on the state length N_x: "
                        + ", ".join(f"member {m}: {s}" for s, m in bad[: 2 * _SHOW])
                    )
                )
            return given, sizes[0]

        def build() -> StateLayout:
            from ..io.scan.members import layout_from_member

            if not self.template.exists():
                raise ConfigError(
                    f"ensemble.members: {self.template} (member 1, the layout template) does "
                    "not exist; write it before building the Ensemble, or pass template= "
                    "or layout="
                )
            return layout_from_member(self.config.ensemble, self.template)

        layout = None
        note: ErrorNote = None
        if world.rank == 0:
            try:
                layout = build()
            except Exception as exc:
                note = note_error(exc)
        n_rows, note = world.bcast((layout.n_rows if layout is not None else 0, note), root=0)
        if note is not None:
            raise _rebuild(note)
        if self.groups.is_filter:
            layout = filt.bcast(layout, root=0)  # world rank 0 is filter rank 0
        return layout, n_rows

    @property
    def is_filter(self) -> bool:
        """Whether this rank is a filter rank (model rank p of member 1 is filter rank p)."""
        return self.groups.is_filter

    # ------------------------------------------------------------- assimilate

    def assimilate(
        self, block: np.ndarray, *, cycle: int = 0, config: Config | None = None
    ) -> np.ndarray:
        """Collective over the world: the analysis of this rank's block.

        Parameters
        ----------
        block : array_like, shape (count,)
            This model rank's rows ``ens.rows`` of its member's forecast
            (converted to float64).
        cycle : int
            Cycle number; keys the random streams as ``ensio analyse --cycle``.
        config : Config, optional
            The config of this cycle (e.g. its observation files and output
            paths); default: the Ensemble's. Its ``ensemble.size`` and
            variables must be the Ensemble's.

        Returns
        -------
        ndarray, shape (count,)
            This rank's rows of its member's analysis.

        Raises
        ------
        OnlineError
            On every rank, before any data moves, if any rank's block has the
            wrong length or non-finite values.
        Exception
            On every rank, the error of the lowest failing filter rank (e.g.
            :class:`~ensio.errors.InputError` for a bad observation file).
        """
        cfg = self.config if config is None else config
        t0 = time.perf_counter()
        with self.failure.deadline(
            self.timeout,
            lambda: f"assimilate of cycle {cycle} did not finish (a member or the filter hangs)",
        ):
            x = self._check(block, cfg)
            seconds = {"wait": time.perf_counter() - t0}
            t = time.perf_counter()
            prior = np.empty((self.n_members, self.count)) if self.is_filter else None
            self.coupled_comm.Gather(x, prior, root=0)
            seconds["gather"] = time.perf_counter() - t
            result, note, filter_seconds = None, None, {}
            if self.is_filter:
                result, note, filter_seconds = self._filter(cfg, prior, cycle)
            self._status(note, cycle)
            # filter rank p → its coupled ranks: the statistics, then the analysis rows
            stats = (result.qc, result.prior, result.posterior) if result is not None else None
            (qc, prior_stats, posterior_stats), filter_seconds = self.coupled_comm.bcast(
                (stats, filter_seconds), root=0
            )
            t = time.perf_counter()
            xa = np.empty(self.count)
            send = np.ascontiguousarray(result.ensemble) if result is not None else None
            self.coupled_comm.Scatter(send, xa, root=0)
            seconds["scatter"] = time.perf_counter() - t
        seconds.update(filter_seconds)
        seconds["total"] = time.perf_counter() - t0
        self.last = OnlineReport(cycle, qc, prior_stats, posterior_stats, seconds)
        return xa

    def _check(self, block: np.ndarray, cfg: Config) -> np.ndarray:
        """Collective over the world: this rank's block as float64, or the same error everywhere."""
        problem = None
        x = np.empty(self.count)
        try:
            arr = np.asarray(block)
            if arr.ndim != 1 or arr.size != self.count:
                problem = (
                    f"passed a block of shape {arr.shape}, expected ({self.count},) "
                    f"(rows [{self.start}, {self.start + self.count}) of N_x = {self.n_rows} "
                    f"over P = {self.tasks_per_member} model ranks)"
                )
            elif not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
                problem = f"passed a block of dtype {arr.dtype}, expected real numbers"
            else:
                x[...] = arr
                bad = int(np.count_nonzero(~np.isfinite(x)))
                if bad:
                    problem = f"passed a block with {bad} non-finite values"
        except Exception as exc:
            problem = f"passed an unusable block ({type(exc).__name__}: {exc})"
        if problem is None and cfg.ensemble.size != self.n_members:
            problem = (
                f"passed a config with ensemble.size = {cfg.ensemble.size}, but the job "
                f"couples {self.n_members} members"
            )
        if problem is None and cfg.ensemble.variables != self.config.ensemble.variables:
            problem = "passed a config whose ensemble.variables differ from the Ensemble's"
        reports = self.world.allgather(problem)
        bad = [(r, p) for r, p in enumerate(reports) if p is not None]
        if bad:
            lines = [
                f"member {r // self.tasks_per_member + 1} model rank "
                f"{r % self.tasks_per_member} {p}"
                for r, p in bad[:_SHOW]
            ]
            more = f"; and {len(bad) - _SHOW} more ranks" if len(bad) > _SHOW else ""
            raise mark_agreed(
                OnlineError("ensio online: assimilate refused: " + "; ".join(lines) + more)
            )
        return x

    def _filter(self, cfg: Config, prior: np.ndarray | None, cycle: int):
        """Filter ranks: run the analysis, catching its error to report it to every rank."""
        from .filter import run_filter

        assert prior is not None and self.layout is not None
        try:
            result, seconds = run_filter(
                cfg,
                self.groups.filter,
                self.layout,
                self.start,
                prior,
                cycle=cycle,
                template=self.template if self.template.exists() else None,
            )
        except Exception as exc:
            self._filter_error = exc
            return None, note_error(exc), {}
        return result, None, seconds

    def _status(self, note: ErrorNote, cycle: int) -> None:
        """Collective over the world: raise the lowest failing filter rank's error everywhere.

        A filter rank that failed waits at most ``agree_timeout`` for the
        others: if its error happened inside a collective of the analysis,
        the other filter ranks never get here, and it aborts the job instead.
        """
        world = self.world
        mine = np.array([world.rank if note is not None else world.size], dtype=np.int64)
        lowest = np.empty_like(mine)
        request = world.Iallreduce(mine, lowest, op=MPI.MIN)
        if note is None:
            request.Wait()
        else:
            failure = FailurePolicy(world, f"filter rank {self.groups.filter.rank} (member 1)")
            with failure.deadline(
                self.agree_timeout,
                lambda: (
                    f"{note[0].__name__}: {note[1]} (in the analysis of cycle {cycle}; the "
                    "other filter ranks did not report it, so it cannot be raised everywhere)"
                ),
                verb="failed",
                exc=self._filter_error,
            ):
                request.Wait()
            self._filter_error = None
        root = int(lowest[0])
        if root < world.size:
            raise _rebuild(world.bcast(note, root=root))

    # -------------------------------------------------------------- failures

    def guard(self):
        """Context: if the body raises on this rank, abort the whole job naming the member.

        Errors ensio raised on every rank (:class:`OnlineError`, filter
        errors) pass through unchanged. Use it around the model code when
        the exception hook is not enough (e.g. the model catches exceptions
        at its top level)::

            with ens.guard():
                x = model.step(x)
        """
        return self.failure.guard()

    def close(self) -> None:
        """Collective: free the communicators, remove the exception hook and exit check."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self.failure.remove_excepthook()
        self.groups.free()

    def _at_exit(self) -> None:
        """The process ends without :meth:`close`: end the job unless every rank ends too.

        Runs before mpi4py's ``MPI_Finalize`` (``atexit`` is last in, first
        out). A non-blocking barrier on the status communicator (a duplicate
        of the world, so it cannot be matched with a collective other ranks
        may be blocked in) completes at once when all ranks end together,
        e.g. after an error raised on every rank; if some ranks are still
        waiting in :meth:`assimilate` for this member, it never completes and
        the job is aborted after ``agree_timeout``.
        """
        if self._closed:
            return
        status = self.groups.status
        assert status is not None
        request = status.Ibarrier()
        with self.failure.deadline(
            self.agree_timeout,
            lambda: (
                "the process ended while other ranks are still in the coupled job "
                "(sys.exit or an early return in the model?)"
            ),
            verb="exited early",
        ):
            request.Wait()

    def __enter__(self) -> Ensemble:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            self.close()
        elif not is_agreed(exc):
            self.failure.abort_for(exc)
        return False


def _rebuild(note: tuple[type[BaseException], str]) -> BaseException:
    """The exception of a shared note, marked as raised on every rank."""
    return mark_agreed(rebuild(note, fallback=OnlineError))
