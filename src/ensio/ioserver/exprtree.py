"""The tree of a parsed field expression: its nodes, its printing and its evaluation.

:mod:`.expr` turns the user's text into this tree once, when the config is
resolved; the graph then evaluates it on numpy arrays at every step of every
expression field (:func:`evaluate`). The tree is kept apart from the parser so
that what an expression *means* — missing values are NaN and propagate through
every operation, ``x / 0``, ``log`` of ``x <= 0`` and ``0 ^ negative`` give NaN
rather than inf, comparisons and ``&& ||`` give 1.0 / 0.0 — is one reviewable
piece with no syntax in it (the grammar is in :mod:`.expr`'s docstring). The
binding powers live here because printing a tree with the fewest parentheses
needs them as much as parsing does; the parser imports them.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import EnsioError

__all__ = ["FUNCTIONS", "INFIX", "PREFIX_OPS", "UNARY_BP", "AtName", "Binary", "Call",
           "Compare", "Expr", "ExprError", "Name", "Num", "Ternary", "Unary", "evaluate",
           "expr_error", "show_text"]


class ExprError(EnsioError, ValueError):
    """A bad expression: one line, ``expression "tas +* 2": unexpected '*' at column 6``."""


def show_text(text: str, limit: int = 60) -> str:
    """``text`` fit for a one-line message: shortened, non-printable characters escaped."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def expr_error(text: str, detail: str) -> ExprError:
    """The one error of a bad expression, parse or evaluation: shown text, then why."""
    return ExprError(f'expression "{show_text(text)}": {detail}')


# ---------------------------------------------------------------------------- evaluation
def _f64(value: object) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(b == 0, np.nan, np.divide(a, b))


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # IEEE pow gives NaN^0 = 1 and 1^NaN = 1: a missing operand must stay missing
    undefined = np.isnan(a) | np.isnan(b) | ((a == 0) & (b < 0))
    return np.where(undefined, np.nan, np.power(a, b))


def _truth(op: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    """``op`` as 1.0 / 0.0, NaN where an operand is NaN (comparisons, && and ||)."""
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(np.isnan(a) | np.isnan(b), np.nan, op(a, b).astype(np.float64))
    return run


def _log(base: Callable[[np.ndarray], np.ndarray]) -> Callable:
    def run(x: np.ndarray) -> np.ndarray:
        return np.where(x > 0, base(x), np.nan)
    return run


#: Binary arithmetic and logical operators -> numpy kernel on float64 arrays.
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": _divide, "^": _power,
    "&&": _truth(lambda a, b: (a != 0) & (b != 0)), "||": _truth(lambda a, b: (a != 0) | (b != 0)),
}
_COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    op: _truth(f) for op, f in (("<", np.less), ("<=", np.less_equal), (">", np.greater),
                                (">=", np.greater_equal), ("==", np.equal), ("!=", np.not_equal))
}
_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "-": np.negative, "+": np.positive,
    "!": lambda a: np.where(np.isnan(a), np.nan, (a == 0).astype(np.float64)),
}
_FUNCS: dict[str, tuple[int, Callable[..., np.ndarray]]] = {
    "exp": (1, np.exp), "log": (1, _log(np.log)), "log10": (1, _log(np.log10)),
    "sqrt": (1, np.sqrt), "sin": (1, np.sin), "cos": (1, np.cos), "tan": (1, np.tan),
    "abs": (1, np.abs), "min": (2, np.minimum), "max": (2, np.maximum),
}
#: Function name -> number of arguments.
FUNCTIONS: dict[str, int] = {name: arity for name, (arity, _) in _FUNCS.items()}


class _Fail(Exception):
    """An evaluation problem; :func:`evaluate` turns it into an :class:`ExprError`."""


def _apply(node: Expr, kernel: Callable[..., np.ndarray], *args: np.ndarray) -> np.ndarray:
    """``kernel(*args)`` as float64, with a shape mismatch reported naming ``node``."""
    try:
        return _f64(kernel(*args))
    except ValueError:
        shapes = " and ".join(str(a.shape) for a in args)
        raise _Fail(f"operands of shapes {shapes} do not broadcast in '{show_text(str(node))}'"
                    ) from None


def _kernel(table: Mapping[str, object], key: str) -> object:
    try:
        return table[key]
    except KeyError:
        raise _Fail(f"unknown operator or function '{show_text(key)}'") from None


def _lookup(env: Mapping[str, np.ndarray | float], key: str) -> np.ndarray:
    if key not in env:
        raise _Fail(f"unknown field '{key}' (known: {show_text(', '.join(sorted(env)), 200)})")
    try:
        return _f64(env[key])
    except (TypeError, ValueError):
        raise _Fail(f"field '{key}' is not numeric") from None


# --------------------------------------------------------------------------------- AST
class Expr(abc.ABC):
    """A node of a parsed expression (all nodes are frozen, hashable dataclasses).

    ``str(node)`` prints it with the fewest parentheses; the text parses back to an
    equal tree.
    """

    @abc.abstractmethod
    def children(self) -> tuple[Expr, ...]:
        """The direct sub-expressions."""

    @abc.abstractmethod
    def _eval(self, env: Mapping[str, np.ndarray | float]) -> np.ndarray:
        """The value of this node under ``env`` (float64; scalars as 0-d arrays)."""

    def walk(self) -> Iterator[Expr]:
        """Every node of the tree, this one first (iterative: no recursion limit)."""
        todo: list[Expr] = [self]
        while todo:
            node = todo.pop()
            yield node
            todo.extend(reversed(node.children()))

    def names(self) -> set[str]:
        """Field ids referenced for their instant value (``tas`` in ``tas - 273.15``)."""
        return {n.name for n in self.walk() if isinstance(n, Name)}

    def at_names(self) -> set[str]:
        """Field ids referenced as ``@id`` (their own time operation over freq_op)."""
        return {n.name for n in self.walk() if isinstance(n, AtName)}


