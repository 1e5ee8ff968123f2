"""Math answer verifier: extract the final answer from a response, then check it against the reference.

Equivalence is decided by Hugging Face's `math-verify` (`parse` + `verify`, the checker behind Open R1
and lighteval's MATH metrics): fractions vs decimals (`0.5` = `\\frac12`), LaTeX (`\\dfrac`, `\\sqrt`,
`\\pi`), sets in any order, intervals with their brackets, units and `\\$` stripped, `x = 5` = `5`.
Two plain numbers (`42`, `-3.50`, `1,000`, `0412`, `3/4`) skip it: they are compared exactly with
`fractions.Fraction`: a whole `math_reward` call then takes ~16 µs instead of ~0.3–1 ms (measured on
this project's CPU; the demo scores 256 responses per step).

Extraction, first rule that applies wins (explicit answer markup beats prose, prose beats a guess):

1. `\\boxed{...}` / `\\fbox{...}` / `\\boxed 5`: the *last* top-level box, braces balanced (so
   `\\boxed{\\frac{1}{2}}` is whole), a box inside it unwrapped (`\\boxed{\\boxed{5}}` is `5`). Once a box
   appears this rule owns the answer: a last box that is empty or unclosed (a response cut at
   `max_new_tokens`) gives no answer, rather than falling back to a number the box may not contain.
2. GSM8K's `#### 42`: the rest of the line after the last `####`, markdown headings (`#### Step 1`,
   `#### 2. Solve`) skipped.
3. "the answer is X" / "answer: X" (any case): the last one; X runs to the end of its clause. When X
   is a calculation that the sentence goes on to evaluate, the final value counts: "the answer is
   67 - 37, which is 7" gives `7`, "the answer is 67 - 37 = 30" gives `30` (not `x = 5`: a variable).
4. The last number in the response (`-5`, `1,250`, `2.5`, `1/2`, `50%`).

Nothing found scores 0. The reference goes through rules 1–2 only, so a MATH `solution` or GSM8K
`answer` field works as is, while `\\frac{1}{2}` is not "extracted" again to its last number `2`.

Where this departs from peers, and why:
- The whole response is never compared with the reference. Scorers that `verify(parse(gold),
  parse(response))`, or string-compare the response when no box is found, reward answers the model
  never committed to (math-verify takes the first parseable expression it finds).
- Hendrycks-MATH-derived `remove_boxed` only strips `\\boxed{`, so an `\\fbox{7}` answer scores 0 (or
  trips an assert); `\\boxed{([^}]*)}` regexes cut `\\boxed{\\frac{1}{2}}` at the first `}`; checking
  for `"\\boxed "` anywhere before the last `\\boxed{` lets an earlier `\\boxed 3` win. Here one
  brace-balanced scanner handles all box forms and the last box wins.
- A closed form equal to the reference (`2^{10}`, `\\frac{6}{4}`, `\\sqrt{16}`, `3 \\cdot 5`) is a correct
  answer, as in math-verify, verl and TRL. Where computing is the point (the generated arithmetic and
  word-problem tasks) `require_evaluated=True` refuses arithmetic left undone against a numeric
  reference: an RL policy copied the question's operands and left the sum to the verifier (observed on
  SmolLM2: "The answer is 67 - 37, which is 7." scored 1 when X was taken as `67 - 37`; rule 3 now
  takes the `7`). The value after the last `=` is what counts.
- The plain-number fast path is exact: `0.3333333` ≠ `0.333333`, while math-verify (used when either
  side is not a plain number) rounds floats to 6 places, so `0.333333` = `\\frac13`.
- math-verify counts an *integer* percentage as both its value and its number (`50\\%` = `0.5` and
  `50\\%` = `50`, for "what percent" questions answered with or without the sign), but `0.5\\%` ≠ `0.5`.
  Kept as is: that leniency matches how MATH references are written.
- math-verify times its calls out with `signal.alarm`, which raises outside the main thread and
  would cancel a caller's own pending alarm. Instead one deadline covers a whole comparison (10 s,
  math-verify's 5 s to parse plus 5 s to verify, or less when the scorer's timeout for the call is
  nearer: `own_time_budget`), in any thread: a comparison past it scores 0. It is the response's
  doing (math has no infrastructure to fail), and a call that timed out in the scorer would be left
  out of training instead of graded. The deadline is delivered as math-verify's own signal handler
  delivers it, as an exception between two bytecodes; a single long C call is cut when it returns.
- Short answers can still explode in sympy (`9^{9^{9^9}}`, `(x+1)^{1000}`: seconds to forever, and an
  answer-length cap cannot catch them). Answers over `MAX_ANSWER_CHARS` score 0, and a parsed side
  with a huge exponent or factorial is compared as a whitespace-free string instead of symbolically.
"""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from fractions import Fraction
from math import gcd
from typing import Any

