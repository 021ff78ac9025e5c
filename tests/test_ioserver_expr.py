"""Expressions of the I/O server: grammar, numpy semantics, errors, limits, fuzzing.

Expected values come from Python's own arithmetic on hand-written equivalents, from
numpy applied directly, or from an evaluator written here over random trees of this
file's own representation (never from the module under test).
"""

import math
import signal
import time
import warnings
from contextlib import contextmanager

import numpy as np
import pytest

from ensio.ioserver.expr import MAX_DEPTH, MAX_LENGTH, parse
from ensio.ioserver.exprtree import (
    FUNCTIONS,
    AtName,
    Binary,
    Call,
    ExprError,
    Name,
    Num,
    Unary,
    evaluate,
)


def _ev(text: str, **env) -> np.ndarray:
    return evaluate(parse(text), env)


# ------------------------------------------------------- precedence against Python itself
def _py_bool(x) -> float:
    return 1.0 if x else 0.0


#: (expression, the same computation in Python with explicit grouping)
PYTHON_CASES = [
    ("a + b * c", lambda a, b, c, d: a + b * c),
    ("a - b - c", lambda a, b, c, d: (a - b) - c),
    ("a / b / c", lambda a, b, c, d: (a / b) / c),
    ("a / b * c", lambda a, b, c, d: (a / b) * c),
    ("a - b + c", lambda a, b, c, d: (a - b) + c),
    ("a ^ b ^ c", lambda a, b, c, d: a ** (b ** c)),
    ("-a ^ 2", lambda a, b, c, d: -(a ** 2)),
    ("-2^2", lambda a, b, c, d: -4.0),
    ("2 ^ -a", lambda a, b, c, d: 2 ** (-a)),
    ("2 ^ -a * b", lambda a, b, c, d: (2 ** (-a)) * b),
    ("a ^ -b ^ c", lambda a, b, c, d: a ** (-(b ** c))),
    ("a * -b", lambda a, b, c, d: a * (-b)),
    ("-a * b", lambda a, b, c, d: (-a) * b),
    ("a - -b", lambda a, b, c, d: a + b),
    ("- - +a", lambda a, b, c, d: a),
    ("(a + b) * c", lambda a, b, c, d: (a + b) * c),
    ("a * (b + c) ^ 2 / d", lambda a, b, c, d: a * (b + c) ** 2 / d),
    ("a * b ^ c", lambda a, b, c, d: a * (b ** c)),
    ("max(a, b) - min(c, d) * 2", lambda a, b, c, d: max(a, b) - min(c, d) * 2),
    ("a + b < c * d", lambda a, b, c, d: _py_bool(a + b < c * d)),
    ("a < b == c", lambda a, b, c, d: _py_bool(_py_bool(a < b) == c)),
    ("a < b < c", lambda a, b, c, d: _py_bool(_py_bool(a < b) < c)),
    ("a <= b != c >= d", lambda a, b, c, d: _py_bool(_py_bool(_py_bool(a <= b) != c) >= d)),
    ("a ? b : c ? d : a", lambda a, b, c, d: b if a != 0 else (d if c != 0 else a)),
    ("a > b ? a - b : b - a", lambda a, b, c, d: abs(a - b)),
    ("a - b ? c : d", lambda a, b, c, d: c if a - b != 0 else d),
    ("a > b ? c > d ? 1 : 2 : 3", lambda a, b, c, d: (1.0 if c > d else 2.0) if a > b else 3.0),
    ("a == b || c == d && a < c",
     lambda a, b, c, d: _py_bool((a == b) or ((c == d) and (a < c)))),
    ("!(a > b) + !0 * 2", lambda a, b, c, d: _py_bool(not a > b) + 2.0),
    ("a - b > 0 && c", lambda a, b, c, d: _py_bool(a - b > 0 and c != 0)),
    ("exp(a) * log(b) + sqrt(c) / abs(-d)",
     lambda a, b, c, d: math.exp(a) * math.log(b) + math.sqrt(c) / abs(-d)),
    ("log10(a*b) - sin(c)^2 - cos(c)^2 + tan(d)",
     lambda a, b, c, d: math.log10(a * b) - math.sin(c) ** 2 - math.cos(c) ** 2 + math.tan(d)),
    ("1e-3 * a + .5 + 2. + 3E2", lambda a, b, c, d: 1e-3 * a + 0.5 + 2.0 + 300.0),
    ("\ta\n+\r\nb ", lambda a, b, c, d: a + b),
]


