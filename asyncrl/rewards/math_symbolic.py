"""The math verifier's symbolic comparison: HF's math_verify (`parse`, `verify`) on inputs bounded so that no call
can run for minutes, in place of math_verify's own timeouts.

Owns `symbolically_equal` (and the bounds it applies: `symbolic_candidate` on the text, `bounded_expression` on what
it parses to). Pure: no I/O, no signal; safe to call from many threads at once (the reward role scores in a thread
pool). `asyncrl.rewards.math_verifier` calls it for answers that are not both plain numbers.

Invariants:
- math_verify is called with `parsing_timeout=None` and `timeout_seconds=None`: its timeouts use `signal.alarm`, which
  cannot work outside the main thread, so they are off;
- only text that passes `symbolic_candidate` (at most MAX_SYMBOLIC_CHARS characters, an allow-list of characters and
  LaTeX commands, no words, brackets nested at most MAX_NESTING deep) is parsed, and only parsed expressions that pass
  `bounded_expression` (an allow-list of expression kinds without functions, at most MAX_NODES nodes and
  MAX_FREE_SYMBOLS variables, exact numbers of at most MAX_DIGITS digits, small exponents, at most MAX_TERMS terms
  expanded) are compared, after their floats become the rationals they write; what fails either is not equal.
  10**(10**10), binomials, factorials, sums, (a+...+h)**8, log(7)*y - 10**12, floats among radicals and equations
  with roots or negative powers of a variable each kept sympy busy for 10 s to forever and never reach it. The bounds
  are an allow-list, not a timeout: the slowest of some 6,000 random expressions within them took 1.3 s of CPU;
- two numbers without variables are compared by value (relative `rel_tol`) when either text has a decimal point.
"""

from __future__ import annotations

import logging
import math
import re
from functools import lru_cache
from typing import Any

MAX_SYMBOLIC_CHARS = 100
"""An answer longer than this is not compared symbolically (real final answers are short; sympy's time is not
bounded by length alone)."""
MAX_NESTING = 8
"""Brackets ( [ { nested deeper than this keep an answer from the symbolic comparison (math_verify's LaTeX parser
slows down steeply with depth)."""
MAX_NODES = 60
"""Expression nodes of one parsed answer for the symbolic comparison."""
MAX_FREE_SYMBOLS = 2
"""Distinct variables of one parsed answer for the symbolic comparison (sympy solves and simplifies over each)."""
MAX_DIGITS = 10_000
"""The digits an exact number may grow to when sympy evaluates a parsed answer (10**(10**10) is refused)."""
MAX_SYMBOLIC_EXPONENT = 8
"""The largest exponent of a power whose base holds a variable ((x+y)**8 expands; (x+y)**100 is refused)."""
MAX_RELATION_EXPONENT = 4
"""In an equation or inequality (which sympy solves), a variable's power is a whole number from 1 to this: z - 10 =
10 - (7+z)**-3 - y took sympy 10 s of CPU."""
MAX_TERMS = 64
"""Terms of a parsed answer expanded as a polynomial, an upper bound (`_terms`): (x+1)**6 has at most 64 and is
compared; (x+y+1)**8 (up to 6,561) is refused (sympy took a minute and more on such differences)."""

_COMMAND = re.compile(r"\\([A-Za-z]+|.)", re.DOTALL)
_WORD = re.compile(r"[A-Za-z]{2,}")
_SYMBOLIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t+-*/^_()[]{}.,=<>|'\\")
_COMMANDS = frozenset({
    "frac", "dfrac", "tfrac", "sqrt", "pi", "cdot", "times", "div", "pm", "infty", "left", "right", "le", "leq",
    "ge", "geq", "ne", "neq", "lt", "gt", "cup", "cap",
    "{", "}", ",", "!", ";", ":", " ",
})


