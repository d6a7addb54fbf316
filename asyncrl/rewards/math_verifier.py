"""The math verifier: find the final answer in a chain of thought and compare it with the reference, numerically and,
failing that, symbolically (`asyncrl.rewards.math_symbolic`: HF's math_verify on bounded inputs).

Owns `extract_answer`, `reference_answer`, `parse_number`, `numbers_equal`, `unevaluated_arithmetic`, `answers_equal`
and `score_math`, the scorer the reward role serves for `task.verifier: math`. Pure: no I/O, no model, no signal;
safe to call from many threads at once (the reward role scores in a thread pool).

Invariants:
- the response is cut at the first end-of-sequence marker (`EOS_TEXT`) before anything is looked for; every pattern
  is read in time linear in the response (100 kB of digits or braces take milliseconds);
- extraction tries, in this order, and takes the first that finds something: the last `\\boxed{...}` with balanced
  braces ("boxed"), the last `#### X` ("hashes"), the last "answer is X" / "answer: X" in any case ("answer_is"),
  else the last number in the text ("last_number"); a form counts as "explicit" (the format component) for the
  first three only;
- two plain numbers (integers, decimals, negatives, thousands commas, simple and `\\frac` fractions, `$`, `%` and
  `\\text{...}` units ignored) are equal exactly when neither is a decimal, else within a relative REL_TOL; two plain
  numbers never go to the symbolic comparison, and an answer longer than MAX_ANSWER_CHARS is never compared;
- against a reference that is a plain number, an answer that is unevaluated arithmetic on numbers (digits,
  + - * / × ÷ \\times \\cdot \\div, brackets: "5 - 9", "(2+3)\\times 4") is wrong, never evaluated: such an
  answer restates the question (a policy learns to end with "the answer is 5 - 9" for 5 - 9 when it is accepted,
  measured); symbolic forms such as `2\\pi` or `\\sqrt{2}` still go to the symbolic comparison;
- reward = 1.0 * correct + format_weight * format; with format_weight 0 it is exactly 0.0 or 1.0;
- details = {"correct", "extracted", "method", "expected", "format"}, "extracted" at most MAX_ANSWER_CHARS characters.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from asyncrl.rewards.math_symbolic import symbolically_equal
from asyncrl.rewards.verifier import EOS_TEXT

MAX_ANSWER_CHARS = 200
"""An extracted answer longer than this is never compared (and `details["extracted"]` is cut to it)."""
REL_TOL = 1e-6
EXPLICIT_METHODS = frozenset({"boxed", "hashes", "answer_is"})

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"(?<!\\)[{}]")
_HASHES = re.compile(r"(?<!#)####(?!#)")
_ANSWER_IS = re.compile(r"\banswer(?:\s+is\b|\s*:)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_NUMBER_TEXT = r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?"
_LAST_NUMBER = re.compile(_NUMBER_TEXT)
_LEADING_NUMBER = re.compile(r"^\\?\$?\s*(" + _NUMBER_TEXT + r")\s+[A-Za-z]")
_UNITS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{[^{}]*\}")
_PLAIN = re.compile(r"([+-]?)(\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d+))?")
_SLASH = re.compile(r"([+-]?)(\d+)/(\d+)")
_LATEX_FRAC = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{([+-]?\d+)\}")
_ARITHMETIC = re.compile(r"[-+*/×÷·()\[\]{}\d.,]*\d[-+*/×÷·()\[\]{}\d.,]*")


@dataclass(frozen=True, slots=True)
class Extracted:
    """The final answer found in a response: its text and how it was found (both None: nothing found)."""

    text: str | None
    method: str | None


# ---- extraction ------------------------------------------------------------------------------------------------
def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` whose braces close, non-empty; one linear pass over the braces."""
    opens = [m.end() - 1 for m in _BOXED.finditer(text)]
    if not opens:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text, opens[0]):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closing[stack.pop()] = m.start()
    for start in reversed(opens):
        end = closing.get(start)
        if end is not None and text[start + 1:end].strip():
            return text[start + 1:end].strip()
    return None


def _phrase(text: str, start: int) -> str:
    """The answer written after a marker ending at `start`: the rest of its line, up to the end of the sentence;
    after the last '=' when there is one; only the number when a number is followed by words ("72 apples")."""
    end = text.find("\n", start)
    line = text[start:end if end >= 0 else len(text)][:8 * MAX_ANSWER_CHARS]
    stop = _SENTENCE_END.search(line)
    phrase = (line[:stop.start()] if stop else line).strip(" \t:")
    if "=" in phrase:
        phrase = phrase.rsplit("=", 1)[1].strip()
    phrase = phrase.rstrip(".,;: ")
    if parse_number(phrase) is None and (lead := _LEADING_NUMBER.match(phrase)):
        return lead.group(1)
    return phrase


def _last_after(pattern: re.Pattern[str], text: str) -> str | None:
    """The phrase after the last match of `pattern` that has one (each line is read at most twice)."""
    for m in reversed(list(pattern.finditer(text))):
        phrase = _phrase(text, m.end())
        if phrase:
            return phrase
    return None


