"""The math verifier (asyncrl.rewards.math_verifier, asyncrl.rewards.math_symbolic): extraction in its order, numeric
and symbolic comparison, the format component, the bounds on what reaches sympy, the scorer choice
(asyncrl.rewards.custom.scorer_for) and the reward's components (asyncrl.rewards.components)."""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest

from asyncrl.config.schema import TaskConfig
from asyncrl.rewards.components import RewardComponents, combined_shares
from asyncrl.rewards.custom import is_correct, scorer_for
from asyncrl.rewards.math_symbolic import bounded_expression, symbolic_candidate
from asyncrl.rewards.math_verifier import (
    MAX_ANSWER_CHARS,
    Extracted,
    answers_equal,
    extract_answer,
    numbers_equal,
    parse_number,
    reference_answer,
    score_math,
    unevaluated_arithmetic,
)


# ---- extraction ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("so 3 + 4 = 7, hence \\boxed{7}.", Extracted("7", "boxed")),
    ("\\boxed{1} first, then \\boxed{\\frac{1}{2}} last", Extracted("\\frac{1}{2}", "boxed")),
    ("nested \\boxed{\\frac{\\sqrt{3}}{2}} ok", Extracted("\\frac{\\sqrt{3}}{2}", "boxed")),
    ("a set \\boxed{\\{1,2\\}}", Extracted("\\{1,2\\}", "boxed")),
    ("closed \\boxed{5} then cut \\boxed{6", Extracted("5", "boxed")),        # the last one that closes
    ("empty \\boxed{ } then 4", Extracted("4", "last_number")),
    ("\\boxed{3} beats #### 4 and the answer is 5", Extracted("3", "boxed")),
    ("She has 3 + 4 = 7 apples.\n#### 7", Extracted("7", "hashes")),
    ("#### 1,000\nthen 5", Extracted("1,000", "hashes")),
    ("#### 5\n#### 6", Extracted("6", "hashes")),
    ("#### 4 beats the answer is 5", Extracted("4", "hashes")),               # a number, then words: the number
    ("The answer is 42.", Extracted("42", "answer_is")),
    ("THE ANSWER IS: $1,250.50. Next 7", Extracted("$1,250.50", "answer_is")),
    ("Final answer: 3.5", Extracted("3.5", "answer_is")),
    ("the answer is 72 apples and 3 pears", Extracted("72", "answer_is")),
    ("the answer is 3 + 4 = 7", Extracted("7", "answer_is")),
    ("answer: 5\nno, the answer is 6\n", Extracted("6", "answer_is")),
    ("the answer is \\frac{1}{2}", Extracted("\\frac{1}{2}", "answer_is")),
    ("so 12 then 15 eggs", Extracted("15", "last_number")),
    ("costs $1,234.5 today", Extracted("1,234.5", "last_number")),
    ("it dropped to -3 degrees", Extracted("-3", "last_number")),
    ("from 5-3 we get", Extracted("3", "last_number")),                       # a minus between numbers: no sign
    ("half is 1/2.", Extracted("1/2", "last_number")),
    ("12 done<eos>13", Extracted("12", "last_number")),                        # cut at EOS first
    ("no number here", Extracted(None, None)),
    ("", Extracted(None, None)),
])
def test_extraction_order_and_forms(text: str, expected: Extracted) -> None:
    assert extract_answer(text) == expected


def test_reference_answer_is_after_the_last_hashes() -> None:
    assert reference_answer("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18") == "18"
    assert reference_answer("#### 1 #### 2 ") == "2"
    assert reference_answer(" 72 ") == "72"
    assert reference_answer("\\frac{1}{2}") == "\\frac{1}{2}"