@pytest.mark.parametrize("text,python", PYTHON_CASES, ids=[c[0] for c in PYTHON_CASES])
def test_precedence_and_associativity_match_python(text, python, rng):
    for _ in range(20):          # small values from a set with ties, so == and != both occur
        a, b, c, d = (float(v) for v in rng.choice([0.5, 1.0, 2.0, 3.0], size=4))
        got = _ev(text, a=a, b=b, c=c, d=d)
        assert got.shape == () and got.dtype == np.float64
        assert math.isclose(float(got), python(a, b, c, d), rel_tol=1e-13), (a, b, c, d)


def test_tree_shapes():
    assert parse("-2^2") == Unary("-", Binary("^", Num(2.0), Num(2.0)))
    assert parse("a - b - c") == Binary("-", Binary("-", Name("a"), Name("b")), Name("c"))
    assert parse("a ^ b ^ c") == Binary("^", Name("a"), Binary("^", Name("b"), Name("c")))
    assert parse("max(@x, 1)") == Call("max", (AtName("x"), Num(1.0)))
    assert parse("exp") == Name("exp")                  # a field may be called like a function


def test_names_and_at_names():
    e = parse("max(tas, @tas_max) * tas + @pr ? x : log(1)")
    assert e.names() == {"tas", "x"}
    assert e.at_names() == {"tas_max", "pr"}
    assert parse("1 + 2").names() == set() and parse("@a").names() == set()


def test_printed_tree_parses_back_to_itself():
    for text in [c[0] for c in PYTHON_CASES] + ["1e999 - -1e999", "@a ? b : !c"]:
        e = parse(text)
        assert parse(str(e)) == e


# ------------------------------------------------------------ functions against numpy
def _field(rng, shape=(6, 7), p_missing=0.15) -> np.ndarray:
    x = rng.normal(0.0, 3.0, size=shape)
    x[rng.random(shape) < p_missing] = np.nan
    x.flat[:3] = [0.0, -1.0, 1.0]
    return x


ONE_ARG = {
    "exp": np.exp, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos, "tan": np.tan, "abs": np.abs,
    "log": lambda x: np.log(np.where(x > 0, x, np.nan)),
    "log10": lambda x: np.log10(np.where(x > 0, x, np.nan)),
}


def test_function_table():
    assert FUNCTIONS == {**{f: 1 for f in ONE_ARG}, "min": 2, "max": 2}


@pytest.mark.parametrize("func", sorted(ONE_ARG))
def test_one_argument_functions_match_numpy(func, rng):
    x = _field(rng)
    with np.errstate(all="ignore"):
        expected = ONE_ARG[func](x)
    got = _ev(f"{func}(x)", x=x)
    np.testing.assert_allclose(got, expected, rtol=1e-15, atol=0, equal_nan=True)
    if func in ("log", "log10"):
        assert np.isnan(got[x <= 0]).all()                  # missing, never -inf


@pytest.mark.parametrize("func,reference", [("min", np.minimum), ("max", np.maximum)])
def test_two_argument_functions_propagate_missing(func, reference, rng):
    x, y = _field(rng), _field(rng)
    got = _ev(f"{func}(x, y)", x=x, y=y)
    np.testing.assert_array_equal(got, reference(x, y))
    assert np.isnan(got[np.isnan(x) | np.isnan(y)]).all()
    assert not np.isnan(got[~np.isnan(x) & ~np.isnan(y)]).any()


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "^", "<", "<=", ">", ">=", "==", "!=",
                                "&&", "||"])
