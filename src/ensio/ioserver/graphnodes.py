"""The nodes of the post-processing graph: streams, ``@`` reductions, file outputs.

:mod:`.graph` wires these together once from the resolved config and runs them
step by step; each node here only knows how to produce its value at one step
(:class:`Step` memoizes it, so a node shared by several consumers runs once a
step) and, for the reducing nodes, which period a sample belongs to. They are
kept apart from the builder so that the time semantics of one node can be read
without the wiring. The graph is made of *streams*, things that have a value at
some steps:

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

Each file field (an :class:`Output`) samples its stream on its ``freq_op`` grid and
reduces the samples with its operation over the file's ``output_freq`` periods,
emitting one :class:`Record` per period.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import cftime
import numpy as np

from ..config.errors import ConfigError
from .calendar import Calendar, Freq, parse_freq
from .config import FieldDef, FileDef
from .expr import parse
from .exprtree import ExprError, evaluate
from .timeops import ACCUMULATORS, Accumulator

__all__ = ["Record", "Step", "Node", "SourceNode", "ExprNode", "AtNode", "Output", "Sampling"]


@dataclass(frozen=True)
class Sampling:
    """The steps at which a field is sampled: its ``freq_op`` grid, or XIOS's shifted one.

    Without ``freq_offset`` (``shift`` None) the samples are the steps on the
    ``freq_op`` grid, the ends of the ``freq_op`` periods (XIOS's default offset,
    ``freq_op - timestep``). With ``freq_offset = O`` (``shift = O`` in steps) the
    samples are at ``start + O + timestep + m·freq_op`` (m >= 0), as XIOS's
    temporal filter takes them: step ``n`` is sampled iff ``n - 1 - shift >= 0`` is
    on the ``freq_op`` grid counted from step 0.
    """

    freq: Freq
    shift: int | None = None

    @classmethod
    def of(cls, fd: FieldDef, cal: Calendar) -> Sampling:
        from .postcheck import offset_steps  # the loader checked the value

        shift = None if fd.freq_offset is None else offset_steps(fd.freq_offset, cal.dt)
        return cls(parse_freq(fd.freq_op), shift)

    def __str__(self) -> str:
        return str(self.freq) if self.shift is None else f"{self.freq}+{self.shift}ts"

    def on(self, cal: Calendar, n: int) -> bool:
        if self.shift is None:
            return cal.on_grid(self.freq, n)
        m = n - 1 - self.shift
        return m >= 0 and cal.on_grid(self.freq, m)

    def every_step(self, cal: Calendar) -> bool:
        """Sampled at every step (a condition that adds nothing)."""
        return cal.grid_period(self.freq) == 1 and not self.shift

    def step_period(self, cal: Calendar) -> int | None:
        """A ``p`` with: sampled at ``n`` ⇒ ``n % p == 0`` (None for months/years).

        Exact without a shift; with one, the samples ``n ≡ 1 + shift (mod P)`` are
        a subset of the multiples of ``gcd(P, 1 + shift)`` (the C clients' field
        table speaks in multiples: they may send more often than needed, and the
        graph drops the extra samples)."""
        p = cal.grid_period(self.freq)
        if self.shift is None:
            return p
        if p is None:  # month/year boundaries are whole days from the start
            p = cal.grid_period(Freq(1, "d"))
        return math.gcd(p, 1 + self.shift)



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


class Step:
    """The evaluation of one step: pushed data and a memo of node values."""

    def __init__(self, step: int, pushed: Mapping[str, np.ndarray], cal: Calendar):
        self.step = step
        self.pushed = pushed
        self.cal = cal
        self._memo: dict[int, np.ndarray | None] = {}

    def get(self, node: Node) -> np.ndarray | None:
        key = id(node)
        if key not in self._memo:
            self._memo[key] = node.value(self)
        return self._memo[key]


class Node:
    """A stream: ``value(step)`` is its array at that step, or None when it has none."""

    shape: tuple[int, ...]

    def value(self, st: Step) -> np.ndarray | None:
        raise NotImplementedError


class SourceNode(Node):
    """A field the model sends: what was pushed at the step (float64, missing as NaN)."""

    def __init__(self, fd: FieldDef, shape: tuple[int, ...]):
        self.fd = fd
        self.shape = shape

    def value(self, st: Step) -> np.ndarray | None:
        return st.pushed.get(self.fd.id)


class ExprNode(Node):
    """An ``expr`` field: its operands' values at the step; with ``@`` operands, only at
    the end of its own ``freq_op`` periods (where those reductions are complete)."""

    def __init__(self, fd: FieldDef, shape: tuple[int, ...]):
        self.fd = fd
        self.shape = shape
        self.freq = parse_freq(fd.freq_op)
        try:
            self.expr = parse(fd.expr)
        except ExprError as exc:
            raise ConfigError(f"ioserver field {fd.id}.expr: {exc}") from None
        self.refs: dict[str, Node] = {}
        self.ats: dict[str, AtNode] = {}

    def value(self, st: Step) -> np.ndarray | None:
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


class AtNode(Node):
    """``@X`` over the periods of ``freq``: X's operation on X's samples in each period."""

    def __init__(self, fd: FieldDef, target: Node, freq: Freq, cal: Calendar):
        self.fd = fd
        self.target = target
        self.shape = target.shape
        self.sampling = Sampling.of(fd, cal)
        self.freq = freq
        self.op = ACCUMULATORS[fd.operation]
        self.accs: dict[int, Accumulator] = {}

    def value(self, st: Step) -> np.ndarray | None:
        cal, n = st.cal, st.step
        k = cal.period_index(self.freq, n)
        if self.sampling.on(cal, n):
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


class Output:
    """A file field: its stream sampled on its ``freq_op`` grid, reduced per output period."""

    def __init__(self, file: FileDef, fd: FieldDef, stream: Node, cal: Calendar):
        self.file = file
        self.fd = fd
        self.stream = stream
        self.shape = stream.shape
        self.sampling = Sampling.of(fd, cal)
        self.out_freq = parse_freq(file.output_freq)
        self.op = ACCUMULATORS[fd.operation]
        self.accs: dict[int, Accumulator] = {}
        self.t_last: dict[int, cftime.datetime] = {}
        self.next_period = 0
        self.once: tuple[cftime.datetime, np.ndarray] | None = None
        self.once_done = False
        self.once_period = 0

    def sample(self, st: Step) -> None:
        cal, n = st.cal, st.step
        if not self.sampling.on(cal, n):
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
