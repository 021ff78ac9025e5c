"""The post-processing graph: sources -> expressions, ``@`` chains, time operations -> records.

Built once from the resolved config for the files one process writes (a server's
share of the files, or every file in attached/sync mode). The model pushes the
complete data of its *source* fields step by step; :meth:`Graph.advance` runs the
graph over the steps every client has finished and returns the records of the
output periods that are complete. Everything is point-wise in space, so the same
graph runs on global arrays (servers) or on a rank's part (attached mode) — the
spatial operations (box, global and zonal means) are the writer's business.

This module builds the graph (one node per source, expression and ``@`` pair, shared
between consumers) and runs it; what each node computes — sources, expressions,
``@`` reductions and file outputs — is in :mod:`.graphnodes`. Streams are
evaluated step by step with a per-step memo (each node once a step); memory is the
pushed data of the steps not yet advanced plus one accumulator per output/``@`` node
and open period. The ``is_active`` rule follows from the same structure: a source
is needed at step ``n`` if some path from an output to it has all its sampling grids
on ``n`` (:meth:`Graph.needs`); ``instant`` keeps the sample at its period's end
only, so it asks for those steps alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ..config.errors import ConfigError
from .calendar import STEP, Calendar, Freq
from .config import FieldDef, FileDef, IOServerConfig
from .graphnodes import AtNode, ExprNode, Node, Output, Record, Sampling, SourceNode, Step

__all__ = ["Graph"]


class Graph:
    """The post-processing graph of the files one process writes.

    Parameters
    ----------
    cfg : IOServerConfig
        The resolved config.
    files : sequence of str, optional
        Ids of the files this process writes (None = every enabled file); disabled
        files and disabled file fields among them are skipped.
    points : mapping of str to tuple of int, optional
        Field shape per grid id: global shapes by default; the attached mode passes
        the shapes of the rank's part. Every grid the graph uses must be given.
    first_step : int, optional
        The model's first step (a run restarted at step 8761 of the same calendar):
        output periods start with the one that contains it, instead of empty
        records for every period before it.

    Attributes
    ----------
    calendar : Calendar
    sources : dict of str to tuple of frozenset of Sampling
        Source field id -> the sampling conditions under which this graph uses it:
        needed at step ``n`` iff for some condition ``n`` is a sample of all its
        grids (an empty condition: every step). Sources no output uses are absent.

    Raises
    ------
    ConfigError
        An unknown file id, a grid missing from ``points``, an expression that
        does not parse (message naming the field).
    """

    def __init__(self, cfg: IOServerConfig, files: Sequence[str] | None = None,
                 points: Mapping[str, tuple[int, ...]] | None = None, *, first_step: int = 1):
        self.cfg = cfg
        self.calendar = Calendar(cfg.calendar)
        self._points = points
        self._nodes: dict[tuple[str, ...], Node] = {}
        self._ats: list[AtNode] = []
        self._outputs: list[Output] = []
        for file in self._select(files):
            for fd in file.fields:
                if fd.enabled:
                    self._outputs.append(Output(file, fd, self._file_stream(fd),
                                                self.calendar))
        self.sources = self._requirements()
        self._pending: dict[int, dict[str, np.ndarray]] = {}
        if first_step < 1:
            raise ValueError(f"first_step: steps are 1-based, got {first_step}")
        self._done = first_step - 1
        for out in self._outputs:
            out.next_period = self.calendar.period_index(out.out_freq, first_step)
        self._finished = False

    # ------------------------------------------------------------------ building

    def _select(self, files: Sequence[str] | None) -> list[FileDef]:
        if files is None:
            return list(self.cfg.enabled_files)
        by_id = {f.id: f for f in self.cfg.files}
        for fid in files:
            if fid not in by_id:
                raise ConfigError(f"ioserver.files: no file {fid!r} (have {sorted(by_id)})")
        wanted = set(files)
        return [f for f in self.cfg.files if f.id in wanted and f.enabled]

    def _shape(self, fd: FieldDef) -> tuple[int, ...]:
        if self._points is None:
            return self.cfg.grid_shape(fd.grid)
        if fd.grid not in self._points:
            raise ConfigError(f"ioserver field {fd.id}: no point shape given for grid {fd.grid!r}")
        return tuple(int(n) for n in self._points[fd.grid])

    def _file_stream(self, fd: FieldDef) -> Node:
        if fd.expr is not None:
            return self._expr(fd, ())
        return self._def_stream(fd.field_ref, ())

    def _def_stream(self, fid: str, stack: tuple[str, ...]) -> Node:
        """The instant data of definition field ``fid``: its expr, its reference, or itself."""
        if fid in stack:  # the config rejects cycles; this keeps a bug from recursing forever
            raise ConfigError(f"ioserver field {fid}: reference cycle {' -> '.join(stack)}")
        fd = self.cfg.fields[fid]
        if fd.expr is not None:
            return self._expr(fd, (*stack, fid))
        if fd.field_ref is not None:
            return self._def_stream(fd.field_ref, (*stack, fid))
        key = ("src", fid)
        if key not in self._nodes:
            self._nodes[key] = SourceNode(fd, self._shape(fd))
        return self._nodes[key]

    def _expr(self, fd: FieldDef, stack: tuple[str, ...]) -> Node:
        key = ("expr", fd.id)
        if key in self._nodes:
            return self._nodes[key]
        node = ExprNode(fd, self._shape(fd))
        for name in sorted(node.expr.names()):
            node.refs[name] = self._def_stream(name, stack)
        for name in sorted(node.expr.at_names()):
            node.ats[name] = self._at(name, node.freq, stack)
        self._nodes[key] = node
        return node

    def _at(self, fid: str, freq: Freq, stack: tuple[str, ...]) -> AtNode:
        key = ("at", fid, str(freq))
        if key not in self._nodes:
            target = self._def_stream(fid, stack)
            node = AtNode(self.cfg.fields[fid], target, freq, self.calendar)
            self._nodes[key] = node
            self._ats.append(node)
        return self._nodes[key]

    def _requirements(self) -> dict[str, tuple[frozenset[Sampling], ...]]:
        """Per source, the sampling conditions under which some output reads it."""
        cal = self.calendar
        found: dict[str, set[frozenset[Sampling]]] = {}
        seen: set[tuple[int, frozenset[Sampling]]] = set()

        def require(node: Node, cond: frozenset[Sampling]) -> None:
            cond = frozenset(f for f in cond if not f.every_step(cal))
            if (id(node), cond) in seen:
                return
            seen.add((id(node), cond))
            if isinstance(node, SourceNode):
                found.setdefault(node.fd.id, set()).add(cond)
            elif isinstance(node, ExprNode):
                inner = cond | {Sampling(node.freq)} if node.ats else cond
                for ref in node.refs.values():
                    require(ref, inner)
                for at in node.ats.values():
                    require(at, inner)
            elif isinstance(node, AtNode):  # the whole period is reduced: every sample counts
                require(node.target, self._sampling(node.fd.operation, node.sampling,
                                                    node.freq))

        for out in self._outputs:
            require(out.stream, self._sampling(out.fd.operation, out.sampling, out.out_freq))
        # A condition that contains another one adds no step: keep the minimal ones.
        return {
            sid: tuple(sorted((c for c in conds if not any(o < c for o in conds)),
                              key=lambda c: sorted(map(str, c))))
            for sid, conds in found.items()
        }

    def _sampling(self, operation: str, freq_op: Sampling, period: Freq
                  ) -> frozenset[Sampling]:
        """The steps whose samples an operation over ``period`` uses.

        Every step of the ``freq_op`` grid, except for ``instant``: it keeps the last
        sample, the one at the period's end when that end is on the grids of the step
        and of ``freq_op`` — then only those steps are needed (6-hourly instant output
        of a 1-hour model asks for one step in six, not all of them). A shifted
        grid (``freq_offset``) is used whole.
        """
        cal = self.calendar
        if (operation == "instant" and freq_op.shift is None and cal.divides(STEP, period)
                and cal.divides(freq_op.freq, period)):
            return frozenset({freq_op, Sampling(period)})
        return frozenset({freq_op})

    # ------------------------------------------------------------------ queries

    def _source(self, field_id: str, what: str) -> FieldDef:
        fd = self.cfg.fields.get(field_id)
        if fd is None:
            raise ValueError(f"{what}: unknown field {field_id!r}")
        if not fd.is_source:
            raise ValueError(f"{what}: field {field_id!r} is computed by the server "
                             f"({'expr' if fd.expr else 'field_ref'}), the model does not send it")
        return fd

    def needs(self, field_id: str, step: int) -> bool:
        """Whether this graph uses source ``field_id`` at ``step`` (the ``is_active`` rule)."""
        self._source(field_id, "is_active")
        cal = self.calendar
        return any(all(f.on(cal, step) for f in cond)
                   for cond in self.sources.get(field_id, ()))

    def period_steps(self, field_id: str) -> tuple[int, ...]:
        """Step periods ``p`` with: needed at step ``n`` iff ``any(n % p == 0)``.

        ``(1,)`` when needed every step, ``()`` when never. A month or year grid is
        not periodic in steps; its boundaries are whole days from the start, so the
        daily grid stands for it: the steps are then a superset of :meth:`needs` (a
        monthly instant field of an hourly model is sent once a day, not every hour).
        A ``freq_offset`` grid is widened the same way (:meth:`Sampling.step_period`).
        """
        self._source(field_id, "period_steps")
        daily = self.calendar.grid_period(Freq(1, "d"))
        periods: set[int] = set()
        for cond in self.sources.get(field_id, ()):
            p = 1
            for f in cond:
                g = f.step_period(self.calendar)
                g = daily if g is None else g
                p = p * g // math.gcd(p, g)
            periods.add(p)
        return tuple(sorted(p for p in periods if not any(q != p and p % q == 0 for q in periods)))

    @property
    def nbytes(self) -> int:
        """Bytes held: pushed data not yet advanced and the open accumulators."""
        pushed = sum(a.nbytes for d in self._pending.values() for a in d.values())
        return (pushed + sum(o.nbytes for o in self._outputs)
                + sum(a.nbytes for at in self._ats for a in at.accs.values()))

    # ------------------------------------------------------------------ running

    def push(self, field_id: str, step: int, data: np.ndarray) -> None:
        """A source field's complete data for ``step`` (NaN and ``missing_value`` = missing).

        The data is copied (float64). Sources this graph does not use are checked
        and dropped.

        Raises
        ------
        ValueError
            Unknown or computed field, wrong shape, a step already advanced, a
            second push of the same field and step (messages name field and step).
        """
        fd = self._source(field_id, "push")
        arr = np.asarray(data)
        if self._points is None:
            expect = self.cfg.grid_shape(fd.grid)
        else:  # a grid no output uses may be absent from the part shapes
            expect = self._points.get(fd.grid)
        if expect is not None and arr.shape != tuple(expect):
            raise ValueError(f"push: field {field_id!r} step {step}: shape {arr.shape}, "
                             f"expected {tuple(expect)} (grid {fd.grid})")
        if self._finished or step <= self._done:
            raise ValueError(f"push: field {field_id!r} step {step}: steps up to "
                             f"{self._done} were already advanced")
        if field_id not in self.sources:
            return
        pending = self._pending.setdefault(step, {})
        if field_id in pending:
            raise ValueError(f"push: field {field_id!r} step {step} pushed twice")
        values = np.array(arr, dtype=np.float64)
        if fd.missing_value is not None:
            # Compare in the sender's precision: 1e20 as float32 is not 1e20 as float64.
            kind = arr.dtype if arr.dtype.kind == "f" else np.float64
            values[arr == np.asarray(fd.missing_value, dtype=kind)] = np.nan
        pending[field_id] = values

    def advance(self, step: int) -> list[Record]:
        """Run the graph over the steps up to ``step``; records of the periods ended by then.

        Every source of every step ``<= step`` must have been pushed (all clients
        are past it). Records come in file order, then field order, then period.
        A step already advanced over returns no record (nothing new is complete).
        """
        if self._finished:
            raise ValueError("advance: the graph was finished")
        if step <= self._done:
            return []
        for n in range(self._done + 1, step + 1):
            st = Step(n, self._pending.pop(n, {}), self.calendar)
            for at in self._ats:
                st.get(at)
            for out in self._outputs:
                out.sample(st)
        self._done = step
        t = self.calendar.time(step)
        records: list[Record] = []
        for out in self._outputs:
            records.extend(out.emit(t, self.calendar))
        return records

    def finish(self, last_step: int) -> list[Record]:
        """Normal end: the records of periods ending at or before ``time(last_step)``.

        The partial last period (and any data pushed for later steps) is dropped.
        """
        records = self.advance(last_step)
        self._pending.clear()
        for out in self._outputs:
            out.drop()
        for at in self._ats:
            at.accs.clear()
        self._finished = True
        return records