def test_missing_propagates_through_binary_operators(op, rng):
    x, y = _field(rng), _field(rng)
    y[2, :] = x[2, :]                               # some equal values for == and !=
    x[3, :2], y[3, :2] = [np.nan, 1.0], [0.0, np.nan]   # NaN ^ 0 and 1 ^ NaN
    got = _ev(f"x {op} y", x=x, y=y)
    missing = np.isnan(x) | np.isnan(y)
    assert np.isnan(got[missing]).all()
    if op in ("+", "-", "*"):
        py = {"+": np.add, "-": np.subtract, "*": np.multiply}[op]
        np.testing.assert_array_equal(got, py(x, y))
    elif op not in ("/", "^"):
        ok = ~missing
        truth = {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y,
                 "!=": x != y, "&&": (x != 0) & (y != 0), "||": (x != 0) | (y != 0)}[op]
        np.testing.assert_array_equal(got[ok], truth[ok].astype(float))


def test_division_and_power_against_numpy(rng):
    x, y = _field(rng), _field(rng)
    y[0, 3:6] = 0.0
    got = _ev("x / y", x=x, y=y)
    ok = (y != 0) & ~np.isnan(x) & ~np.isnan(y)
    np.testing.assert_array_equal(got[ok], x[ok] / y[ok])
    assert np.isnan(got[~ok]).all()                         # x / 0 is missing, not inf
    p = np.abs(x)
    got = _ev("p ^ y", p=p, y=y)
    ok = ~np.isnan(p) & ~np.isnan(y) & ~((p == 0) & (y < 0))
    np.testing.assert_allclose(got[ok], p[ok] ** y[ok], rtol=1e-15)
    assert np.isnan(got[~ok]).all()
    assert np.isnan(_ev("0 ^ -1")) and _ev("0 ^ 0") == 1.0 and np.isnan(_ev("(-8) ^ 0.5"))
    # IEEE pow says NaN^0 = 1 and 1^NaN = 1; a missing value stays missing here
    assert np.isnan(_ev("x ^ 0", x=np.nan)) and np.isnan(_ev("1 ^ x", x=np.nan))


def test_unary_operators(rng):
    x = _field(rng)
    np.testing.assert_array_equal(_ev("-x", x=x), -x)
    np.testing.assert_array_equal(_ev("+x", x=x), x)
    not_x = _ev("!x", x=x)
    assert np.isnan(not_x[np.isnan(x)]).all()
    ok = ~np.isnan(x)
    np.testing.assert_array_equal(not_x[ok], (x[ok] == 0).astype(float))


def test_ternary_selects_per_point_and_nan_condition_is_missing(rng):
    c, a, b = _field(rng), _field(rng), _field(rng)
    c[1, :] = 0.0
    got = _ev("c ? a : b", c=c, a=a, b=b)
    expected = np.where(np.isnan(c), np.nan, np.where(c != 0, a, b))
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[np.isnan(c)]).all()
    # a missing value in the branch not taken does not matter
    assert _ev("1 ? 5 : x", x=np.nan) == 5.0 and _ev("0 ? x : 5", x=np.nan) == 5.0


def test_no_floating_point_warnings_and_errstate_restored():
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _ev("1/x + log(x) + log10(x) + sqrt(x) + exp(1000*y) + x^-1 + tan(y)",
                  x=np.array([0.0, -1.0, 2.0]), y=np.array([1.0, 2.0, 3.0]))
    assert out.shape == (3,) and np.isnan(out[:2]).all()
    assert np.geterr() == before


