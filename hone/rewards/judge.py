"""LLM-as-a-judge reward: another model grades the response against a rubric and replies `Score: N`.

Implements single-answer grading from Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and
Chatbot Arena" (§3.1, "single answer grading", optionally "reference-guided"): the judge sees the
question, an optional reference answer and the response, and gives a score on a fixed scale. The score
is divided by `max_score`, so the reward is in [0, 1]. Two backends:

- an OpenAI-compatible endpoint (`base_url`, `model`; vLLM, SGLang, TGI and hosted APIs all speak it),
  one blocking `urllib` request per rollout: a per-rollout `RewardFn` that the reward runner calls from
  its worker threads, so requests run concurrently without an async client or a new dependency;
- a local Hugging Face causal LM (`path`), greedy and batched: a `BatchRewardFn`.

Departures from the paper, and why:
- The rubric asks for a final `Score: N` line rather than MT-Bench's `[[N]]`, and the parser (see
  `parse_score`) also takes `N/M` and, last, any number, because small local judges rarely follow a
  format exactly. Unparseable replies are errors, never a silent 0: the HTTP backend raises `ValueError`
  (the runner scores the rollout 0 and counts it in `reward/errors`); a batch cannot raise for one item,
  so the local backend scores that item 0 with part `parse_error = 1` (every item reports the part, so
  the logged `reward/parse_error` is the failure rate).
- Greedy decoding (temperature 0) by default: the same response should get the same reward.

The API key is never in the recipe: `api_key_env` names the environment variable that holds it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import string
import urllib.error
import urllib.request
from collections.abc import Sequence

import torch
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase

from hone.models.chat import chat_text
from hone.rewards.base import Score
from hone.rewards.model import (
    batches,
    load_tokenizer,
    pad,
    render_messages,
    resolve_device,
    resolve_dtype,
    resolve_path,
)
from hone.rewards.registry import register_reward
from hone.types import Rollout, Sample

DEFAULT_RUBRIC = """\
Please act as an impartial judge and grade the response to the question below.

[Question]
{question}

[Reference answer]
{reference}

[Response]
{response}

Grade the response from 0 (wrong, unhelpful or empty) to {max_score} (correct, complete and clear). \
If a reference answer is given, judge correctness against it. Explain your grade briefly, then end \
your reply with a final line of the form `Score: N`, where N is a number from 0 to {max_score}."""

RUBRIC_FIELDS = frozenset({"question", "response", "reference", "max_score"})
NO_REFERENCE = "(none given)"

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
# "Score: 7", "**Score:** 7", "score = 7.5", "Score: [[7]]", "Final score is 7/10": the word "score", a short
# gap of punctuation, spaces, "is"/"of"/"was" and a "(0-10)" aside (no other words, no line break), then a
# number and an optional "/M".
_SCORE_LINE = re.compile(
    rf"\bscore\b(?:\([^)\n]*\)|[^\w\n]|is|of|was){{0,12}}?({_NUMBER})(?:\s*/\s*(\d+(?:\.\d+)?))?",
    re.IGNORECASE,
)
_FRACTION = re.compile(rf"({_NUMBER})\s*/\s*(\d+(?:\.\d+)?)")
_ANY_NUMBER = re.compile(_NUMBER)


def parse_score(reply: str, max_score: float) -> float:
    """The judge's score in [0, max_score]. Tried in order, the last match of each winning:

    1. `score` followed closely by a number (`Score: 7`, `**Score**: 7/10`, `score (0-10): 7`);
    2. a fraction `N/M` anywhere (`I'd give it 7/10`);
    3. the last number in the reply.

    A fraction `N/M` is rescaled to `N / M * max_score` (so `4/5` on a 10-point scale is 8). The result
    is clamped to [0, max_score]. A reply with no number raises `ValueError`.
    """
    match = _last(_SCORE_LINE, reply) or _last(_FRACTION, reply)
    if match is not None:
        value, denominator = float(match.group(1)), match.group(2)
        if denominator is not None and float(denominator) > 0:
            value = value / float(denominator) * max_score
    else:
        numbers = _ANY_NUMBER.findall(reply)
        if not numbers:
            raise ValueError(f"no score in the judge's reply: {_excerpt(reply)!r}")
        value = float(numbers[-1])
    return float(min(max(value, 0.0), max_score))


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _excerpt(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def question_text(sample: Sample) -> str:
    """The prompt as the judge sees it: the prompt text, the single user turn, or the chat as lines."""
    if sample.prompt is not None:
        return sample.prompt
    messages = [m for m in sample.messages or [] if m.get("role") != "system"]
    if len(messages) == 1:
        return str(messages[0]["content"])
    return render_messages(messages).rstrip("\n")


def check_rubric(rubric: str) -> None:
    """Reject templates that use unknown fields or are malformed, at build time."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(rubric) if name is not None}
    except ValueError as err:
        raise ValueError(
            f"judge rubric is not a valid format string ({err}); write literal braces as {{{{ }}}}"
        ) from err
    unknown = fields - RUBRIC_FIELDS
    if unknown:
        raise ValueError(
            f"judge rubric uses unknown fields {sorted(unknown)}; allowed: {sorted(RUBRIC_FIELDS)}"
        )
    if "response" not in fields:
        raise ValueError("judge rubric must contain {response}")