# ---- numbers ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("72", (Fraction(72), True)), ("-72", (Fraction(-72), True)), ("+5", (Fraction(5), True)),
    ("1,000", (Fraction(1000), True)), ("1,234,567", (Fraction(1234567), True)), ("72.", (Fraction(72), True)),
    ("0.5", (Fraction(1, 2), False)), (".25", (Fraction(1, 4), False)), ("-1,000.25", (Fraction(-4001, 4), False)),
    ("3/4", (Fraction(3, 4), True)), ("-6/8", (Fraction(-3, 4), True)), ("\\frac{1}{2}", (Fraction(1, 2), True)),
    ("-\\dfrac{3}{4}", (Fraction(-3, 4), True)), ("\\tfrac{-1}{3}", (Fraction(-1, 3), True)),
    ("$72", (Fraction(72), True)), ("\\$ 72", (Fraction(72), True)), ("50\\%", (Fraction(50), True)),
    ("50%", (Fraction(50), True)), ("72 \\text{ dollars}", (Fraction(72), True)), ("{72}", (Fraction(72), True)),
    ("1{,}000", (Fraction(1000), True)), ("\u22123", (Fraction(-3), True)),
])
def test_parse_number(text: str, value: tuple[Fraction, bool]) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1,00", "1/0", "\\frac{1}{0}", "2x", "1e3", "1.2.3", "--1", "7" * 201])
def test_not_a_plain_number(text: str) -> None:
    assert parse_number(text) is None


def test_number_comparison_exact_and_relative() -> None:
    exact = (Fraction(1, 3), True)
    assert numbers_equal(exact, (Fraction(1, 3), True))
    assert not numbers_equal(exact, (Fraction(333333, 1000000), True))
    assert numbers_equal((Fraction(1000000), True), (Fraction(10000005, 10), False))       # 5e-7 relative
    assert not numbers_equal((Fraction(1000000), True), (Fraction(10000011, 10), False))   # 1.1e-6 relative
    assert numbers_equal((Fraction(0), True), (Fraction(0), False))
    assert not numbers_equal((Fraction(0), True), (Fraction(1, 10**9), False))


@pytest.mark.parametrize("extracted, expected, equal", [
    ("1,000", "1000", True), ("0.5", "1/2", True), ("$72", "72", True), ("72.", "72", True), ("72.0", "72", True),
    ("\\frac{1}{2}", "0.5", True), ("-3", "-3", True), ("3", "-3", False), ("71", "72", False),
    ("0.33333", "1/3", False), ("0.3333333", "1/3", True),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{3}{2\\sqrt{3}}", True), ("x^2+2x+1", "(x+1)^2", True),
    ("2\\pi", "\\pi+\\pi", True), ("\\{1,2\\}", "\\{2,1\\}", True), ("[0,\\infty)", "[0,\\infty)", True),
    ("\\sqrt{2}", "1.5", False), ("x+1", "x+2", False),
    ("2\\pi", "6.283185307", True), ("2\\pi", "6.2832", False), ("1.41421356", "\\sqrt{2}", True),
    ("0.5x", "\\frac{x}{2}", True), ("(10+0.5)\\sqrt{x}", "\\frac{21}{2}\\sqrt{x}", True),
    # the question restated is not a final answer, though it evaluates to the reference
    ("5 - 9", "-4", False), ("88 + 94 - 83", "99", False), ("(2+3)\\times 4", "20", False), ("6/2*3", "9", False),
    ("2 \\cdot 3", "6", False), ("[4 - 1]", "3", False),
])
def test_answers_equal(extracted: str, expected: str, equal: bool) -> None:
    assert answers_equal(extracted, expected) is equal


@pytest.mark.parametrize("text, arithmetic", [
    ("5 - 9", True), ("(2+3)\\times 4", True), ("1 ÷ 2", True), ("-4", False), ("1,000", False), ("\\frac{1}{2}", False),
    ("2\\pi", False), ("x+1", False), ("", False), ("+", False),
])
def test_unevaluated_arithmetic(text: str, arithmetic: bool) -> None:
    assert unevaluated_arithmetic(text) is arithmetic


def test_a_policy_restating_the_question_scores_zero() -> None:
    # verbatim from a 13-step run whose held-out accuracy jumped from 0.18 to 0.74 while the verifier accepted it
    reward, details = score_math("5 - 9 = -2\n\nSo, the answer is 5 - 9.", "-4")
    assert reward == 0.0 and details["extracted"] == "5 - 9" and details["method"] == "answer_is"
    assert score_math("5 - 9 = -4\n\nSo, the answer is -4.", "-4")[0] == 1.0