from hone.verifiers.budget import CompareTimeout, deadline, own_time_budget

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1000
COMPARE_TIMEOUT_S = 10.0  # math-verify's own defaults: 5 s to parse, 5 s to verify
# Past these, sympy's evaluation or expansion takes seconds or never ends (measured: (x+1)^1000 vs 5
# takes 6 s, (x+1)^64 0.2 s, 2^10000 is instant).
_MAX_NUMERIC_EXPONENT = 10_000
_MAX_SYMBOLIC_EXPONENT = 64
_MAX_FACTORIAL_ARG = 10_000

# `(?![A-Za-z])`: `\boxed5` is a box, `\boxedtext` is some other macro.
_BOX_TOKEN = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
# `#### Step 1`, `#### 2. Solve`: markdown headings, which chat models write, not GSM8K answers.
_HEADING = re.compile(r"[A-Za-z]|\d+[.)]\s+[A-Za-z]")
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b|:)[ \t:]*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# "The answer is 18, which is the total" / "18 because ...": the answer ends where the clause does.
_CLAUSE_END = re.compile(r",\s|;|\s(?:because|since|which|as|so|for|and|but)\s", re.IGNORECASE)
_MATHLIKE = re.compile(r"[\d\\]")
# A number not glued to a word or another number (`H2O`, `x2`, the `3` of `1.3`); a sign only where
# it cannot be a binary minus (`10-3` ends in `3`, `= -3` in `-3`).
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?:\s*\\?%)?"
    r"|(?<![\w.])[-+]?\.\d+(?:\s*\\?%)?"
)
_PLAIN_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+|\d+/\d+)")
# A binary operation between two operands: `67 - 37`, `9 x 9`, `2^{10}` (not `90^\\circ`), `(6)/2`; `(3)(4)`
# is missed. A slash or `\\frac` is a division, which `_divisions` judges.
_OPERATION = re.compile(
    r"[\d)}]\s*(?:[-+*×÷·x]|\^(?!\s*\{?\s*\\circ)|\\times|\\cdot|\\div)\s*[\d({\\]|[)}]\s*/|/\s*[({\\]"
)
# A root, binomial or factorial: `\\sqrt{16}`, `\\binom{5}{2}`, `5!`.
_FUNCTION = re.compile(r"\\(?:sqrt|root|binom|choose)(?![A-Za-z])|\d\s*!")
_FRAC = re.compile(r"\\[dt]?frac(?![A-Za-z])")
# Text groups hold units (`\\text{ km/h}`): a slash there is no division.
_TEXT_GROUP = re.compile(r"\\(?:text|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_INTEGER = re.compile(r"[-+]?\d+")
# After "the answer is X": ", which is Y" / " which equals Y" / " that gives Y", Y starting as math does.
_THEN_VALUE = re.compile(
    r"\s*,?\s*(?:which|that)\s+(?:is\s+equal\s+to|is|equals|gives|makes)\s+(?=[-+$\\\d(]|\*\*)", re.IGNORECASE
)
_SCIENTIFIC = re.compile(r"-?\d+(?:\.\d+)?\s*(?:\\times|\\cdot|×|\*)\s*10\s*\^\s*(?:\{\s*-?\d+\s*\}|-?\d+)")
_UNICODE_MINUS = "\u2212"  # what rendered or copy-pasted math often has instead of `-`
_DELIMITERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# Leading `**`/`$` (bold, a currency sign as in `#### $18`), trailing `**`, unescaped `$` or one period
# (not `...`).
_MARKUP = re.compile(r"^(?:\*\*|\$+)|(?:\*\*|(?<!\\)\$+|(?<!\.)\.)$")


def extract_answer(response: str) -> str | None:
    """The final answer in `response` by the rules in the module docstring, or None if none is found."""
    response = response.replace(_UNICODE_MINUS, "-")
    if _BOX_TOKEN.search(response):
        return _clean(_last_boxed(response))
    # A marker followed by words only ("the answer is correct. So the total is 18") gives way to a
    # later rule that finds something mathematical; it is kept only when nothing else is found
    # (a word answer such as "B" or "yes").
    rules = (_after_last_gsm8k_marker, _after_last_answer_is, _last_number)
    found = [_clean(rule(response)) for rule in rules]
    candidates = [answer for answer in found if answer is not None]
    mathlike = [answer for answer in candidates if _MATHLIKE.search(answer)]
    return next(iter(mathlike or candidates), None)


def math_reward(response: str, answer: str, *, require_evaluated: bool = False) -> float:
    """1.0 if the answer extracted from `response` equals the reference `answer`, else 0.0.

    `answer` may be a bare answer (`72`, `\\frac{1}{2}`, `[0, 1)`) or a solution ending in `\\boxed{...}`
    or `#### ...`. An empty reference raises `ValueError`: that is a data bug, not a wrong answer.
    With `require_evaluated`, a numeric reference is matched only by a number written out: arithmetic
    left undone (`67 - 37`, `2^{10}`, `\\sqrt{16}`, `6/4` — a fraction not in lowest terms) scores 0.
    """
    gold = _reference_answer(answer)
    pred = extract_answer(response)
    if pred is None or len(pred) > MAX_ANSWER_CHARS:
        return 0.0
    if require_evaluated and _as_fraction(gold) is not None and _unevaluated(pred):
        return 0.0
    return 1.0 if _equivalent(pred, gold) else 0.0


def top_answer_share(responses: Sequence[str]) -> float:
    """Share of `responses` whose final answer is the most common one among them: a collapse alarm.

    Over a batch of different problems a healthy policy spreads its answers (a few percent share one);
    a policy that farms a format and answers `\\boxed{42}` to everything scores near 1. The answer is
    extracted as `math_reward` does; a response without one counts as its own stripped text.
    """
    if not responses:
        return 0.0
    answers = Counter(extract_answer(r) or r.strip() for r in responses)
    return answers.most_common(1)[0][1] / len(responses)


# --- extraction ---


def _last_boxed(text: str) -> str | None:
    """Content of the last top-level box, a box nested in it unwrapped; None if it is unclosed."""
    content, pos = None, 0
    while match := _BOX_TOKEN.search(text, pos):
        # Continuing after the whole box keeps boxes nested in it from counting as top-level.
        content, pos = _box_argument(text, match.end())
    if content is not None and _BOX_TOKEN.search(content):
        return _last_boxed(content)
    return content


def _box_argument(text: str, start: int) -> tuple[str | None, int]:
    """The argument of a box macro ending at `start`, and where scanning resumes."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        return _braced(text, i)
    token = re.match(r"[^\s$]+", text[i:])  # `\boxed 5`: one token, up to a space or closing `$`
    return (token.group(), i + token.end()) if token else (None, i)


def _braced(text: str, open_at: int) -> tuple[str | None, int]:
    """Content of the group opening at `open_at`, escaped `\\{ \\}` not counted; None if unclosed."""
    depth, i = 0, open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # skips `\{`, `\}` and the second backslash of `\\`
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i], i + 1
        i += 1
    return None, len(text)


def _after_last_gsm8k_marker(text: str) -> str | None:
    """The rest of the line after the last `####` that is not a markdown heading."""
    lines = [m.group(1) for m in _GSM8K.finditer(text) if m.group(1).strip()]
    # "##### Step 3" and "#### **Final Answer**" are markdown headings, not GSM8K markers.
    answers = [line for line in lines if not _HEADING.match(line.lstrip("#* \t"))]
    return answers[-1] if answers else None


def _after_last_answer_is(text: str) -> str | None:
    """X in the last "answer is X" / "answer: X", up to the end of its clause; the final value when X
    is a calculation that the sentence evaluates ("X, which is Y", "X = Y").
    """
    anchors = list(_ANSWER_IS.finditer(text))
    if not anchors:
        return None
    line = text[anchors[-1].end() :].split("\n", 1)[0]
    answer, rest = _first_clause(_SENTENCE_END.split(line, maxsplit=1)[0])
    # Only a calculation gives way to what follows: in "18, which is 2 times 9" the answer is 18.
    while _is_calculation(answer) and (then := _THEN_VALUE.match(rest)):
        answer, rest = _first_clause(rest[then.end() :])
    return _after_arithmetic_equals(answer)


def _first_clause(sentence: str) -> tuple[str, str]:
    """The sentence up to its first clause end, and the rest from that end on."""
    end = _CLAUSE_END.search(sentence)
    return (sentence, "") if end is None else (sentence[: end.start()], sentence[end.start() :])


def _is_calculation(text: str) -> bool:
    return bool(_OPERATION.search(text) or _FUNCTION.search(text) or any(_divisions(text)))


def _after_arithmetic_equals(answer: str) -> str:
    """`Y` of `67 - 37 = Y` (numbers only on the left); `x = 5` is kept whole for math-verify."""
    left, equals, right = answer.rpartition("=")
    if equals and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", left)) and _MATHLIKE.search(right):
        return right
    return answer


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _clean(answer: str | None) -> str | None:
    """Strip the markup around an answer (`$...$`, `\\(...\\)`, `**...**`, a currency `$`, a trailing
    period), repeatedly, since it nests (`**$5$**.`); None if nothing is left.
    """
    if answer is None:
        return None
    text, previous = answer, None
    while text != previous:
        previous = text
        text = _MARKUP.sub("", text.strip())
        for left, right in _DELIMITERS:
            if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text = text[len(left) : -len(right)]
    return text or None


def _reference_answer(answer: str) -> str:
    """The reference itself, or the boxed / `####` answer of a full solution."""
    answer = answer.replace(_UNICODE_MINUS, "-")
    if _BOX_TOKEN.search(answer):
        gold = _clean(_last_boxed(answer))
    elif _GSM8K.search(answer):
        gold = _clean(_after_last_gsm8k_marker(answer))
    else:
        gold = _clean(answer)
    if gold is None:
        raise ValueError(f"math reward: the reference answer {answer[:80]!r} is empty")
    return gold


# --- equivalence ---


def _equivalent(pred: str, gold: str) -> bool:
    pred_number, gold_number = _as_fraction(pred), _as_fraction(gold)
    if pred_number is not None and gold_number is not None:
        return pred_number == gold_number
    return _math_verify_equal(pred, gold)


def _unevaluated(pred: str) -> bool:
    """Whether an answer is arithmetic left undone (`67 - 37`, `9 \\times 9`, `\\sqrt{16}`, `6/4`, `4.5/9`).

    math-verify evaluates such an expression and calls it equal, so where computing is the point a
    policy learns to copy the question's operands and leave the sum to the verifier. Only the value
    after the last `=` counts (`67 - 37 = 30` is an answer); scientific notation (`1.5 \\times 10^{3}`)
    is a number, and so is a fraction of integers in lowest terms (`3/2`, `\\frac{-3}{2}`); any other
    division (`4.5/9`, `\\frac{1.5}{3}`, `1/2/1`, `6/4`) is not.
    """
    final = pred.rsplit("=", 1)[-1].strip()
    if _SCIENTIFIC.fullmatch(final):
        return False
    if _OPERATION.search(final) or _FUNCTION.search(final):
        return True
    return not all(_lowest_terms(num, den) for num, den in _divisions(final))


def _divisions(text: str) -> Iterator[tuple[str, str]]:
    """(numerator, denominator) of every `\\frac` and every `/` in `text`, as written: a slash's operands
    are the number-or-word runs on either side (empty after a bracket: `(6)/2`)."""
    for match in _FRAC.finditer(text):
        numerator, after = _macro_argument(text, match.end())
        denominator, _ = _macro_argument(text, after)
        yield numerator or "", denominator or ""
    plain = _TEXT_GROUP.sub(" ", _FRAC.sub(" ", text))
    for at in (i for i, char in enumerate(plain) if char == "/"):
        left = re.search(r"[-+]?[\w.]*$", plain[:at].rstrip())
        right = re.match(r"[-+]?[\w.]*", plain[at + 1 :].lstrip())
        yield (left.group() if left else ""), (right.group() if right else "")


def _macro_argument(text: str, start: int) -> tuple[str | None, int]:
    """A LaTeX macro's argument starting at `start`: a braced group, else one character (`\\frac12`)."""
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] == "{":
        return _braced(text, i)
    return (text[i], i + 1) if i < len(text) else (None, i)