class _Leaf(Expr):
    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True)
class Num(_Leaf):
    value: float

    def _eval(self, env):
        return _f64(self.value)

    def __str__(self) -> str:
        if math.isinf(self.value):
            return "1e999" if self.value > 0 else "(-1e999)"
        return repr(float(self.value)) if self.value >= 0 else f"({self.value!r})"


@dataclass(frozen=True)
class Name(_Leaf):
    name: str

    def _eval(self, env):
        return _lookup(env, self.name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class AtName(_Leaf):
    name: str

    def _eval(self, env):
        return _lookup(env, "@" + self.name)

    def __str__(self) -> str:
        return "@" + self.name


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    operand: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def _eval(self, env):
        return _apply(self, _kernel(_UNARY, self.op), self.operand._eval(env))

    def __str__(self) -> str:
        return f"{self.op}{_wrap(self.operand, _prec(self.operand) < UNARY_BP)}"


@dataclass(frozen=True)
class _Infix(Expr):
    op: str
    left: Expr
    right: Expr

    _kernels: ClassVar[Mapping[str, Callable]] = {}

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def _eval(self, env):
        kernel = _kernel(self._kernels, self.op)
        return _apply(self, kernel, self.left._eval(env), self.right._eval(env))

    def __str__(self) -> str:
        p, lp, rp = _prec(self), _prec(self.left), _prec(self.right)
        if self.op == "^":      # right-associative; -a on the left needs parentheses
            parens_l, parens_r = lp <= p, rp < UNARY_BP
        else:
            parens_l, parens_r = lp < p, rp <= p
        return f"{_wrap(self.left, parens_l)} {self.op} {_wrap(self.right, parens_r)}"


@dataclass(frozen=True)
class Binary(_Infix):
    """Arithmetic ``+ - * / ^`` and logical ``&& ||`` (1.0 / 0.0)."""

    _kernels: ClassVar[Mapping[str, Callable]] = _BINARY


@dataclass(frozen=True)
class Compare(_Infix):
    """``< <= > >= == !=``: 1.0 or 0.0, NaN if an operand is NaN."""

    _kernels: ClassVar[Mapping[str, Callable]] = _COMPARE


def _select(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(c), np.nan, np.where(c != 0, a, b))


@dataclass(frozen=True)
class Ternary(Expr):
    cond: Expr
    then: Expr
    other: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.then, self.other)

    def _eval(self, env):
        return _apply(self, _select, *(node._eval(env) for node in self.children()))

    def __str__(self) -> str:
        return f"{_wrap(self.cond, _prec(self.cond) <= _prec(self))} ? {self.then} : {self.other}"


@dataclass(frozen=True)
class Call(Expr):
    func: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def _eval(self, env):
        arity, kernel = _kernel(_FUNCS, self.func)
        if arity != len(self.args):
            raise _Fail(f"{self.func} takes {arity} argument(s), got {len(self.args)}")
        return _apply(self, kernel, *(a._eval(env) for a in self.args))

    def __str__(self) -> str:
        return f"{self.func}({', '.join(str(a) for a in self.args)})"


#: Infix operator -> (binding power, node class); higher binds tighter. The parser
#: (:mod:`.expr`) builds trees with these powers and ``str()`` prints them back.
INFIX: dict[str, tuple[int, type[Expr]]] = {
    "?": (10, Ternary), "||": (20, Binary), "&&": (30, Binary),
    **{op: (40, Compare) for op in _COMPARE},
    "+": (50, Binary), "-": (50, Binary), "*": (60, Binary), "/": (60, Binary),
    "^": (80, Binary),
}
UNARY_BP = 70      # -a^b = -(a^b); -a*b = (-a)*b
#: The prefix operators the parser accepts: those with a kernel.
PREFIX_OPS = frozenset(_UNARY)


def _prec(node: Expr) -> int:
    """Binding power of the top of ``node`` (as in the parser; unknown operators 0)."""
    if isinstance(node, _Infix):
        return INFIX.get(node.op, (0,))[0]
    if isinstance(node, Ternary):
        return INFIX["?"][0]
    return UNARY_BP if isinstance(node, Unary) else 100


def _wrap(node: Expr, parens: bool) -> str:
    return f"({node})" if parens else str(node)


def evaluate(expr: Expr, env: Mapping[str, np.ndarray | float]) -> np.ndarray:
    """Value of ``expr`` with field values from ``env``.

    ``env`` maps field ids (and ``"@id"`` for ``@id`` references) to arrays or scalars,
    which broadcast as in numpy (usually all of the field's shape, ``(nj, ni)`` or
    ``(nk, nj, ni)``). Returns float64 of the broadcast shape (0-d when all are
    scalars), NaN where a value is missing or undefined. Raises :class:`ExprError`
    (showing ``str(expr)``) for an id not in ``env`` or shapes that do not broadcast;
    for hand-built trees also for an unknown function or operator, a wrong number of
    arguments (:func:`.expr.parse` refuses those) or a tree too deep to evaluate.
    """
    try:
        with np.errstate(all="ignore"):
            return expr._eval(env)
    except _Fail as exc:
        raise expr_error(str(expr), str(exc)) from None
    except RecursionError:
        raise ExprError("expression: tree too deeply nested to evaluate") from None