# ---- the score -------------------------------------------------------------------------------------------------
def test_score_details_and_reward() -> None:
    assert score_math("Step 1: 3 + 4 = 7.\nThe answer is \\boxed{7}.", "#### 7") == (1.0, {
        "correct": True, "extracted": "7", "method": "boxed", "expected": "7", "format": True})
    assert score_math("3 + 4 = 8", "7") == (0.0, {
        "correct": False, "extracted": "8", "method": "last_number", "expected": "7", "format": False})
    assert score_math("I do not know", "7") == (0.0, {
        "correct": False, "extracted": None, "method": None, "expected": "7", "format": False})
    assert score_math("so 7", "7", 0.25) == (1.0, {
        "correct": True, "extracted": "7", "method": "last_number", "expected": "7", "format": False})
    assert score_math("#### 8", "7", 0.25) == (0.25, {
        "correct": False, "extracted": "8", "method": "hashes", "expected": "7", "format": True})
    assert score_math("the answer is 7", "7", 0.25)[0] == 1.25
    assert score_math("\\boxed{\\frac{1}{2}}", "0.5")[0] == 1.0
    with pytest.raises(ValueError, match=r"^format_weight: expected 0\.\.1, got 1\.5$"):
        score_math("7", "7", 1.5)


def test_a_long_extracted_answer_is_cut_and_never_compared() -> None:
    reward, details = score_math("#### " + "7" * 300, "7" * 300)
    assert reward == 0.0 and details["extracted"] == "7" * MAX_ANSWER_CHARS and details["method"] == "hashes"


@pytest.mark.parametrize("response", [
    "7" * 100_000, "{" * 100_000, "}" * 100_000, "\\boxed{" * 15_000, "\\boxed{" + "{" * 50_000 + "8",
    "answer is " * 10_000, "####" * 25_000, "#### \n" * 20_000, "-1," * 30_000, "1/" * 50_000, "(" * 100_000,
    "\\boxed{9^{9^{9^9}}}", "\\boxed{10^{10^{10}}}", "\\boxed{\\binom{99999999}{49999999}}",
    "\\boxed{\\gcd(10^{10^{10}}, 6)}", "\\boxed{99999999!}", "\\boxed{\\sum_{i=1}^{10^{10}} i}",
    "\\boxed{(a+b+c+d+e+f+g+h)^8}", "\\boxed{(10^{1000})^{1000}}", "\\boxed{" + "(" * 40 + "1" + ")" * 40 + "}",
])
def test_pathological_input_returns_quickly(response: str) -> None:
    score_math("\\boxed{x}", "y")  # math_verify imported and warm: the timing below is the input's alone
    start = time.monotonic()
    reward, details = score_math(response, "(a+b+c+d+e+f+g+h)^7" if "a+b" in response else "7")
    assert time.monotonic() - start < 10.0  # under 1 s on an idle core; each took minutes (or forever) unbounded
    assert reward == 0.0 and details["correct"] is False


def test_symbolic_bounds() -> None:
    assert symbolic_candidate("\\frac{\\sqrt{3}}{2}") and symbolic_candidate("x^2+2x+1")
    for text in ["", "x" * 101, "\\binom{5}{2}", "7!", "\\gcd(4, 6)", "gcd(4,6)", "__import__", "\\sum_{i=1}^{3} i",
                 "{" * 9 + "1" + "}" * 9, "72 dollars", "\u03c0", "\\log(7)", "\\sin(x)"]:
        assert not symbolic_candidate(text), text
    import sympy

    x, y, z = sympy.symbols("x y z")
    assert bounded_expression((x + 1) ** 6) and bounded_expression("text")
    assert bounded_expression(sympy.Eq(x**2 + 2 * x, 3)) and bounded_expression(sympy.sqrt(2) / 2)
    assert not bounded_expression(sympy.Pow(10, sympy.Pow(10, 10, evaluate=False), evaluate=False))
    assert not bounded_expression(sympy.Pow(x + y + 1, 8, evaluate=False))       # 3**8 terms
    assert not bounded_expression(sympy.sin(x)) and not bounded_expression(sympy.sin(2))  # no function at all:
    assert not bounded_expression(sympy.log(7) * y - 10**12)  # sympy's logcombine raised 7 to a 13-digit power
    assert not bounded_expression(sympy.Eq(sympy.sqrt(x), 3))                     # a root of a variable, solved
    assert not bounded_expression(sympy.Eq(z - 10, 10 - (7 + z) ** -3 - y))        # 10 s of CPU to solve
    assert not bounded_expression(sympy.Eq(x**5, 3)) and bounded_expression(sympy.Eq(x**4 + y**4, 1))
    assert not bounded_expression(x + y + z)                                      # three variables
    assert not bounded_expression(sympy.factorial(5, evaluate=False))
    assert not bounded_expression(sympy.Matrix([1]))


