"""The math verifier: extraction rules and their priority, math-verify equivalence, the numeric fast
path, peers' known bugs, worker threads, signal timers and deadlines, and the registered `math` reward.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from hone.rewards.math import math_verifier
from hone.rewards.registry import REWARDS
from hone.rewards.scoring import RewardComponent, RewardScorer, reward_failed
from hone.types import Rollout, Sample
from hone.verifiers import math as math_module
from hone.verifiers.budget import CompareTimeout, deadline
from hone.verifiers.math import MAX_ANSWER_CHARS, extract_answer, math_reward, top_answer_share

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def case(case_id: str, response: str, answer: str, expected: float) -> object:
    return pytest.param(response, answer, expected, id=case_id)


CASES = [
    # --- \boxed and friends ---
    case("boxed-int", r"So the total is $\boxed{42}$.", "42", 1.0),
    case("boxed-wrong-int", r"\boxed{41}", "42", 0.0),
    case("boxed-nested-braces-frac", r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    case("boxed-frac-vs-frac", r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
    case("boxed-dfrac", r"\boxed{\dfrac{3}{4}}", "0.75", 1.0),
    case("boxed-frac12-shorthand", r"\boxed{\frac12}", "0.5", 1.0),
    case("boxed-decimal-vs-latex-gold", r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    case("boxed-last-wins", r"First \boxed{3}; on reflection \boxed{5}.", "5", 1.0),
    case("boxed-last-wins-earlier-is-not-credited", r"First \boxed{3}; on reflection \boxed{5}.", "3", 0.0),
    case("boxed-doubly-boxed", r"\boxed{\boxed{5}}", "5", 1.0),
    case("boxed-doubly-boxed-frac", r"\boxed{\boxed{\frac{2}{3}}}", r"\frac{2}{3}", 1.0),
    case("boxed-box-inside-equation", r"\boxed{x = \boxed{5}}", "5", 1.0),
    case("fbox", r"\fbox{7}", "7", 1.0),
    case("fbox-after-boxed-is-last", r"\boxed{1} then \fbox{2}", "2", 1.0),
    case("boxed-space-no-braces", r"$\boxed 5$", "5", 1.0),
    case("boxed-space-no-braces-period", r"The answer: \boxed 12.", "12", 1.0),
    case("boxed-space-not-beating-later-box", r"\boxed 3 then \boxed{5}", "5", 1.0),
    case("boxed-space-before-brace", r"\boxed {8}", "8", 1.0),
    case("boxed-in-display-math-negative", r"$$\boxed{-2}$$", "-2", 1.0),
    case("boxed-bold", r"\boxed{\mathbf{5}}", "5", 1.0),
    case("boxed-text-choice", r"\boxed{\text{(B)}}", "B", 1.0),
    case("boxed-text-choice-wrong", r"\boxed{\text{(C)}}", "B", 0.0),
    case("boxed-empty", r"\boxed{} and the result is 5", "5", 0.0),
    case("boxed-unclosed-truncated", r"so the answer is \boxed{12", "12", 0.0),
    case("boxed-unclosed-last-does-not-fall-back", r"\boxed{12} wait, \boxed{1", "12", 0.0),
    case("boxed-beats-answer-is-and-final-number", r"\boxed{5}. The answer is 6, not 7", "5", 1.0),
    case("gold-boxed", r"\boxed{6}", r"\boxed{6}", 1.0),
    case("gold-math-solution", "x = 0.25", r"Thus $x=\boxed{\frac{1}{4}}$.", 1.0),
    case("gold-latex-not-reextracted", r"\boxed{2}", r"\frac{1}{2}", 0.0),
    # --- sets, intervals, tuples ---
    case("set-order", r"\boxed{\{2,1\}}", r"\{1,2\}", 1.0),
    case("set-extra-element", r"\boxed{\{1,2,3\}}", r"\{1,2\}", 0.0),
    case("solutions-list-unordered", r"\boxed{3, -1}", "-1, 3", 1.0),
    case("interval-half-open", r"\boxed{(0,1]}", "(0,1]", 1.0),
    case("interval-wrong-bracket", r"\boxed{[0,1]}", "(0,1]", 0.0),
    case("interval-gold-with-space", r"\boxed{[0,1)}", "[0, 1)", 1.0),
    case("interval-infinity", r"\boxed{(-\infty, 3]}", r"(-\infty,3]", 1.0),
    # --- a closed form equal to the reference is a correct answer, as in math-verify, verl and TRL
    # (`require_evaluated` refuses these for arithmetic tasks: REQUIRE_EVALUATED_CASES) ---
    case("closed-form-power", r"\boxed{2^{10}}", "1024", 1.0),
    case("closed-form-unreduced-fraction", r"\boxed{\frac{6}{4}}", "3/2", 1.0),
    case("closed-form-root", r"\boxed{\sqrt{16}}", "4", 1.0),
    case("closed-form-product", r"\boxed{3 \cdot 5}", "15", 1.0),
    case("closed-form-sum", r"\boxed{67+37}", "104", 1.0),
    case("closed-form-wrong-value", r"\boxed{9 \times 9}", "80", 0.0),
    # --- a calculation then its value: the final value is the answer (a SmolLM2 GRPO run learned to
    # write "The answer is 67 - 37, which is 7." and scored 1 when `67 - 37` was taken as the answer) ---
    case("calculation-which-is-wrong-value", "The answer is 67 - 37, which is 7.", "30", 0.0),
    case("calculation-which-is-its-value", "The answer is 67 - 37, which is 7.", "7", 1.0),
    case("calculation-which-equals-value", "The answer is 9 \\times 9 which equals 81 apples.", "81", 1.0),
    case("calculation-equals-value", "The answer is 67 - 37 = 30", "30", 1.0),
    case("calculation-equals-wrong-value", "The answer is 67 - 37 = 7", "30", 0.0),
    case("done-after-equals", "The answer is $67 - 37 = 30$.", "30", 1.0),
    case("scientific-notation-is-a-number", r"\boxed{1.5 \times 10^{3}}", "1500", 1.0),
    case("expression-reference-still-symbolic", r"\boxed{x+1}", "1+x", 1.0),
    # --- units, currency, percentages ---
    case("units-text-cm", r"\boxed{5\text{ cm}}", "5", 1.0),
    case("units-mbox", r"\boxed{8 \mbox{ inches}}", "8", 1.0),
    case("units-degrees", r"\boxed{90^\circ}", "90", 1.0),
    case("dollars-escaped", r"\boxed{\$5}", "5", 1.0),
    case("dollars-thousands-cents", r"\boxed{\$1,234.50}", "1234.5", 1.0),
    case("percent-vs-decimal", r"\boxed{50\%}", "0.5", 1.0),
    case("percent-vs-its-number-math-verify-leniency", r"\boxed{50\%}", "50", 1.0),
    case("decimal-percent-not-its-number", r"\boxed{0.5\%}", "0.5", 0.0),
    # --- symbolic ---
    case("sqrt-simplified", r"\boxed{2\sqrt{3}}", r"\sqrt{12}", 1.0),
    case("pi-over-two", r"\boxed{\pi/2}", r"\frac{\pi}{2}", 1.0),
    case("pi-approximation-wrong", r"\boxed{3.14}", r"\pi", 0.0),
    case("polynomial-expanded", r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    case("assignment-vs-value", r"\boxed{x = 5}", "5", 1.0),
    case("matrix", r"\boxed{\begin{pmatrix}1\\2\end{pmatrix}}", r"\begin{pmatrix}1\\2\end{pmatrix}", 1.0),
    case("float-six-places-vs-fraction", r"\boxed{0.333333}", r"\frac{1}{3}", 1.0),
    case("float-three-places-vs-fraction", r"\boxed{0.333}", r"\frac13", 0.0),
    # --- GSM8K #### ---
    case("gsm8k", "16 - 3 = 13 eggs are left.\n#### 13", "13", 1.0),
    case("gsm8k-wrong", "#### 17", "18", 0.0),
    case("gsm8k-thousands", "#### 1,000", "1000", 1.0),
    case("gsm8k-currency", "#### $18", "18", 1.0),
    case("gsm8k-beats-later-numbers", "#### 18\nCheck: 9 + 9 = 18 and 9 * 11 = 99", "18", 1.0),
    case("gsm8k-gold-full-solution", "#### 72", GSM8K_SOLUTION, 1.0),
    case("gsm8k-markdown-heading-is-not-an-answer", "#### Step 1\n3 + 4 = 7", "7", 1.0),
    case("gsm8k-numbered-heading-is-not-an-answer", "#### 2. Solve\nx = 5", "5", 1.0),
    case("boxed-beats-gsm8k", "\\boxed{5}\n#### 6", "5", 1.0),
    # --- "the answer is" ---
    case("answer-is-period", "The answer is 42.", "42", 1.0),
    case("answer-is-uppercase", "so THE ANSWER IS 7", "7", 1.0),
    case("answer-is-last-wins", "The answer is 3? No, the answer is 4.", "4", 1.0),
    case("answer-is-decimal-vs-fraction", "The answer is 3.5.", "7/2", 1.0),
    case("answer-is-latex", r"The final answer is $\frac{3}{4}$.", "0.75", 1.0),
    case("answer-is-beats-later-numbers", "The answer is 12. Check: 3 + 9 = 12, and 12 - 3 = 9.", "12", 1.0),
    case("answer-colon", "Answer: 17", "17", 1.0),
    case("answer-colon-markdown-bold", "**Answer:** 17", "17", 1.0),
    case("answer-is-bold", "The answer is **42**.", "42", 1.0),
    case("answer-is-choice", "The answer is (B).", "B", 1.0),
    case("answer-is-with-units", "The answer is 42 apples.", "42", 1.0),
    case("answer-is-percent", "The answer is 25%.", "0.25", 1.0),
    case("answer-is-dollar-delimited-negative", "The answer is $-7$.", "-7", 1.0),
    case("answer-is-empty-falls-back-to-number", "The answer is\n42", "42", 1.0),
    # --- the last number ---
    case("final-number", "3 + 4 = 7", "7", 1.0),
    case("final-number-bare-equals-gold", "42", "42", 1.0),
    case("final-number-mid-text-mention-loses", "I first guessed 42, but the result is 41", "42", 0.0),
    case("final-number-negative", "The temperature drops to -5 degrees", "-5", 1.0),
    case("final-number-unicode-minus", "x = \u22123", "-3", 1.0),
    case("final-number-binary-minus-is-not-a-sign", "we compute 10-3", "-3", 0.0),
    case("final-number-thousands", "They raised 1,250,000 dollars in total", "1250000", 1.0),
    case("final-number-trailing-period", "Each costs 2.50.", "2.5", 1.0),
    case("final-number-fraction", "so x = 1/2", "0.5", 1.0),
    case("final-number-percent", "The discount is 50%", "0.5", 1.0),
    case("final-number-plus-sign", "+5", "5", 1.0),
    case("zero-padded-response", "045+367=0412", "412", 1.0),
    case("zero-padded-gold", "412", "0412", 1.0),
    case("fast-path-negative-decimal-vs-fraction", "-0.50", "-1/2", 1.0),
    case("fast-path-is-exact", "0.3333333", "0.333333", 0.0),
    case("wrong-number", r"\boxed{12}", "13", 0.0),
    # --- nothing to extract, pathological input ---
    case("no-answer-i-dont-know", "I don't know", "42", 0.0),
    case("no-answer-response-equals-gold-text", "x+y", "x+y", 0.0),
    case("empty-response", "", "5", 0.0),
    case("whitespace-response", "  \n\t ", "0", 0.0),
    case("gigantic-response-boxed-at-end", "blah " * 200_000 + r"\boxed{7}", "7", 1.0),
    case("gigantic-number-over-length-cap", "1" * 5000, "1" * 5000, 0.0),
    case("long-boxed-answer-over-length-cap", r"\boxed{" + "1+" * 600 + "1}", "601", 0.0),
    case("exponent-tower-not-evaluated", r"\boxed{9^{9^{9^9}}}", "5", 0.0),
    case("exponent-tower-equal-as-string", r"\boxed{10^{10^{10}}}", "10^{10^{10}}", 1.0),
    # --- prose after the answer, and markdown headings (found in review) ---
    case("answer-is-then-which-clause", "The answer is 18, which is the total.", "18", 1.0),
    case("answer-is-then-because", "The answer is 18 because 9 times 2 is 18.", "18", 1.0),
    case(
        "answer-is-word-gives-way-to-number", "I think the answer is correct. So the total is 18.", "18", 1.0
    ),
    case("bold-heading-is-not-gsm8k-marker", "#### **Final Answer**\nThe total is $18.", "18", 1.0),
    case("h5-heading-is-not-gsm8k-marker", "##### Step 3: add\n3+15 = 18", "18", 1.0),
    case("word-answer-kept-when-nothing-else", "The answer is B", "B", 1.0),
]


@pytest.mark.parametrize(("response", "answer", "expected"), CASES)
def test_math_reward_table(response: str, answer: str, expected: float) -> None:
    assert math_reward(response, answer) == expected


# `require_evaluated=True` (the arithmetic and word-problem tasks): a numeric reference is matched only
# by a number written out; math-verify would evaluate the rest and call it equal.
REQUIRE_EVALUATED_CASES = [
    case("undone-power", r"\boxed{2^{10}}", "1024", 0.0),
    case("undone-unreduced-latex-fraction", r"\boxed{\frac{6}{4}}", "3/2", 0.0),
    case("undone-root", r"\boxed{\sqrt{16}}", "4", 0.0),
    case("undone-cdot", r"\boxed{3 \cdot 5}", "15", 0.0),
    case("undone-boxed-sum", r"\boxed{67+37}", "104", 0.0),
    case("undone-times", r"\boxed{9 \times 9}", "81", 0.0),
    case("undone-x", "The answer is 7 x 16.", "112", 0.0),
    case("undone-factorial", r"\boxed{5!}", "120", 0.0),
    case("undone-division-as-plain-fraction", "The answer is 60/2.", "30", 0.0),
    case("undone-denominator-one", "30/1", "30", 0.0),
    case("undone-parenthesised-division", r"\boxed{(60)/2}", "30", 0.0),
    # A division is a number only as a fraction of integers in lowest terms.
    case("undone-decimal-over-integer", "The answer is 4.5/9", "0.5", 0.0),
    case("undone-spaced-decimal-division", r"\boxed{1.5 / 3}", "0.5", 0.0),
    case("undone-latex-decimal-fraction", r"\boxed{\frac{1.5}{3}}", "0.5", 0.0),
    case("undone-division-by-a-decimal", r"\boxed{3/4.0}", "0.75", 0.0),
    case("undone-decimal-over-one", r"\boxed{0.5/1}", "0.5", 0.0),
    case("undone-chained-division", r"\boxed{1/2/1}", "0.5", 0.0),
    case("undone-signed-unreduced-latex-fraction", r"\boxed{\frac{-2}{4}}", "-0.5", 0.0),
    case("undone-unreduced-shorthand-fraction", r"\boxed{\dfrac24}", "0.5", 0.0),
    case("done-after-equals", "The answer is $67 - 37 = 30$.", "30", 1.0),
    case("done-boxed-equation", r"\boxed{67 - 37 = 30}", "30", 1.0),
    case("done-value-after-which-is", "The answer is 67 - 37, which is 7.", "7", 1.0),
    case("done-reduced-fraction", "3/2", "1.5", 1.0),
    case("done-reduced-latex-fraction", r"\boxed{\frac{3}{2}}", "1.5", 1.0),
    case("done-signed-latex-fraction", r"\boxed{\frac{-1}{2}}", "-0.5", 1.0),
    case("done-shorthand-fraction", r"\boxed{\dfrac12}", "0.5", 1.0),
    case("done-value-after-a-decimal-division", "The answer is 4.5/9, which is 0.5.", "0.5", 1.0),
    case("done-slash-in-units-is-no-division", r"\boxed{60 \text{ km/h}}", "60", 1.0),
    case("done-negative", r"\boxed{-7}", "-7", 1.0),
    case("done-zero-padded", "045+367=0412", "412", 1.0),
    case("done-thousands-and-currency", r"\boxed{\$1,234.50}", "1234.5", 1.0),
    case("done-degrees-are-not-a-power", r"\boxed{90^\circ}", "90", 1.0),
    case("done-percent", r"\boxed{50\%}", "0.5", 1.0),
    case("scientific-notation-is-a-number", r"\boxed{1.5 \times 10^{3}}", "1500", 1.0),
    case("symbolic-reference-unaffected", r"\boxed{x+1}", "1+x", 1.0),
    case("symbolic-root-reference-unaffected", r"\boxed{2\sqrt{3}}", r"\sqrt{12}", 1.0),
]


@pytest.mark.parametrize(("response", "answer", "expected"), REQUIRE_EVALUATED_CASES)
def test_math_reward_require_evaluated_table(response: str, answer: str, expected: float) -> None:
    assert math_reward(response, answer, require_evaluated=True) == expected


@pytest.mark.parametrize(("response", "answer", "expected"), CASES)
def test_require_evaluated_only_ever_refuses(response: str, answer: str, expected: float) -> None:
    """The option takes credit away (arithmetic left undone), never gives it."""
    assert math_reward(response, answer, require_evaluated=True) <= expected


@pytest.mark.parametrize(
    ("response", "extracted"),
    [
        (r"\boxed{\frac{1}{2}} and later \fbox{\sqrt{2}}", r"\sqrt{2}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),
        (r"\boxed{a\\b}", r"a\\b"),
        (r"\boxed{\}}", r"\}"),
        ("#### $1,000\n", "1,000"),
        ("The answer is **$\\frac{1}{2}$**.", r"\frac{1}{2}"),
        ("The answer isn't obvious; it is 5", "5"),
        ("H2O and x2", None),
        ("pi is about 3.14.", "3.14"),
        # the final value of a calculation that the answer phrase evaluates
        ("The answer is 67 - 37, which is 7.", "7"),
        ("The answer is 67 - 37 = 30", "30"),
        ("The answer is $67 - 37 = 30$.", "30"),
        ("The answer is 2^{10} which equals 1024.", "1024"),
        ("The answer is 60/2, which is 3 \\times 10, which is 30, which is 3 tens.", "30"),
        # ... but a value stays the answer, and so does an equation with a variable
        ("The answer is 18, which is 2 times 9.", "18"),
        ("The answer is $\\pi$, which is about 3.14.", "\\pi"),
        ("The answer is x = 5, which is positive.", "x = 5"),
        (r"\boxed{}", None),
        ("", None),
    ],
)
def test_extract_answer(response: str, extracted: str | None) -> None:
    assert extract_answer(response) == extracted


def test_empty_reference_is_an_error_not_a_wrong_answer() -> None:
    with pytest.raises(ValueError, match="empty"):
        math_reward(r"\boxed{5}", "  ")


def test_plain_numbers_never_reach_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(pred: str, gold: str) -> bool:
        raise AssertionError(f"math-verify called for {pred!r} vs {gold!r}")

    monkeypatch.setattr(math_module, "_math_verify_equal", fail)
    assert math_reward("#### 1,000", "1000") == 1.0
    assert math_reward("The answer is -0.5.", "-1/2") == 1.0
    assert math_reward(r"\boxed{0412}", "413") == 0.0


def test_exponent_tower_is_fast() -> None:
    math_reward(r"\boxed{x}", "x")  # warm math-verify's parser up
    start = time.perf_counter()
    assert math_reward(r"\boxed{9^{9^{9^9}}}", "5") == 0.0
    assert math_reward(r"\boxed{(x+1)^{1000}}", "5") == 0.0
    assert time.perf_counter() - start < 2.0


SYMBOLIC_CASES = [
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{\{2,1\}}", r"\{1,2\}", 1.0),
    (r"\boxed{(0,1]}", "[0,1]", 0.0),
    (r"\boxed{2\sqrt{3}}", r"\sqrt{12}", 1.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    (r"\boxed{50\%}", "0.5", 1.0),
    ("#### 13", "13", 1.0),
    (r"\boxed{\pi}", "3.14", 0.0),
]


def test_works_in_worker_threads() -> None:
    """math-verify's signal-based timeouts raise ValueError off the main thread unless disabled."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: math_reward(c[0], c[1]), SYMBOLIC_CASES * 3))
    assert results == [expected for _, _, expected in SYMBOLIC_CASES * 3]