def test_broadcasting_of_scalars_and_arrays(rng):
    t3 = rng.normal(size=(3, 4, 5))
    t2 = rng.normal(size=(4, 5))
    np.testing.assert_array_equal(_ev("t3 - t2 * k + 1", t3=t3, t2=t2, k=2.5),
                                  t3 - t2 * 2.5 + 1.0)
    np.testing.assert_array_equal(_ev("@m + t2", t2=t2, **{"@m": 3}), t2 + 3.0)
    np.testing.assert_array_equal(_ev("k", k=np.float32(1.5)), np.float64(1.5))
    ints = np.arange(6).reshape(2, 3)
    got = _ev("i / 2", i=ints)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, ints / 2.0)
    with pytest.raises(ExprError, match=r"shapes \(3,\) and \(4,\) do not broadcast"):
        _ev("x + y", x=np.zeros(3), y=np.zeros(4))
    with pytest.raises(ExprError, match="do not broadcast"):
        _ev("z ? x : y", z=np.zeros(2), x=np.zeros(3), y=1.0)


# ------------------------------------------------------------------------------- errors
ERROR_CASES = [
    ("tas +* 2", r"^expression \"tas \+\* 2\": unexpected '\*' at column 6$"),
    ("1 +", "unexpected end at column 4"),
    ("(a + b", "unexpected end at column 7"),
    ("a + b)", "unexpected '\\)' at column 6"),
    ("a ? b", "unexpected end at column 6"),
    ("a ? b c", "expected ':', found 'c' at column 7"),
    ("a ? b : ", "unexpected end at column 9"),
    ("foo(1)", "unknown function 'foo' at column 1"),
    ("a + min(1)", r"min takes 2 argument\(s\), got 1 at column 5"),
    ("exp(1, 2)", r"exp takes 1 argument\(s\), got 2 at column 1"),
    ("max()", "max takes 2 argument", ),
    ("min(1 2)", "expected ',' or '\\)', found '2' at column 7"),
    ("max(1,)", "unexpected '\\)' at column 7"),
    ("1.2.3", "malformed number at column 1"),
    ("x + 2e", "malformed number at column 5"),
    ("3abc", "malformed number at column 1"),
    ("a = b", "unexpected '=' at column 3"),
    ("a & b", "unexpected '&' at column 3"),
    ("a | b", "unexpected '\\|' at column 3"),
    ("a ** b", "unexpected '\\*' at column 4"),
    ("@", "expected a field id after '@' at column 1"),
    ("@ tas", "expected a field id after '@' at column 1"),
    ("a $ b", "unexpected '\\$' at column 3"),
    ("tas\x00", "unexpected '\\\\x00' at column 4"),
    ("é + 1", "unexpected 'é' at column 1"),
    ("1 2", "unexpected '2' at column 3"),
    ("a b", "unexpected 'b' at column 3"),
    ("()", "unexpected '\\)' at column 2"),
    ("", "empty expression"),
    ("  \n ", "empty expression"),
    ("a ? b : c : d", "unexpected ':' at column 11"),
]


@pytest.mark.parametrize("text,pattern", ERROR_CASES, ids=[repr(c[0]) for c in ERROR_CASES])
def test_bad_text_is_a_one_line_error_with_its_column(text, pattern):
    with pytest.raises(ExprError, match=pattern) as info:
        parse(text)
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)


def test_unknown_names_at_evaluation_are_named():
    e = parse("tas + @pr")
    with pytest.raises(ExprError, match=r"^expression \"tas \+ @pr\": unknown field 'tas' "
                                        r"\(known: pr\)$"):
        evaluate(e, {"pr": 1.0})
    with pytest.raises(ExprError, match="unknown field '@pr'"):
        evaluate(e, {"tas": 1.0, "pr": 1.0})
    with pytest.raises(ExprError, match="field 'x' is not numeric"):
        evaluate(parse("x"), {"x": "abc"})


def test_hand_built_bad_trees_give_expr_errors():
    with pytest.raises(ExprError, match="unknown operator or function 'nope'"):
        evaluate(Call("nope", (Num(1.0),)), {})
    with pytest.raises(ExprError, match=r"exp takes 1 argument\(s\), got 2"):
        evaluate(Call("exp", (Num(1.0), Num(2.0))), {})
    with pytest.raises(ExprError, match="unknown operator or function '%'"):
        evaluate(Binary("%", Num(1.0), Num(2.0)), {})
    with pytest.raises(ExprError, match="expected text"):
        parse(b"1 + 2")