def test_scores_from_many_threads_at_once() -> None:
    """The reward role scores in a thread pool: math_verify must never reach signal.alarm (main thread only)."""
    results: list[tuple[float, bool]] = []
    lock = threading.Lock()

    def work() -> None:
        for response in ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\boxed{x^2+2x+1}", "#### 7"):
            reward, details = score_math(response, "\\frac{3}{2\\sqrt{3}}" if "sqrt" in response else
                                         "(x+1)^2" if "x" in response else "7")
            with lock:
                results.append((reward, details["correct"]))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [(1.0, True)] * 12


# ---- the choice of scorer and the components -------------------------------------------------------------------
def test_scorer_for_picks_by_the_verifier_not_the_task_name() -> None:
    exact = scorer_for(TaskConfig())
    assert exact("arithmetic", "", "7<eos>", "7")[0] == 1.0
    assert exact("arithmetic", "", "so \\boxed{7}", "7")[0] == 0.0
    math = scorer_for(TaskConfig(verifier="math", format_reward=0.5))
    assert math("arithmetic", "", "so \\boxed{7}", "7") == (1.5, {
        "correct": True, "extracted": "7", "method": "boxed", "expected": "7", "format": True})
    with pytest.raises(ValueError, match=r"^expected 'arithmetic' \(this run's task.name\), got 'gsm8k'$"):
        math("gsm8k", "", "7", "7")


def test_task_verifier_config() -> None:
    assert TaskConfig().resolved_verifier() == "exact"
    assert TaskConfig(verifier="math").resolved_verifier() == "math"
    for bad in ({"format_reward": 0.1}, {"verifier": "exact", "format_reward": 0.1}):
        with pytest.raises(ValueError, match=r"task\.format_reward: only with the math verifier .*resolves to exact"):
            TaskConfig(**bad)
    with pytest.raises(ValueError, match=r"less than 1"):
        TaskConfig(verifier="math", format_reward=1.0)
    with pytest.raises(ValueError, match=r"greater than or equal to 0"):
        TaskConfig(verifier="math", format_reward=-0.1)


def test_correct_means_correct_not_a_format_bonus() -> None:
    assert is_correct(0.5, {"correct": False, "format": True}) is False
    assert is_correct(1.0, {"correct": True}) is True
    assert is_correct(1.0, {}) is True and is_correct(0.9, {}) is False


def test_components_count_per_sample_and_combine_over_writers() -> None:
    one, two = RewardComponents(), RewardComponents()
    assert one.metrics() == {}
    for details in ({"correct": True, "format": True}, {"correct": False, "format": True},
                    {"correct": False, "format": False}, {"correct": True, "format": False}):
        one.add(details)
    two.add({"correct": True, "parsed": "7", "expected": "7", "reason": "correct"})  # exact match: no format
    two.add({"reward_fn": "m:f"})                                                    # says nothing: not counted
    assert one.metrics() == {"rollout/verified_samples": 4.0, "rollout/correct_samples": 2.0,
                             "rollout/format_checked_samples": 4.0, "rollout/format_samples": 2.0,
                             "reward/correct": 0.5, "reward/format": 0.5}
    assert two.metrics() == {"rollout/verified_samples": 1.0, "rollout/correct_samples": 1.0, "reward/correct": 1.0}
    summed: dict[str, float] = {}
    for m in (one.metrics(), two.metrics()):
        for k, v in m.items():
            summed[k] = summed.get(k, 0.0) + v
    assert combined_shares(summed) == {"reward/correct": 0.6, "reward/format": 0.5}