def extract_answer(text: str) -> Extracted:
    """The final answer of `text` (cut at EOS), by the first method that finds one (module docstring)."""
    text = text.split(EOS_TEXT, 1)[0]
    if (boxed := _last_boxed(text)) is not None:
        return Extracted(boxed, "boxed")
    if (hashes := _last_after(_HASHES, text)) is not None:
        return Extracted(hashes, "hashes")
    if (said := _last_after(_ANSWER_IS, text)) is not None:
        return Extracted(said, "answer_is")
    last = collections.deque(_LAST_NUMBER.finditer(text), maxlen=1)
    return Extracted(last[0].group(), "last_number") if last else Extracted(None, None)


def reference_answer(answer: str) -> str:
    """The reference to compare with: what follows the last `####` of a GSM8K-style answer, else the whole answer;
    stripped."""
    return answer.rsplit("####", 1)[-1].strip()


# ---- numeric comparison ----------------------------------------------------------------------------------------
def _normalize(text: str) -> str:
    """`text` without what never changes a number: spaces, `$`, LaTeX spacing, `\\text{...}` units, `{,}`, a
    trailing '.' or '%', one pair of outer braces; the Unicode minus as '-'."""
    s = _UNITS.sub("", text).replace("\\$", "").replace("$", "").replace("{,}", ",").replace("\u2212", "-")
    for spacing in ("\\!", "\\,", "\\;", "\\:", "\\ ", "\\left", "\\right"):
        s = s.replace(spacing, "")
    s = "".join(s.split()).rstrip(".")
    for percent in ("\\%", "%"):
        s = s.removesuffix(percent)
    if s.startswith("{") and s.endswith("}") and "{" not in s[1:-1] and "}" not in s[1:-1]:
        s = s[1:-1]
    return s


def parse_number(text: str) -> tuple[Fraction, bool] | None:
    """(value, exact) of a plain number, or None: integers and fractions are exact, decimals are not. Accepts a
    sign, thousands commas, a decimal point, `a/b`, `\\frac{a}{b}` (also `\\dfrac`, `\\tfrac`) and the decorations
    `_normalize` removes; at most MAX_ANSWER_CHARS characters."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    s = _normalize(text)
    if (m := _PLAIN.fullmatch(s)) and (m.group(2) or m.group(3)):
        whole, decimals = (m.group(2) or "0").replace(",", ""), m.group(3)
        value = Fraction(int(whole)) + (Fraction(int(decimals), 10 ** len(decimals)) if decimals else 0)
        return (-value if m.group(1) == "-" else value), decimals is None and "." not in s
    if m := _SLASH.fullmatch(s) or _LATEX_FRAC.fullmatch(s):
        numerator, denominator = int(m.group(2)), int(m.group(3))
        if denominator == 0:
            return None
        value = Fraction(numerator, denominator)
        return (-value if m.group(1) == "-" else value), True
    return None


def numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Exactly equal when both are exact, else within a relative REL_TOL of the larger magnitude."""
    (x, x_exact), (y, y_exact) = a, b
    if x_exact and y_exact:
        return x == y
    return abs(x - y) <= Fraction(REL_TOL) * max(abs(x), abs(y))


def unevaluated_arithmetic(text: str) -> bool:
    """Whether `text` is arithmetic on numbers alone (digits, operators, brackets) that is not itself a plain number:
    `5 - 9`, `(2+3)\\times 4`; not `-4`, `\\frac{1}{2}`, `2\\pi`."""
    if len(text) > MAX_ANSWER_CHARS or parse_number(text) is not None:
        return False
    s = _normalize(text)
    for op in ("\\times", "\\cdot", "\\div"):
        s = s.replace(op, "*")
    return _ARITHMETIC.fullmatch(s) is not None


# ---- symbolic comparison ---------------------------------------------------------------------------------------
def _normalize_symbolic(text: str) -> str:
    """`text` for the LaTeX parser: without `$`, units in `\\text{...}` and a trailing '.'."""
    return _UNITS.sub("", text).replace("\\$", "").replace("$", "").strip().rstrip(".").strip()


# ---- the score -------------------------------------------------------------------------------------------------
def answers_equal(extracted: str, expected: str) -> bool:
    """Numerically when both are plain numbers (`parse_number`, `numbers_equal`); never when the reference is a plain
    number and the answer unevaluated arithmetic (`unevaluated_arithmetic`); else symbolically."""
    if len(extracted) > MAX_ANSWER_CHARS or len(expected) > MAX_ANSWER_CHARS:
        return False
    x, y = parse_number(extracted), parse_number(expected)
    if x is not None and y is not None:
        return numbers_equal(x, y)
    if y is not None and unevaluated_arithmetic(extracted):
        return False  # a restated question is not a final answer (module docstring)
    return symbolically_equal(_normalize_symbolic(extracted), _normalize_symbolic(expected), REL_TOL)


def score_math(response: str, answer: str, format_weight: float = 0.0) -> tuple[float, dict[str, Any]]:
    """The reward of `response` against the reference `answer` (`reference_answer` of it) and its details (module
    docstring): 1.0 for a correct answer plus `format_weight` when it was given in an explicit form."""
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight: expected 0..1, got {format_weight}")
    expected = reference_answer(answer)
    found = extract_answer(response)
    correct = found.text is not None and answers_equal(found.text, expected)
    explicit = found.method in EXPLICIT_METHODS
    reward = (1.0 if correct else 0.0) + (format_weight if explicit else 0.0)
    return reward, {"correct": correct, "extracted": None if found.text is None else found.text[:MAX_ANSWER_CHARS],
                    "method": found.method, "expected": expected, "format": explicit}