def _lowest_terms(numerator: str, denominator: str) -> bool:
    """Whether a division is a fraction of integers in lowest terms (denominator > 1), i.e. a number."""
    if not (_INTEGER.fullmatch(numerator.strip()) and _INTEGER.fullmatch(denominator.strip())):
        return False
    top, bottom = int(numerator), int(denominator)
    return bottom > 1 and gcd(top, bottom) == 1


def _as_fraction(text: str) -> Fraction | None:
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text.replace(",", ""))
    except ZeroDivisionError:  # `1/0`: let math-verify decide what it is
        return None


def _math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify's verdict, False when it takes longer than the comparison's deadline."""
    parse, verify = _math_verify()
    budget = own_time_budget(COMPARE_TIMEOUT_S)
    assert budget is not None  # capped
    try:
        with deadline(budget):
            # `$...$` makes math-verify's LaTeX extraction take the answer whole (a `\boxed{...}`
            # wrapper would lose e.g. `5.` and `5 $ dollars`). Its own timeouts are off: ours covers both.
            gold_parsed = parse(f"${gold}$", parsing_timeout=None)
            pred_parsed = parse(f"${pred}$", parsing_timeout=None)
            if not gold_parsed or not pred_parsed:
                return False
            if _too_costly(gold_parsed) or _too_costly(pred_parsed):
                return re.sub(r"\s+", "", pred) == re.sub(r"\s+", "", gold)
            return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except CompareTimeout:
        logger.warning(
            "math reward: comparing %.80r with %.80r took over %.1f s; scored 0", pred, gold, budget
        )
        return False


@functools.cache
def _math_verify() -> tuple[Callable[..., list[Any]], Callable[..., bool]]:
    """Imported on first use: it loads sympy and an ANTLR parser (~0.6 s), which the numeric fast
    path and importers that never score math do not need. Cached: graders call this
    for every answer, and the log filter below needs adding only once.
    """
    from math_verify import parse, verify

    # We pass timeout=None on purpose (`_deadline` times comparisons out), which math-verify answers
    # with a "Timeout is disabled" warning: noise in every run's log.
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_drop_disabled_timeout_warning)
    return parse, verify


def _drop_disabled_timeout_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Timeout is disabled")


def _too_costly(parsed: Iterable[Any]) -> bool:
    """Whether sympy could take seconds to forever on any parsed expression (huge powers, factorials)."""
    from sympy import Pow, factorial

    for expr in parsed:
        if not hasattr(expr, "atoms"):  # math-verify's string fallback
            continue
        for power in expr.atoms(Pow):
            limit = _MAX_SYMBOLIC_EXPONENT if power.base.free_symbols else _MAX_NUMERIC_EXPONENT
            if _exceeds(power.exp, limit):
                return True
        if any(_exceeds(f.args[0], _MAX_FACTORIAL_ARG) for f in expr.atoms(factorial)):
            return True
    return False


def _exceeds(value: Any, limit: int) -> bool:
    if not value.is_number:
        return False
    try:
        # evalf works on the logarithmic scale, so even 9**(9**9) is evaluated instantly.
        return bool(abs(value.evalf(3)) > limit)
    except (TypeError, ValueError):  # nan and friends: not worth the risk
        return True


def require_math_verify() -> None:
    """Import math-verify now, so that a missing dependency fails when a recipe is built, not on every
    rollout."""
    _math_verify()
