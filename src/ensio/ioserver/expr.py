"""Arithmetic expressions over fields: tokenizer, parser to an AST, evaluation on arrays.

A field of the I/O server may be defined as an expression of other fields
(``expr: "tas - 273.15"``, ``expr: "@tas_max"``, seed 002). The text comes from a user's
YAML file, so it is parsed by a small hand-written parser into frozen dataclasses and
evaluated with numpy; it is never handed to :func:`eval`. Every bad input (any string
whatsoever) gives one :class:`ExprError` naming the column, never a crash, a
``RecursionError`` or a hang: the text is limited to :data:`MAX_LENGTH` characters and
the nesting to :data:`MAX_DEPTH` levels, which also bounds the recursion of the (Pratt)
parser and of the evaluation.

Grammar, loosest binding first (XIOS-like; ``^`` binds tighter than unary minus)::

    c ? a : b              ternary, right-associative; NaN condition -> NaN
    a || b                 logical or       \\  results 1.0 / 0.0,
    a && b                 logical and       | NaN operand -> NaN,
    < <= > >= == !=        comparisons,      | left-associative:
                           one level          /  a < b < c is (a < b) < c
    + -                    left-associative
    * /                    left-associative; x / 0 -> NaN
    -a  +a  !a             unary
    a ^ b                  power, right-associative: -2^2 = -4, 2^-1 = 0.5, 0^-1 -> NaN
    f(a) | f(a, b) | ( e ) | number | name | @name

Functions: ``exp log log10 sqrt sin cos tan abs`` (one argument; log of x <= 0 -> NaN)
and ``min max`` (two arguments, NaN-propagating). Numbers: ``1``, ``2.5``, ``.5``,
``1e-3``. Names are field ids ``[A-Za-z_][A-Za-z0-9_]*`` (instant values), ``@id`` the
value of id's own time operation over the current field's ``freq_op`` period.

Missing values are NaN and propagate through every operation; division by zero, a
logarithm of a value <= 0 and ``0 ^ negative`` give NaN (missing) rather than inf, and
no floating-point warning is printed.
"""

from __future__ import annotations

import abc
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from ..errors import EnsioError

__all__ = ["FUNCTIONS", "MAX_DEPTH", "MAX_LENGTH", "AtName", "Binary", "Call", "Compare",
           "Expr", "ExprError", "Name", "Num", "Ternary", "Unary", "evaluate", "parse"]

#: Longest accepted expression text, in characters.
MAX_LENGTH = 10_000
#: Deepest accepted nesting: parentheses, calls, unary operators, each operator of a
#: chain (``a+b+c`` is two levels) and each ternary count one level; a name or number
#: alone is level 0.
MAX_DEPTH = 200


class ExprError(EnsioError, ValueError):
    """A bad expression: one line, ``expression "tas +* 2": unexpected '*' at column 6``."""


def _show(text: str, limit: int = 60) -> str:
    """``text`` fit for a one-line message: shortened, non-printable characters escaped."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _error(text: str, detail: str) -> ExprError:
    return ExprError(f'expression "{_show(text)}": {detail}')


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
        raise _Fail(f"operands of shapes {shapes} do not broadcast in '{_show(str(node))}'"
                    ) from None


def _kernel(table: Mapping[str, object], key: str) -> object:
    try:
        return table[key]
    except KeyError:
        raise _Fail(f"unknown operator or function '{_show(key)}'") from None


def _lookup(env: Mapping[str, np.ndarray | float], key: str) -> np.ndarray:
    if key not in env:
        raise _Fail(f"unknown field '{key}' (known: {_show(', '.join(sorted(env)), 200)})")
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
        return f"{self.op}{_wrap(self.operand, _prec(self.operand) < _UNARY_BP)}"


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
            parens_l, parens_r = lp <= p, rp < _UNARY_BP
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


def _prec(node: Expr) -> int:
    """Binding power of the top of ``node`` (as in the parser; unknown operators 0)."""
    if isinstance(node, _Infix):
        return _INFIX.get(node.op, (0,))[0]
    if isinstance(node, Ternary):
        return _INFIX["?"][0]
    return _UNARY_BP if isinstance(node, Unary) else 100


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
    arguments (:func:`parse` refuses those) or a tree too deep to evaluate.
    """
    try:
        with np.errstate(all="ignore"):
            return expr._eval(env)
    except _Fail as exc:
        raise _error(str(expr), str(exc)) from None
    except RecursionError:
        raise ExprError("expression: tree too deeply nested to evaluate") from None


# ---------------------------------------------------------------------------- tokenizer
class _Token(NamedTuple):
    kind: str       # "num" | "name" | "at" | "op" | "end"; an op's text is unique to ops
    text: str
    pos: int        # 0-based offset in the expression text


