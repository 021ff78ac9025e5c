"""Arithmetic expressions over fields: the grammar, the tokenizer and the parser to a tree.

A field of the I/O server may be defined as an expression of other fields
(``expr: "tas - 273.15"``, ``expr: "@tas_max"``, seed 002). The text comes from a user's
YAML file, so it is parsed here by a small hand-written parser into a tree of frozen
dataclasses, which :mod:`.exprtree` evaluates with numpy; it is never handed to
:func:`eval`. Every bad input (any string whatsoever) gives one :class:`ExprError`
naming the column, never a crash, a ``RecursionError`` or a hang: the text is limited
to :data:`MAX_LENGTH` characters and the nesting to :data:`MAX_DEPTH` levels, which
also bounds the recursion of the (Pratt) parser and of the evaluation.

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

import re
from typing import NamedTuple

from .exprtree import (
    FUNCTIONS,
    INFIX,
    PREFIX_OPS,
    UNARY_BP,
    AtName,
    Call,
    Expr,
    ExprError,
    Name,
    Num,
    Ternary,
    Unary,
    expr_error,
    show_text,
)

__all__ = ["MAX_DEPTH", "MAX_LENGTH", "parse"]

#: Longest accepted expression text, in characters.
MAX_LENGTH = 10_000
#: Deepest accepted nesting: parentheses, calls, unary operators, each operator of a
#: chain (``a+b+c`` is two levels) and each ternary count one level; a name or number
#: alone is level 0.
MAX_DEPTH = 200


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
                      else f"unexpected '{show_text(text[pos])}'")
            raise expr_error(text, f"{detail} at column {pos + 1}")
        kind = m.lastgroup
        if kind == "num" and _AFTER_NUMBER.match(text, m.end()):
            raise expr_error(text, f"malformed number at column {pos + 1}")
        if kind != "ws":
            out.append(_Token(kind, m.group(), pos))
        pos = m.end()
    out.append(_Token("end", "", len(text)))
    return out


# ------------------------------------------------------------------------------- parser


class _Parser:
    """Pratt parser over the token list; methods return ``(node, depth of node)``."""

    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def fail(self, tok: _Token, detail: str | None = None) -> ExprError:
        if detail is None:
            detail = ("unexpected end" if tok.kind == "end"
                      else f"unexpected '{show_text(tok.text)}'")
        return expr_error(self.text, f"{detail} at column {tok.pos + 1}")

    def take(self) -> _Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text:
            raise self.fail(tok, None if tok.kind == "end" else
                            f"expected '{text}', found '{show_text(tok.text)}'")

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
            bp, cls = INFIX.get(tok.text, (0, None))   # 0: not an infix operator
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
        if tok.text in PREFIX_OPS:
            operand, depth = self.expr(UNARY_BP, level + 1)
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
                                f"expected ',' or ')', found '{show_text(sep.text)}'")
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
        raise expr_error(text, f"longer than {MAX_LENGTH} characters ({len(text)})")
    if not text.strip():
        raise expr_error(text, "empty expression")
    parser = _Parser(text)
    try:
        node, _ = parser.expr(0, 0)
    except RecursionError:     # only if the caller's stack is already nearly full
        raise expr_error(text, "nested too deeply for the interpreter stack") from None
    tok = parser.toks[parser.i]
    if tok.kind != "end":
        raise parser.fail(tok)
    return node