def _format_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class _Judge:
    """What both backends share: the rubric prompt and turning a reply into a normalised reward."""

    def __init__(self, rubric: str, max_score: float) -> None:
        self.rubric, self.max_score = rubric, max_score

    def prompt(self, rollout: Rollout, sample: Sample) -> str:
        return self.rubric.format(
            question=question_text(sample),
            response=rollout.response_text,
            reference=sample.answer if sample.answer is not None else NO_REFERENCE,
            max_score=_format_number(self.max_score),
        )

    def reward(self, reply: str) -> float:
        return parse_score(reply, self.max_score) / self.max_score


class HttpJudge(_Judge):
    """Per-rollout judge over an OpenAI-compatible `POST {base_url}/chat/completions`."""

    def __init__(
        self,
        rubric: str,
        max_score: float,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__(rubric, max_score)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.temperature, self.max_tokens, self.timeout_s = temperature, max_tokens, timeout_s

    def __call__(self, rollout: Rollout, sample: Sample) -> float:
        return self.reward(self.complete(self.prompt(rollout, sample)))

    def complete(self, prompt: str) -> str:
        """The judge's reply to one user message. HTTP errors raise `RuntimeError` with the status and
        a body excerpt; a connect or read timeout raises `TimeoutError`.
        """
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        return _reply_content(self._send(request))

    def _send(self, request: urllib.request.Request) -> bytes:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            excerpt = _excerpt(err.read().decode("utf-8", "replace"))
            raise RuntimeError(f"judge endpoint {self.url} returned HTTP {err.code}: {excerpt}") from err
        except urllib.error.URLError as err:
            if isinstance(err.reason, (TimeoutError, socket.timeout)):
                raise TimeoutError(f"judge request to {self.url} timed out after {self.timeout_s}s") from err
            raise ConnectionError(f"judge endpoint {self.url} unreachable: {err.reason}") from err
        except TimeoutError as err:  # the read timed out (socket.timeout is TimeoutError since 3.10)
            raise TimeoutError(f"judge request to {self.url} timed out after {self.timeout_s}s") from err


def _reply_content(raw: bytes) -> str:
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ValueError(
            f"judge endpoint sent no chat completion: {_excerpt(raw.decode('utf-8', 'replace'))!r}"
        ) from err
    if not isinstance(content, str):
        raise ValueError(f"judge reply content is not text: {content!r}")
    return content


class LocalJudge(_Judge):
    """Batched judge over a local HF causal LM, greedy; unparseable replies score 0 with `parse_error`."""

    def __init__(
        self,
        rubric: str,
        max_score: float,
        *,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_tokens: int = 512,
        batch_size: int = 8,
    ) -> None:
        super().__init__(rubric, max_score)
        self.model, self.tokenizer = model, tokenizer
        self.max_tokens, self.batch_size = max_tokens, batch_size

    def score_batch(self, rollouts: Sequence[Rollout], samples: Sequence[Sample]) -> list[Score]:
        if len(rollouts) != len(samples):
            raise ValueError(f"got {len(rollouts)} rollouts but {len(samples)} samples")
        prompts = [self.prompt(r, s) for r, s in zip(rollouts, samples, strict=True)]
        replies: list[str] = []
        for chunk in batches(len(prompts), self.batch_size):
            replies.extend(self.generate([prompts[i] for i in chunk]))
        return [self._score(reply) for reply in replies]

    def _score(self, reply: str) -> Score:
        try:
            return Score(self.reward(reply), {"parse_error": 0.0})
        except ValueError:
            return Score(0.0, {"parse_error": 1.0})

    @torch.no_grad()
    def generate(self, prompts: list[str]) -> list[str]:
        """Greedy replies to `prompts`, each sent as one user turn through the chat template if any."""
        templated = bool(self.tokenizer.chat_template)
        if templated:
            prompts = [
                chat_text(self.tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True)
                for p in prompts
            ]
        encoded = [self.tokenizer(p, add_special_tokens=not templated)["input_ids"] for p in prompts]
        input_ids, attention_mask = pad(encoded, self.tokenizer)  # left-padded: generation appends
        model = self.model
        if not isinstance(model, GenerationMixin):
            raise TypeError(f"judge model {type(model).__name__} cannot generate (not a causal LM)")
        device = next(model.parameters()).device
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            do_sample=False,
            max_new_tokens=self.max_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        return self.tokenizer.batch_decode(output[:, input_ids.shape[1] :], skip_special_tokens=True)


@register_reward("judge")
def judge(
    base_url: str | None = None,
    model: str | None = None,
    api_key_env: str | None = None,
    path: str | None = None,
    rubric: str = DEFAULT_RUBRIC,
    max_score: float = 10.0,
    temperature: float = 0.0,
    max_tokens: int = 512,
    timeout_s: float = 60.0,
    batch_size: int = 8,
    device: str = "cpu",
    dtype: str = "float32",
) -> HttpJudge | LocalJudge:
    """An LLM judge: give `base_url` + `model` for an OpenAI-compatible endpoint (`api_key_env` names
    the variable holding its key, if it needs one), or `path` for a local HF causal LM. `rubric` is a
    `str.format` template over {question}, {response}, {reference}, {max_score}. `temperature`,
    `timeout_s` apply to the endpoint, `batch_size`, `device`, `dtype` to the local model.
    """
    check_rubric(rubric)
    if not max_score > 0:
        raise ValueError(f"judge: max_score must be > 0, got {max_score}")
    if max_tokens < 1:
        raise ValueError(f"judge: max_tokens must be >= 1, got {max_tokens}")
    if (base_url is None) == (path is None):
        raise ValueError("judge: give exactly one of base_url (an OpenAI-compatible endpoint) or path")
    if base_url is not None:
        return _http_judge(
            base_url, model, api_key_env, rubric, max_score, temperature, max_tokens, timeout_s
        )
    assert path is not None
    return _local_judge(path, rubric, max_score, max_tokens, batch_size, device, dtype)


def _http_judge(
    base_url: str,
    model: str | None,
    api_key_env: str | None,
    rubric: str,
    max_score: float,
    temperature: float,
    max_tokens: int,
    timeout_s: float,
) -> HttpJudge:
    if not model:
        raise ValueError("judge: base_url needs model (the endpoint's model name)")
    if not timeout_s > 0:
        raise ValueError(f"judge: timeout_s must be > 0, got {timeout_s}")
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:  # fail when the recipe is built, not as an HTTP 401 on every rollout
            raise ValueError(f"judge: environment variable {api_key_env!r} (api_key_env) is not set")
    return HttpJudge(
        rubric,
        max_score,
        base_url=base_url,
        model=model,
        api_key=api_key,
        temperature=temperature,
        max_tokens=max_tokens,
        timeout_s=timeout_s,
    )


def _local_judge(
    path: str, rubric: str, max_score: float, max_tokens: int, batch_size: int, device: str, dtype: str
) -> LocalJudge:
    if batch_size < 1:
        raise ValueError(f"judge: batch_size must be >= 1, got {batch_size}")
    resolved = resolve_path(path, "judge model")
    tokenizer = load_tokenizer(resolved, padding_side="left")
    lm = AutoModelForCausalLM.from_pretrained(resolved, dtype=resolve_dtype(dtype))
    # transformers types `PreTrainedModel.to` as a bare functools.wraps wrapper (device reads as self).
    lm.to(resolve_device(device)).eval()  # type: ignore[arg-type]
    return LocalJudge(
        rubric, max_score, model=lm, tokenizer=tokenizer, max_tokens=max_tokens, batch_size=batch_size
    )