# ------------------------------------------------------------------------------ limits
def _nested(kind: str, n: int) -> str:
    return {
        "parens": "(" * n + "x" + ")" * n,
        "unary": "-" * n + "x",
        "calls": "abs(" * n + "x" + ")" * n,
        "power": "^".join(["x"] * (n + 1)),
        "chain": "+".join(["x"] * (n + 1)),
        "ternary": "x ? 1 : " * n + "x",
    }[kind]


@pytest.mark.parametrize("kind", ["parens", "unary", "calls", "power", "chain", "ternary"])
def test_nesting_limit_is_exact_and_never_a_recursion_error(kind):
    e = parse(_nested(kind, MAX_DEPTH))
    # everything a caller may do with the deepest accepted tree works
    assert np.isfinite(evaluate(e, {"x": 1.0}))
    assert e == parse(_nested(kind, MAX_DEPTH)) and hash(e) == hash(parse(_nested(kind, MAX_DEPTH)))
    assert parse(str(e)) == e and e.names() == {"x"}
    repr(e)
    with pytest.raises(ExprError, match=f"nested deeper than {MAX_DEPTH} levels at column"):
        parse(_nested(kind, MAX_DEPTH + 1))


def test_very_deep_and_very_long_inputs():
    n = 100_000
    for text in ("(" * n + "1" + ")" * n, "(" * n, "-" * n + "1", "1" + "+1" * n):
        with pytest.raises(ExprError, match=f"longer than {MAX_LENGTH} characters"):
            parse(text)
    for text in ("(" * 4000 + "1" + ")" * 4000, "-" * 9000 + "1", "1" + "^1" * 4000,
                 "1" + "*1" * 4000, "abs(" * 1999 + "1" + ")" * 1999):
        assert len(text) <= MAX_LENGTH
        with pytest.raises(ExprError, match="nested deeper than"):
            parse(text)
    long_ok = " " * (MAX_LENGTH - 9) + "x + 1e-3"
    assert evaluate(parse(long_ok), {"x": 1.0}) == 1.001
    assert parse("a" * MAX_LENGTH) == Name("a" * MAX_LENGTH)
    with pytest.raises(ExprError, match="longer than"):
        parse("a" * (MAX_LENGTH + 1))


def test_hand_built_tree_too_deep_to_evaluate():
    node = Num(1.0)
    for _ in range(50_000):
        node = Unary("-", node)
    with pytest.raises(ExprError, match="too deeply nested"):
        evaluate(node, {})


# -------------------------------------------------------------------------------- fuzz
class _Hang(Exception):
    pass


@contextmanager
def _deadline(seconds: int):
    """Fail (instead of hanging forever) if the block runs longer than ``seconds``."""
    def alarm(signum, frame):
        raise _Hang(f"no result after {seconds} s: a hang?")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


FUZZ_TOKENS = ["x", "y", "tas", "@x", "@tas", "@", "1", "0", "2.5", ".5", "1e-3", "3E+2", "1e",
               "+", "-", "*", "/", "^", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "!", "=",
               "&", "|", "?", ":", "(", ")", ",", " ", "\t", "\n", *FUNCTIONS, "foo", "_a1",
               "((", "))", ".", "e", "1.2.3", "\x00", "é", "\ud800", "#", "'", '"', "$"]


def _fuzz_text(rng: np.random.Generator) -> str:
    kind = rng.integers(4)
    n = int(rng.integers(0, 40))
    if kind == 0:        # random grammar tokens
        return "".join(FUZZ_TOKENS[i] for i in rng.integers(len(FUZZ_TOKENS), size=n))
    if kind == 1:        # random bytes, decoded leniently
        return bytes(rng.integers(0, 256, size=n, dtype=np.uint8)).decode("latin-1")
    if kind == 2:        # a valid expression with a few characters deleted, replaced, inserted
        text = list(_text(_tree(rng, int(rng.integers(1, 6))), rng)[0])
        for _ in range(int(rng.integers(1, 3))):
            i = int(rng.integers(len(text) + 1))
            new = FUZZ_TOKENS[rng.integers(len(FUZZ_TOKENS))]
            text[i:i + int(rng.integers(0, 3))] = [new] if rng.random() < 0.7 else []
        return "".join(text)
    # random code points, surrogates included, mixed with tokens
    parts = [FUZZ_TOKENS[i] if rng.random() < 0.7 else chr(int(rng.integers(0, 0x110000)))
             for i in rng.integers(len(FUZZ_TOKENS), size=n)]
    return "".join(parts)


