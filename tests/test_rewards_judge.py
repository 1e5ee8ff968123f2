"""LLM judge: the score parser, the OpenAI-compatible backend against a real local HTTP server, and the
local HF backend with a tiny random model."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hone.rewards.base import Score
from hone.rewards.judge import DEFAULT_RUBRIC, HttpJudge, LocalJudge, judge, parse_score, question_text
from hone.rewards.registry import REWARDS
from hone.types import Rollout, Sample

SAMPLE = Sample("s", prompt="What is 2+2?", answer="4")


def rollout(text: str = "It is 4.") -> Rollout:
    return Rollout("s", 0, [1, 2], 1, [1], [0.0], response_text=text)


# --- parser ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Score: 7", 7.0),
        ("The response is right.\nScore: 9", 9.0),
        ("**Score:** 8", 8.0),
        ("**Score**: 6.5", 6.5),
        ("score = 3", 3.0),
        ("SCORE: 10", 10.0),
        ("Rating: [[5]]\nScore: [[6]]", 6.0),
        ("Final score is 7/10.", 7.0),
        ("Score: 3/5", 6.0),  # a fraction is rescaled to the 10-point scale
        ("The score (0-10): 4", 4.0),  # the range in parentheses is not the score
        ("Use the format Score: N.\nScore: 2", 2.0),  # the last score line wins
        ("Score: 2 at first, but on reflection\nScore: 5", 5.0),
        ("I'd give it 8/10 overall.", 8.0),  # no score line: a fraction
        ("Between 1 and 3 errors; 9", 9.0),  # neither: the last number
        ("Score: 12", 10.0),  # clamped to max_score
        ("Score: -3", 0.0),  # clamped to 0
        ("Score: 0", 0.0),
        ("It's 4/0", 4.0),  # a zero denominator is not a fraction to rescale
    ],
)
def test_parse_score_reply_shapes(reply: str, expected: float) -> None:
    assert parse_score(reply, 10.0) == pytest.approx(expected)


def test_parse_score_other_scales() -> None:
    assert parse_score("Score: 4", 5.0) == 4.0
    assert parse_score("Score: 8/10", 5.0) == 4.0
    assert parse_score("Score: 1", 1.0) == 1.0


@pytest.mark.parametrize("reply", ["", "Score: N", "I cannot grade this.", "score: ten"])
def test_parse_score_without_a_number_raises(reply: str) -> None:
    with pytest.raises(ValueError, match="no score in the judge's reply"):
        parse_score(reply, 10.0)


def test_question_text_from_prompt_or_messages() -> None:
    assert question_text(SAMPLE) == "What is 2+2?"
    system = {"role": "system", "content": "be brief"}
    user = {"role": "user", "content": "hi?"}
    assert question_text(Sample("a", messages=[system, user])) == "hi?"
    chat = [user, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
    assert question_text(Sample("a", messages=chat)) == "user: hi?\nassistant: hello\nuser: and?"


# --- factory validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of base_url"),
        ({"base_url": "http://x", "path": "y"}, "exactly one of base_url"),
        ({"base_url": "http://x"}, "needs model"),
        ({"base_url": "http://x", "model": "m", "max_score": 0}, "max_score must be > 0"),
        ({"base_url": "http://x", "model": "m", "timeout_s": 0}, "timeout_s must be > 0"),
        (
            {"base_url": "http://x", "model": "m", "rubric": "{response} {answer}"},
            r"unknown fields \['answer'\]",
        ),
        ({"base_url": "http://x", "model": "m", "rubric": "{question}"}, "must contain {response}"),
        ({"base_url": "http://x", "model": "m", "rubric": "{response} {"}, "not a valid format string"),
        (
            {"base_url": "http://x", "model": "m", "api_key_env": "HONE_TEST_UNSET_KEY"},
            "'HONE_TEST_UNSET_KEY'",
        ),
    ],
)
def test_judge_rejects_bad_arguments(
    kwargs: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HONE_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match=message):
        judge(**kwargs)


def test_rubric_substitution_with_and_without_reference() -> None:
    j = judge(base_url="http://127.0.0.1:1", model="m", max_score=5)
    text = j.prompt(rollout("It is {4}."), SAMPLE)
    assert "What is 2+2?" in text and "It is {4}." in text and "[Reference answer]\n4\n" in text
    assert "from 0 to 5" in text and "`Score: N`" in text
    assert "(none given)" in j.prompt(rollout(), Sample("s", prompt="q"))


# --- HTTP backend ---------------------------------------------------------------------------------


@dataclass
class FakeEndpoint:
    """What the fake server replies (`reply(request_json) -> (status, body)`) and what it received."""

    url: str = ""
    reply: Callable[[dict[str, Any]], tuple[int, bytes]] = lambda request: (200, b"{}")
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)


def completion(content: str | None) -> tuple[int, bytes]:
    body = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }
    return 200, json.dumps(body).encode()


@pytest.fixture
def endpoint() -> Iterator[FakeEndpoint]:
    state = FakeEndpoint()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append((self.path, dict(self.headers), request))
            status, body = state.reply(request)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up (timeout test)
                pass

        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def test_http_judge_scores_and_sends_an_openai_request(
    endpoint: FakeEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HONE_TEST_JUDGE_KEY", "sk-test-123")
    endpoint.reply = lambda request: completion("Correct and concise.\nScore: 8")
    j = REWARDS["judge"](
        base_url=endpoint.url + "/", model="judge-7b", api_key_env="HONE_TEST_JUDGE_KEY", max_tokens=64
    )
    assert isinstance(j, HttpJudge)
    assert j(rollout("It is 4."), SAMPLE) == pytest.approx(0.8)
    path, headers, request = endpoint.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-test-123"
    assert headers["Content-Type"] == "application/json"
    assert request["model"] == "judge-7b" and request["temperature"] == 0.0 and request["max_tokens"] == 64
    [message] = request["messages"]
    assert message["role"] == "user"
    assert "What is 2+2?" in message["content"] and "It is 4." in message["content"]
    assert "[Reference answer]\n4\n" in message["content"]
    assert message["content"] == DEFAULT_RUBRIC.format(
        question="What is 2+2?", reference="4", response="It is 4.", max_score="10"
    )


def test_http_judge_without_key_sends_no_auth_and_uses_custom_rubric(endpoint: FakeEndpoint) -> None:
    endpoint.reply = lambda request: completion("7/10")
    j = judge(
        base_url=endpoint.url, model="m", rubric="Q={question} R={response} A={reference}", temperature=0.5
    )
    assert j(rollout("four"), SAMPLE) == pytest.approx(0.7)
    _, headers, request = endpoint.requests[0]
    assert "Authorization" not in headers and request["temperature"] == 0.5
    assert request["messages"][0]["content"] == "Q=What is 2+2? R=four A=4"


@pytest.mark.parametrize("content", ["I refuse to grade.", "", None])
def test_http_judge_unparseable_reply_raises(endpoint: FakeEndpoint, content: str | None) -> None:
    endpoint.reply = lambda request: completion(content)
    j = judge(base_url=endpoint.url, model="m")
    with pytest.raises(ValueError, match=r"no score|not text"):
        j(rollout(), SAMPLE)


def test_http_judge_malformed_body_raises(endpoint: FakeEndpoint) -> None:
    endpoint.reply = lambda request: (200, b'{"error": "nope"}')
    with pytest.raises(ValueError, match="no chat completion"):
        judge(base_url=endpoint.url, model="m")(rollout(), SAMPLE)


def test_http_error_raises_with_status_and_body(endpoint: FakeEndpoint) -> None:
    endpoint.reply = lambda request: (500, b'{"error": "model overloaded"}' + b"x" * 1000)
    with pytest.raises(RuntimeError, match=r"HTTP 500: \{\"error\": \"model overloaded\"\}x+…$"):
        judge(base_url=endpoint.url, model="m")(rollout(), SAMPLE)


def test_slow_server_raises_timeout(endpoint: FakeEndpoint) -> None:
    answer = threading.Event()  # the server answers only once the test has its timeout (or after 60 s)

    def slow(request: dict[str, Any]) -> tuple[int, bytes]:
        answer.wait(60)
        return completion("Score: 5")

    endpoint.reply = slow
    j = judge(base_url=endpoint.url, model="m", timeout_s=0.2)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"timed out after 0.2s"):
            j(rollout(), SAMPLE)
        assert time.monotonic() - start < 30  # the timeout, not the server's answer, ended the call
    finally:
        answer.set()


def test_unreachable_endpoint_raises_connection_error() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match="unreachable"):
        judge(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_s=2)(rollout(), SAMPLE)


# --- local HF backend -----------------------------------------------------------------------------


def test_local_judge_with_a_tiny_model_scores_every_item(micro_model_dir: Path) -> None:
    j = REWARDS["judge"](path=str(micro_model_dir), max_tokens=4, batch_size=2)
    assert isinstance(j, LocalJudge) and j.tokenizer.padding_side == "left"
    rollouts = [rollout(t) for t in ["4", "It is four.", "5"]]
    scores = j.score_batch(rollouts, [SAMPLE] * 3)
    assert len(scores) == 3
    for score in scores:  # random weights: garbage replies, but every item is a finite, reported score
        assert isinstance(score, Score) and 0.0 <= score.value <= 1.0
        assert score.parts["parse_error"] in (0.0, 1.0)
        assert score.parts["parse_error"] == 0.0 or score.value == 0.0
    # Greedy and left-padded: a prompt's reply does not depend on what it was batched with.
    assert (
        j.generate([j.prompt(rollouts[1], SAMPLE)])
        == j.generate([j.prompt(r, SAMPLE) for r in rollouts])[1:2]
    )


def test_local_judge_reports_parse_failures_per_item(
    monkeypatch: pytest.MonkeyPatch, micro_model_dir: Path
) -> None:
    j = judge(path=str(micro_model_dir), max_tokens=1, batch_size=2)
    replies = iter([["Score: 10", "no idea"], ["Score: 5/10"]])
    monkeypatch.setattr(j, "generate", lambda prompts: next(replies))
    scores = j.score_batch([rollout()] * 3, [SAMPLE] * 3)
    assert scores == [
        Score(1.0, {"parse_error": 0.0}),
        Score(0.0, {"parse_error": 1.0}),
        Score(0.5, {"parse_error": 0.0}),
    ]


def test_local_judge_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="judge model: model directory not found"):
        judge(path=str(tmp_path / "missing"))