def test_works_in_a_plain_thread() -> None:
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(math_reward(r"\boxed{\dfrac{1}{2}}", "0.5")))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_leaves_a_pending_interval_timer_alone() -> None:
    """math-verify's `signal.alarm(0)` would cancel a runner's own timer; it must survive a call."""
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 60.0)
        assert math_reward(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.0 < remaining <= 60.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
    assert fired == []


def rollout(text: str, sample_id: str = "s1") -> Rollout:
    return Rollout(sample_id, 0, [1, 2, 3], 2, [1], [0.0], response_text=text)


def test_registered_factory_scores_rollouts() -> None:
    assert REWARDS["math"] is math_verifier
    reward = REWARDS["math"]()
    sample = Sample("s1", prompt="1/2 as a decimal?", answer="0.5")
    assert reward(rollout(r"\boxed{\frac{1}{2}}"), sample) == 1.0
    assert reward(rollout(r"\boxed{\frac{1}{3}}"), sample) == 0.0


def test_registered_factory_takes_require_evaluated() -> None:
    sample = Sample("s1", prompt="What is 2^10?", answer="1024")
    assert REWARDS["math"]()(rollout(r"\boxed{2^{10}}"), sample) == 1.0
    assert REWARDS["math"](require_evaluated=True)(rollout(r"\boxed{2^{10}}"), sample) == 0.0
    assert REWARDS["math"](require_evaluated=True)(rollout(r"\boxed{1024}"), sample) == 1.0
    with pytest.raises(ValueError, match="require_evaluated must be true or false, got 'yes'"):
        REWARDS["math"](require_evaluated="yes")


def test_answer_field_reads_meta() -> None:
    reward = REWARDS["math"](answer_field="target")
    sample = Sample("s2", prompt="q", answer="wrong", meta={"target": 72})  # a number, as JSON loads it
    assert reward(rollout("#### 72", "s2"), sample) == 1.0


@pytest.mark.parametrize(
    ("sample", "answer_field", "where"),
    [
        (Sample("gsm-17", prompt="q"), None, "answer"),
        (Sample("gsm-17", prompt="q", answer=" "), None, "answer"),
        (Sample("gsm-17", prompt="q", answer="5"), "target", "meta\\['target'\\]"),
    ],
)
def test_missing_reference_names_the_sample(sample: Sample, answer_field: str | None, where: str) -> None:
    reward = REWARDS["math"](answer_field=answer_field)
    with pytest.raises(ValueError, match=f"'gsm-17'.*{where}"):
        reward(rollout(r"\boxed{5}", "gsm-17"), sample)


def test_length_cap_is_a_thousand_chars() -> None:
    assert MAX_ANSWER_CHARS == 1000
    assert math_reward(r"\boxed{" + "1" * MAX_ANSWER_CHARS + "}", "1" * MAX_ANSWER_CHARS) == 1.0


def test_grading_off_the_main_thread_logs_no_timeout_warning(caplog: pytest.LogCaptureFixture) -> None:
    import threading

    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = False  # the warning is once per process: re-arm it
    math_verify.parser.TIMEOUT_WARNING_SHOWN = False
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(math_reward("\\boxed{\\frac{1}{2}}", "0.5")))
    with caplog.at_level("WARNING"):
        thread.start()
        thread.join()
    assert results == [1.0]
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


