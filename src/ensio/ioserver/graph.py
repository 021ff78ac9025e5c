"""The post-processing graph: sources -> expressions, ``@`` chains, time operations -> records.

Built once from the resolved config for the files one process writes (a server's
share of the files, or every file in attached/sync mode). The model pushes the
complete data of its *source* fields step by step; :meth:`Graph.advance` runs the
graph over the steps every client has finished and returns the records of the
output periods that are complete. Everything is point-wise in space, so the same
graph runs on global arrays (servers) or on a rank's part (attached mode) — the
spatial operations (box, global and zonal means) are the writer's business.

The graph is made of *streams*, things that have a value at some steps:

* a **source** has the value the model pushed at a step (``missing_value`` -> NaN);
* a definition field with ``field_ref`` and no ``expr`` *is* the stream of the field
  it references (its instant data), down to a source;
* an **expression** field is evaluated from the instant values of the fields it
  names and, for ``@X``, from an ``@`` node; an expression with ``@`` has a value
  only at the end of its own ``freq_op`` periods (the reductions are only complete
  there), one without ``@`` wherever its operands have one;
* an ``@`` node ``(X, F)`` reduces X's stream, sampled on X's ``freq_op`` grid, with
  X's operation over the periods of F (the consumer's ``freq_op``); its value
  exists at the end of each period of F. ``@`` nodes nest (``@Y`` where Y is
  ``"@X"``) and are shared by consumers with the same ``freq_op``.

Each file field (an *output*) samples its stream on its ``freq_op`` grid and reduces
the samples with its operation over the file's ``output_freq`` periods. Streams are
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
from dataclasses import dataclass

import cftime
import numpy as np

from ..config.errors import ConfigError
from .calendar import STEP, Calendar, Freq, parse_freq
from .config import FieldDef, FileDef, IOServerConfig
from .expr import parse
from .exprtree import ExprError, evaluate
from .timeops import ACCUMULATORS, Accumulator

__all__ = ["Record", "Graph"]


@dataclass(frozen=True)
class Record:
    """One output period of one file field, ready for the writer.

    Attributes
    ----------
    file_id : str
        The file definition's id.
    field : FieldDef
        The file field (output name, attributes, spatial operation).
    period : int
        Output period index ``k`` (0 for ``once`` fields).
    t0, t1 : cftime.datetime
        Bounds ``(b_k, b_{k+1}]`` of the period (``once``: of the sample's period).
    t_instant : cftime.datetime or None
        Time of the sample kept by ``instant``/``once`` (``t1`` if the period
        had no sample); None for the other operations.
    data : numpy.ndarray
        float64, the field's (part) shape, NaN = missing.
    """

    file_id: str
    field: FieldDef
    period: int
    t0: cftime.datetime
    t1: cftime.datetime
    t_instant: cftime.datetime | None
    data: np.ndarray


# ----------------------------------------------------------------------------- nodes


class _Step:
    """The evaluation of one step: pushed data and a memo of node values."""

    def __init__(self, step: int, pushed: Mapping[str, np.ndarray], cal: Calendar):
        self.step = step
        self.pushed = pushed
        self.cal = cal
        self._memo: dict[int, np.ndarray | None] = {}

    def get(self, node: _Node) -> np.ndarray | None:
        key = id(node)
        if key not in self._memo:
            self._memo[key] = node.value(self)
        return self._memo[key]


class _Node:
    """A stream: ``value(step)`` is its array at that step, or None when it has none."""

    shape: tuple[int, ...]

    def value(self, st: _Step) -> np.ndarray | None:
        raise NotImplementedError


class _Source(_Node):
    def __init__(self, fd: FieldDef, shape: tuple[int, ...]):
        self.fd = fd
        self.shape = shape

    def value(self, st: _Step) -> np.ndarray | None:
        return st.pushed.get(self.fd.id)


class _Expr(_Node):
    def __init__(self, fd: FieldDef, shape: tuple[int, ...]):
        self.fd = fd
        self.shape = shape
        self.freq = parse_freq(fd.freq_op)
        try:
            self.expr = parse(fd.expr)
        except ExprError as exc:
            raise ConfigError(f"ioserver field {fd.id}.expr: {exc}") from None
        self.refs: dict[str, _Node] = {}
        self.ats: dict[str, _At] = {}

    def value(self, st: _Step) -> np.ndarray | None:
        if self.ats and not st.cal.on_grid(self.freq, st.step):
            return None
        env: dict[str, np.ndarray] = {}
        for name, node in self.refs.items():
            v = st.get(node)
            if v is None:
                return None
            env[name] = v
        for name, node in self.ats.items():
            v = st.get(node)
            if v is None:
                return None
            env["@" + name] = v
        out = np.asarray(evaluate(self.expr, env), dtype=np.float64)
        if out.shape != self.shape:  # a constant expression, or one of scalars
            out = np.array(np.broadcast_to(out, self.shape))
        return out


class _At(_Node):
    """``@X`` over the periods of ``freq``: X's operation on X's samples in each period."""

    def __init__(self, fd: FieldDef, target: _Node, freq: Freq):
        self.fd = fd
        self.target = target
        self.shape = target.shape
        self.sample_freq = parse_freq(fd.freq_op)
        self.freq = freq
        self.op = ACCUMULATORS[fd.operation]
        self.accs: dict[int, Accumulator] = {}

    def value(self, st: _Step) -> np.ndarray | None:
        cal, n = st.cal, st.step
        k = cal.period_index(self.freq, n)
        if cal.on_grid(self.sample_freq, n):
            v = st.get(self.target)
            if v is not None:
                if k not in self.accs:
                    self.accs[k] = self.op(self.shape)
                self.accs[k].add(v)
        for old in [j for j in self.accs if j < k]:  # periods no step closes exactly
            del self.accs[old]
        if not cal.on_grid(self.freq, n):
            return None
        acc = self.accs.pop(k, None)
        return acc.result() if acc is not None else np.full(self.shape, np.nan)


class _Output:
    """A file field: its stream sampled on its ``freq_op`` grid, reduced per output period."""

    def __init__(self, file: FileDef, fd: FieldDef, stream: _Node):
        self.file = file
        self.fd = fd
        self.stream = stream
        self.shape = stream.shape
        self.freq_op = parse_freq(fd.freq_op)
        self.out_freq = parse_freq(file.output_freq)
        self.op = ACCUMULATORS[fd.operation]
        self.accs: dict[int, Accumulator] = {}
        self.t_last: dict[int, cftime.datetime] = {}
        self.next_period = 0
        self.once: tuple[cftime.datetime, np.ndarray] | None = None
        self.once_done = False
        self.once_period = 0

    def sample(self, st: _Step) -> None:
        cal, n = st.cal, st.step
        if not cal.on_grid(self.freq_op, n):
            return
        if self.fd.operation == "once" and (self.once is not None or self.once_done):
            return
        v = st.get(self.stream)
        if v is None:
            return
        if self.fd.operation == "once":
            self.once = (cal.time(n), np.array(v, dtype=np.float64))
            self.once_period = cal.period_index(self.out_freq, n)
            return
        k = cal.period_index(self.out_freq, n)
        if k not in self.accs:
            self.accs[k] = self.op(self.shape)
        self.accs[k].add(v)
        self.t_last[k] = cal.time(n)

    def emit(self, t: cftime.datetime, cal: Calendar) -> list[Record]:
        """Records of the periods that end at or before ``t``, oldest first."""
        out: list[Record] = []
        if self.fd.operation == "once":
            if self.once is not None and not self.once_done:
                t0, t1 = cal.bounds(self.out_freq, self.once_period)
                out.append(Record(self.file.id, self.fd, 0, t0, t1, *self.once))
                self.once, self.once_done = None, True
            return out
        instant = self.fd.operation == "instant"
        while True:
            k = self.next_period
            t0, t1 = cal.bounds(self.out_freq, k)
            if t1 > t:
                return out
            acc = self.accs.pop(k, None)
            data = acc.result() if acc is not None else np.full(self.shape, np.nan)
            t_last = self.t_last.pop(k, t1)
            t_inst = t_last if instant else None
            out.append(Record(self.file.id, self.fd, k, t0, t1, t_inst, data))
            self.next_period = k + 1

    def drop(self) -> None:
        self.accs.clear()
        self.t_last.clear()
        self.once = None

    @property
    def nbytes(self) -> int:
        held = sum(a.nbytes for a in self.accs.values())
        return held + (self.once[1].nbytes if self.once is not None else 0)


# ----------------------------------------------------------------------------- graph

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
    sources : dict of str to tuple of frozenset of Freq
        Source field id -> the sampling conditions under which this graph uses it:
        needed at step ``n`` iff for some condition ``n`` is on the grid of all
        its frequencies (an empty condition: every step). Sources no output uses
        are absent.

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
        self._nodes: dict[tuple[str, ...], _Node] = {}
        self._ats: list[_At] = []
        self._outputs: list[_Output] = []
        for file in self._select(files):
            for fd in file.fields:
                if fd.enabled:
                    self._outputs.append(_Output(file, fd, self._file_stream(fd)))
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

    def _file_stream(self, fd: FieldDef) -> _Node:
        if fd.expr is not None:
            return self._expr(fd, ())
        return self._def_stream(fd.field_ref, ())

    def _def_stream(self, fid: str, stack: tuple[str, ...]) -> _Node:
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
            self._nodes[key] = _Source(fd, self._shape(fd))
        return self._nodes[key]

    def _expr(self, fd: FieldDef, stack: tuple[str, ...]) -> _Node:
        key = ("expr", fd.id)
        if key in self._nodes:
            return self._nodes[key]
        node = _Expr(fd, self._shape(fd))
        for name in sorted(node.expr.names()):
            node.refs[name] = self._def_stream(name, stack)
        for name in sorted(node.expr.at_names()):
            node.ats[name] = self._at(name, node.freq, stack)
        self._nodes[key] = node
        return node

    def _at(self, fid: str, freq: Freq, stack: tuple[str, ...]) -> _At:
        key = ("at", fid, str(freq))
        if key not in self._nodes:
            target = self._def_stream(fid, stack)
            node = _At(self.cfg.fields[fid], target, freq)
            self._nodes[key] = node
            self._ats.append(node)
        return self._nodes[key]

    def _requirements(self) -> dict[str, tuple[frozenset[Freq], ...]]:
        """Per source, the sampling conditions under which some output reads it."""
        cal = self.calendar
        found: dict[str, set[frozenset[Freq]]] = {}
        seen: set[tuple[int, frozenset[Freq]]] = set()

        def require(node: _Node, cond: frozenset[Freq]) -> None:
            cond = frozenset(f for f in cond if cal.grid_period(f) != 1)
            if (id(node), cond) in seen:
                return
            seen.add((id(node), cond))
            if isinstance(node, _Source):
                found.setdefault(node.fd.id, set()).add(cond)
            elif isinstance(node, _Expr):
                inner = cond | {node.freq} if node.ats else cond
                for ref in node.refs.values():
                    require(ref, inner)
                for at in node.ats.values():
                    require(at, inner)
            elif isinstance(node, _At):  # the whole period is reduced: every sample counts
                require(node.target, self._sampling(node.fd.operation, node.sample_freq,
                                                    node.freq))

        for out in self._outputs:
            require(out.stream, self._sampling(out.fd.operation, out.freq_op, out.out_freq))
        # A condition that contains another one adds no step: keep the minimal ones.
        return {
            sid: tuple(sorted((c for c in conds if not any(o < c for o in conds)),
                              key=lambda c: sorted(c)))
            for sid, conds in found.items()
        }

    def _sampling(self, operation: str, freq_op: Freq, period: Freq) -> frozenset[Freq]:
        """The steps whose samples an operation over ``period`` uses.

        Every step of the ``freq_op`` grid, except for ``instant``: it keeps the last
        sample, the one at the period's end when that end is on the grids of the step
        and of ``freq_op`` — then only those steps are needed (6-hourly instant output
        of a 1-hour model asks for one step in six, not all of them).
        """
        cal = self.calendar
        if operation == "instant" and cal.divides(STEP, period) and cal.divides(freq_op, period):
            return frozenset({freq_op, period})
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
        return any(all(cal.on_grid(f, step) for f in cond)
                   for cond in self.sources.get(field_id, ()))

    def period_steps(self, field_id: str) -> tuple[int, ...]:
        """Step periods ``p`` with: needed at step ``n`` iff ``any(n % p == 0)``.

        ``(1,)`` when needed every step, ``()`` when never. A month or year grid is
        not periodic in steps; its boundaries are whole days from the start, so the
        daily grid stands for it: the steps are then a superset of :meth:`needs` (a
        monthly instant field of an hourly model is sent once a day, not every hour).
        """
        self._source(field_id, "period_steps")
        daily = self.calendar.grid_period(Freq(1, "d"))
        periods: set[int] = set()
        for cond in self.sources.get(field_id, ()):
            p = 1
            for f in cond:
                g = self.calendar.grid_period(f)
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
            st = _Step(n, self._pending.pop(n, {}), self.calendar)
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