class _QuietTimeoutWarning(logging.Filter):
    """Drop math_verify's once-per-process warning that its signal-based timeouts are off: this module turns them off
    on purpose and bounds the inputs instead (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_QuietTimeoutWarning())


def symbolic_candidate(text: str) -> bool:
    """Whether `text` may be handed to math_verify's parser: non-empty, at most MAX_SYMBOLIC_CHARS characters, only
    characters of `_SYMBOLIC_CHARS`, only the LaTeX commands of `_COMMANDS`, no word of two letters or more outside
    a command (which also keeps text out of sympy's `parse_expr`, an `eval`), brackets nested at most MAX_NESTING
    deep."""
    if not text.strip() or len(text) > MAX_SYMBOLIC_CHARS or not set(text) <= _SYMBOLIC_CHARS:
        return False
    if any(m.group(1) not in _COMMANDS for m in _COMMAND.finditer(text)):
        return False
    if _WORD.search(_COMMAND.sub(" ", text)):
        return False
    depth = 0
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth > MAX_NESTING:
            return False
    return True


def _digits(expr: Any, relation: bool = False) -> int | None:
    """An upper bound of the digits of the exact numbers sympy may build evaluating `expr`; None: refused (a kind
    of expression not allowed, a function among them, an exponent that is not a small number, in a relation (which
    sympy solves) a variable's power that is not a whole number from 1 to MAX_RELATION_EXPONENT). `relation`: `expr`
    is inside one."""
    import sympy

    if isinstance(expr, sympy.Rational):
        return _int_digits(int(expr.p)) + _int_digits(int(expr.q))
    if isinstance(expr, sympy.Float) and expr.is_finite and expr != 0:  # as the Rational `_exact` makes of it
        _, _, exponent, bits = expr._mpf_
        return (bits + abs(exponent)) * 30103 // 100000 + 2
    if isinstance(expr, (sympy.Number, sympy.NumberSymbol, sympy.Symbol)) or expr is sympy.I:
        return 20
    if isinstance(expr, sympy.logic.boolalg.BooleanAtom):
        return 1
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        if not isinstance(exponent, sympy.Rational) or abs(exponent) > MAX_DIGITS:
            return None
        if base.free_symbols and (abs(exponent) > MAX_SYMBOLIC_EXPONENT or relation and not (
                exponent.q == 1 and 0 < exponent <= MAX_RELATION_EXPONENT)):
            return None
        inner = _digits(base, relation)
        return None if inner is None else inner * max(1, math.ceil(abs(exponent)))
    if isinstance(expr, sympy.core.relational.Relational):
        return _sum_digits(expr.args, True)
    if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Tuple, sympy.FiniteSet, sympy.Interval, sympy.Union)):
        return _sum_digits(expr.args, relation)
    return None


def _int_digits(n: int) -> int:
    """Decimal digits of `n`, at most one too many (from its bit length: str() refuses very long integers)."""
    return abs(n).bit_length() * 30103 // 100000 + 1


def _sum_digits(args: tuple[Any, ...], relation: bool) -> int | None:
    total = 0
    for arg in args:
        d = _digits(arg, relation)
        if d is None or total + d > MAX_DIGITS:
            return None
        total += d
    return total


def bounded_expression(expr: Any) -> bool:
    """Whether math_verify may compare the parsed `expr`: a string, or a sympy expression of the allowed kinds
    (numbers, symbols, pi, e, i, + - * /, powers with a small rational exponent, relations polynomial in their
    variables, tuples, sets, intervals; no function: sympy's simplification of log(7)*y - 10**12, for one, computed
    a power with a 13-digit exponent for minutes) with at most MAX_NODES nodes, MAX_FREE_SYMBOLS variables,
    MAX_DIGITS digits (`_digits`) and MAX_TERMS terms (`_terms`)."""
    import sympy

    if isinstance(expr, str):
        return True
    if not isinstance(expr, sympy.Basic) or sum(1 for _ in sympy.preorder_traversal(expr)) > MAX_NODES:
        return False
    if len(expr.free_symbols) > MAX_FREE_SYMBOLS:
        return False
    d = _digits(expr)
    return d is not None and d <= MAX_DIGITS and _terms(expr) <= MAX_TERMS


def _terms(expr: Any) -> int:
    """An upper bound of the terms of `expr` expanded as a polynomial in its symbols (a sum adds, a product
    multiplies, a power multiplies its base that many times; a number or a symbol-free part is one term): what
    sympy's simplification of a difference of such expressions may have to build."""
    import sympy

    if not getattr(expr, "free_symbols", None) or not expr.args:  # a number, a symbol-free part, a symbol
        return 1
    if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Rational):
        return _terms(expr.base) ** max(1, math.ceil(abs(expr.exp)))
    terms = [_terms(arg) for arg in expr.args]
    if isinstance(expr, sympy.Mul):
        return min(math.prod(terms), MAX_TERMS + 1)
    return min(sum(terms), MAX_TERMS + 1)


@lru_cache(maxsize=4096)
def _parsed(text: str) -> tuple[Any, ...] | None:
    """math_verify's parse of `text` as LaTeX, or None when it must not be parsed or compared (cached: a reference
    answer is parsed once, not once per sample)."""
    if not symbolic_candidate(text):
        return None
    from math_verify import parse

    try:
        found = parse(f"${text}$", parsing_timeout=None)  # type: ignore[arg-type]  # None: no signal.alarm
    except Exception:  # math_verify catches its own errors; anything else: not comparable
        return None
    if not found or not all(bounded_expression(e) for e in found):
        return None
    try:
        exact = [_exact(e) for e in found]
    except Exception:  # a float sympy cannot turn into a rational: not comparable
        return None
    return tuple(exact) if all(bounded_expression(e) for e in exact) else None


def _exact(expr: Any) -> Any:
    """`expr` with every float as the rational its decimal text says (0.5 -> 1/2): sympy's simplification of floats
    among radicals and variables spent minutes in floating-point gcds (the numbers are bounded: `_digits`)."""
    import sympy

    if isinstance(expr, str) or not (floats := expr.atoms(sympy.Float)):
        return expr
    return expr.xreplace({f: sympy.Rational(str(f)) for f in floats})


def symbolically_equal(extracted: str, expected: str, rel_tol: float) -> bool:
    """math_verify's verdict on two LaTeX answers that pass the bounds (`symbolic_candidate`, `bounded_expression`);
    False for any that does not, or when math_verify raises. Two numbers either of which is written with a decimal
    point (2\\pi and 6.283185307) are compared by value instead, within a relative `rel_tol`."""
    gold, pred = _parsed(expected), _parsed(extracted)
    if gold is None or pred is None:
        return False
    if "." in extracted + expected and (close := _values_close(gold[0], pred[0], rel_tol)) is not None:
        return close
    from math_verify import verify

    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=None))  # type: ignore[arg-type]
    except Exception:  # math_verify's own errors on odd input: not equal, never a failed item
        return False


def _values_close(a: Any, b: Any, rel_tol: float) -> bool | None:
    """Whether two real numbers (sympy expressions without variables) are within a relative `rel_tol`; None when
    either is not one."""
    import sympy

    if not all(isinstance(e, sympy.Expr) and not e.free_symbols for e in (a, b)):
        return None
    x, y = sympy.N(a, 30), sympy.N(b, 30)
    if not (x.is_real and y.is_real and x.is_finite and y.is_finite):
        return None
    return bool(abs(x - y) <= rel_tol * max(abs(x), abs(y)))