# sympy computes this binomial exactly: minutes. Not caught by `_too_costly` (no huge power or factorial).
PATHOLOGICAL = r"\boxed{\binom{10^{9}}{5 \cdot 10^{8}}}"


def test_a_comparison_past_its_deadline_scores_0_off_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """math-verify's own (signal) timeouts cannot work in a worker thread; the comparison's deadline does."""
    monkeypatch.setattr(math_module, "COMPARE_TIMEOUT_S", 0.3)
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(math_reward(PATHOLOGICAL, "5")), daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(timeout=20)
    assert results == [0.0]
    assert time.monotonic() - start < 10


def test_a_pathological_answer_is_graded_0_by_the_scorer_not_timed_out() -> None:
    """A scorer timeout leaves the rollout out of training; a slow answer is the response's doing, so the
    comparison's deadline (below the call's timeout) must come first and grade it."""
    scorer = RewardScorer([RewardComponent("math", REWARDS["math"]())], timeout_s=2.0)
    slow = rollout(PATHOLOGICAL)
    metrics = scorer.score([slow], {"s1": Sample("s1", prompt="?", answer="5")})
    assert metrics["reward/timeouts"] == 0.0 and metrics["reward/errors"] == 0.0
    assert not reward_failed(slow) and slow.reward == 0.0


def test_a_deadline_never_fires_after_its_block() -> None:
    """The deadline is an exception raised into the thread: once the block is left it must not arrive."""
    for _ in range(300):
        try:
            with deadline(0.0002):
                sum(range(500))
        except CompareTimeout:
            pass
        sum(range(2000))  # a late exception would be raised here, outside any handler


def test_top_answer_share_counts_the_most_common_final_answer() -> None:
    # a collapsed policy: "42" three ways (boxed, prose, last number) out of five responses
    responses = ["\\boxed{42}", "so the answer is 42.", "5 + 37 = 42", "\\boxed{7}", "I don't know"]
    assert top_answer_share(responses) == pytest.approx(3 / 5)
    assert top_answer_share(["\\boxed{1}", "\\boxed{2}", "no", "yes"]) == pytest.approx(1 / 4)
    assert top_answer_share(["  same words ", "same words"]) == 1.0  # no answer: the stripped text
    assert top_answer_share([]) == 0.0