def _long_text(rng: np.random.Generator) -> str:
    """Thousands of random tokens: around the length and nesting limits."""
    n = int(rng.integers(1000, 6000))
    return "".join(FUZZ_TOKENS[i] for i in rng.integers(len(FUZZ_TOKENS), size=n))


def test_fuzz_random_strings_parse_or_give_expr_error(rng):
    env = {"x": rng.normal(size=5), "y": 2.0, "tas": np.array([1.0, np.nan, 0.0, -3.0, 7.0]),
           "@x": rng.normal(size=5), "@tas": 0.5}
    outcomes = {"ok": 0, "error": 0}
    total = 600.0                          # generous: the whole loop takes about a second
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(20_000):
            assert time.monotonic() - start < total, f"fuzz loop over {total} s: a hang?"
            text = _long_text(rng) if i % 100 == 0 else _fuzz_text(rng)
            try:
                with _deadline(60):        # one string: a hang fails here, with its text
                    out = evaluate(parse(text), env)
            except ExprError as exc:
                msg = str(exc)
                assert msg.startswith("expression") and "\n" not in msg, (text, msg)
                outcomes["error"] += 1
                continue
            except _Hang:
                pytest.fail(f"no result after 60 s for {text!r}")
            assert isinstance(out, np.ndarray) and out.dtype == np.float64, text
            assert out.shape in ((), (5,)), text
            outcomes["ok"] += 1
    assert outcomes["ok"] > 0 and outcomes["error"] > 0, outcomes


# ------------------------------------- random valid trees against an independent evaluator
# A tree here is a tuple: ("num", text, value) | ("name", id) | ("un", op, t) |
# ("bin", op, l, r) | ("tern", c, a, b) | ("call", f, args). The text is printed with the
# fewest parentheses this file's own precedence table needs (plus random extra ones), and
# the value computed with numpy directly.
PREC = {"?": 1, "||": 2, "&&": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
        "+": 5, "-": 5, "*": 6, "/": 6, "unary": 7, "^": 8, "atom": 9}
NUMBERS = [("0", 0.0), ("1", 1.0), ("2.", 2.0), (".5", 0.5), ("3.25", 3.25), ("1e-3", 1e-3),
           ("2E1", 20.0), ("0.0", 0.0), ("7e+0", 7.0)]
LEAVES = ["a", "b", "c", "@d", "e"]


def _tree(rng, depth: int):
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.4:
            return ("num", *NUMBERS[rng.integers(len(NUMBERS))])
        return ("name", LEAVES[rng.integers(len(LEAVES))])
    kind = rng.choice(["un", "bin", "bin", "bin", "tern", "call"])
    if kind == "un":
        return ("un", str(rng.choice(["-", "+", "!"])), _tree(rng, depth - 1))
    if kind == "bin":
        op = str(rng.choice([k for k in PREC if k not in ("?", "unary", "atom")]))
        return ("bin", op, _tree(rng, depth - 1), _tree(rng, depth - 1))
    if kind == "tern":
        return ("tern", *(_tree(rng, depth - 1) for _ in range(3)))
    func = str(rng.choice(sorted(FUNCTIONS)))
    return ("call", func, tuple(_tree(rng, depth - 1) for _ in range(FUNCTIONS[func])))