_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<at>@[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=|>=|==|!=|&&|\|\||[-+*/^<>!?:(),])
""", re.VERBOSE)
_AFTER_NUMBER = re.compile(r"[A-Za-z0-9_.]")


def _tokens(text: str) -> list[_Token]:
    """The tokens of ``text`` followed by an ``end`` token (ASCII grammar only)."""
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            detail = ("expected a field id after '@'" if text[pos] == "@"
                      else f"unexpected '{_show(text[pos])}'")
            raise _error(text, f"{detail} at column {pos + 1}")
        kind = m.lastgroup
        if kind == "num" and _AFTER_NUMBER.match(text, m.end()):
            raise _error(text, f"malformed number at column {pos + 1}")
        if kind != "ws":
            out.append(_Token(kind, m.group(), pos))
        pos = m.end()
    out.append(_Token("end", "", len(text)))
    return out


# ------------------------------------------------------------------------------- parser
#: Infix operator -> (binding power, node class); higher binds tighter.
_INFIX: dict[str, tuple[int, type[Expr]]] = {
    "?": (10, Ternary), "||": (20, Binary), "&&": (30, Binary),
    **{op: (40, Compare) for op in _COMPARE},
    "+": (50, Binary), "-": (50, Binary), "*": (60, Binary), "/": (60, Binary),
    "^": (80, Binary),
}
_UNARY_BP = 70      # -a^b = -(a^b); -a*b = (-a)*b


class _Parser:
    """Pratt parser over the token list; methods return ``(node, depth of node)``."""

    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def fail(self, tok: _Token, detail: str | None = None) -> ExprError:
        if detail is None:
            detail = ("unexpected end" if tok.kind == "end" else f"unexpected '{_show(tok.text)}'")
        return _error(self.text, f"{detail} at column {tok.pos + 1}")

    def take(self) -> _Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text:
            raise self.fail(tok, None if tok.kind == "end" else
                            f"expected '{text}', found '{_show(tok.text)}'")

    def check(self, depth: int, tok: _Token) -> int:
        if depth > MAX_DEPTH:
            raise self.fail(tok, f"nested deeper than {MAX_DEPTH} levels")
        return depth

    def expr(self, min_bp: int, level: int) -> tuple[Expr, int]:
        """An expression whose operators all bind tighter than ``min_bp``."""
        self.check(level, self.toks[self.i])
        left, depth = self.prefix(level)
        while True:
            tok = self.toks[self.i]
            bp, cls = _INFIX.get(tok.text, (0, None))   # 0: not an infix operator
            if bp <= min_bp:
                return left, depth
            self.i += 1
            if cls is Ternary:
                then, d1 = self.expr(0, level + 1)
                self.expect(":")
                other, d2 = self.expr(bp - 1, level + 1)    # right-associative
                left, depth = Ternary(left, then, other), max(depth, d1, d2)
            else:
                right, d1 = self.expr(bp - 1 if tok.text == "^" else bp, level + 1)
                left, depth = cls(tok.text, left, right), max(depth, d1)
            depth = self.check(depth + 1, tok)

    def prefix(self, level: int) -> tuple[Expr, int]:
        """A number, name, ``@name``, call, parenthesized or unary expression."""
        tok = self.take()
        if tok.kind == "num":
            return Num(float(tok.text)), 0
        if tok.kind == "at":
            return AtName(tok.text[1:]), 0
        if tok.kind == "name":
            if self.toks[self.i].text == "(":
                return self.call(tok, level)
            return Name(tok.text), 0
        if tok.text == "(":
            node = self.expr(0, level + 1)
            self.expect(")")
            return node
        if tok.text in _UNARY:
            operand, depth = self.expr(_UNARY_BP, level + 1)
            return Unary(tok.text, operand), self.check(depth + 1, tok)
        raise self.fail(tok)

    def call(self, name: _Token, level: int) -> tuple[Expr, int]:
        """``name(args...)``, the name taken and ``(`` next."""
        if name.text not in FUNCTIONS:
            raise self.fail(name, f"unknown function '{name.text}'")
        self.i += 1                                   # the "("
        args: list[Expr] = []
        depth = 0
        sep = self.toks[self.i]
        if sep.text == ")":
            self.i += 1
        while sep.text != ")":
            arg, d = self.expr(0, level + 1)
            args.append(arg)
            depth = max(depth, d)
            sep = self.take()
            if sep.text not in (",", ")"):
                raise self.fail(sep, None if sep.kind == "end" else
                                f"expected ',' or ')', found '{_show(sep.text)}'")
        if len(args) != FUNCTIONS[name.text]:
            raise self.fail(name, f"{name.text} takes {FUNCTIONS[name.text]} argument(s), "
                                  f"got {len(args)}")
        return Call(name.text, tuple(args)), self.check(depth + 1, name)


def parse(text: str) -> Expr:
    """Parse ``text`` (grammar: module docstring) into its tree, checking function names.

    Raises :class:`ExprError` with the 1-based column for any text that is not a valid
    expression: a bad token or number, an unknown function, a wrong number of
    arguments, more than :data:`MAX_LENGTH` characters or nesting deeper than
    :data:`MAX_DEPTH`. ``names()`` and ``at_names()`` of the result list the fields read.
    """
    if not isinstance(text, str):
        raise ExprError(f"expression: expected text, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise _error(text, f"longer than {MAX_LENGTH} characters ({len(text)})")
    if not text.strip():
        raise _error(text, "empty expression")
    parser = _Parser(text)
    try:
        node, _ = parser.expr(0, 0)
    except RecursionError:     # only if the caller's stack is already nearly full
        raise _error(text, "nested too deeply for the interpreter stack") from None
    tok = parser.toks[parser.i]
    if tok.kind != "end":
        raise parser.fail(tok)
    return node