def _text(t, rng) -> tuple[str, int]:
    """(text, precedence of its top operator)."""
    def wrap(sub, need_parens):
        s, _ = _text(sub, rng)
        return f"({s})" if need_parens or rng.random() < 0.05 else s

    kind = t[0]
    if kind == "num":
        return t[1], PREC["atom"]
    if kind == "name":
        return t[1], PREC["atom"]
    if kind == "call":
        return f"{t[1]}({', '.join(_text(a, rng)[0] for a in t[2])})", PREC["atom"]
    if kind == "un":
        p = PREC["unary"]
        return f"{t[1]}{wrap(t[2], _text(t[2], rng)[1] < p)}", p
    if kind == "tern":
        c, a, b = t[1:]
        p = PREC["?"]
        return (f"{wrap(c, _text(c, rng)[1] <= p)} ? {wrap(a, False)} : {wrap(b, False)}", p)
    op, left, right = t[1:]
    p = PREC[op]
    lp, rp = _text(left, rng)[1], _text(right, rng)[1]
    if op == "^":       # right-associative, binds tighter than a unary minus on its left
        need_l, need_r = lp <= p, rp < PREC["unary"]
    else:
        need_l, need_r = lp < p, rp <= p
    return f"{wrap(left, need_l)} {op} {wrap(right, need_r)}", p


def _value(t, env):
    kind = t[0]
    if kind == "num":
        return np.float64(t[2])
    if kind == "name":
        return env[t[1]]
    nan = np.nan
    if kind == "un":
        v = _value(t[2], env)
        return {"-": lambda: -v, "+": lambda: +v,
                "!": lambda: np.where(np.isnan(v), nan, np.where(v == 0, 1.0, 0.0))}[t[1]]()
    if kind == "tern":
        c, a, b = (_value(s, env) for s in t[1:])
        return np.where(np.isnan(c), nan, np.where(c != 0, a, b))
    if kind == "call":
        args = [_value(s, env) for s in t[2]]
        x = args[0]
        return {"exp": lambda: np.exp(x), "sqrt": lambda: np.sqrt(x), "sin": lambda: np.sin(x),
                "cos": lambda: np.cos(x), "tan": lambda: np.tan(x), "abs": lambda: np.abs(x),
                "log": lambda: np.log(np.where(x > 0, x, nan)),
                "log10": lambda: np.log10(np.where(x > 0, x, nan)),
                "min": lambda: np.minimum(x, args[-1]),
                "max": lambda: np.maximum(x, args[-1])}[t[1]]()
    op, l, r = t[1], _value(t[2], env), _value(t[3], env)
    either = np.isnan(l) | np.isnan(r)
    if op in ("+", "-", "*"):
        return {"+": l + r, "-": l - r, "*": l * r}[op]
    if op == "/":
        return np.where(r == 0, nan, l / np.where(r == 0, 1.0, r))
    if op == "^":
        return np.where(either | ((l == 0) & (r < 0)), nan, np.power(l, r))
    truth = {"<": l < r, "<=": l <= r, ">": l > r, ">=": l >= r, "==": l == r, "!=": l != r,
             "&&": (l != 0) & (r != 0), "||": (l != 0) | (r != 0)}[op]
    return np.where(either, nan, np.where(truth, 1.0, 0.0))


def test_random_valid_expressions_match_an_independent_evaluator(rng):
    env = {"a": np.array([0.0, 1.0, -2.0, 0.5, np.nan, 3.0, -0.25]),
           "b": rng.normal(size=7), "c": np.array([2.0, 0.0, 1.0, np.nan, -1.0, 0.5, 2.0]),
           "@d": 0.5, "e": rng.choice([0.0, 1.0, 2.0], size=7)}
    checked = 0
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2000):
            tree = _tree(rng, int(rng.integers(1, 7)))
            text, _ = _text(tree, rng)
            expected = np.broadcast_to(_value(tree, env), (7,))
            node = parse(text)
            assert parse(str(node)) == node, text
            got = np.broadcast_to(evaluate(node, env), (7,))
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0, equal_nan=True,
                                       err_msg=text)
            checked += 1
    assert checked == 2000
