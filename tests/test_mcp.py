"""`env.name: mcp`: a Model Context Protocol server's tools as the policy's tools. Against the third-party
PyPI server `mcp-server-calculator` (in .venv-mcp, `make setup-mcp`; `make test` installs it) and a server
of our own (tests/mcp_server_for_tests.py) for what the calculator cannot show: timeouts, crashes, images,
streamable HTTP. Servers never outlive a run, a release, or a killed trainer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from hone.envs import make_env, release_envs
from hone.envs.games.tool_arithmetic import ToolArithmetic
from hone.envs.mcp_tools import _CONNECTIONS, MCPEnv
from hone.types import Sample
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
CALCULATOR = ROOT / ".venv-mcp" / "bin" / "mcp-server-calculator"
OURS = [sys.executable, str(ROOT / "tests" / "mcp_server_for_tests.py")]
needs_calculator = pytest.mark.skipif(
    not CALCULATOR.exists() and not os.environ.get("HONE_REQUIRE_MCP_SERVER"),
    reason="the PyPI MCP server is not installed: make setup-mcp",
)


@pytest.fixture(autouse=True)
def _released() -> object:
    yield
    release_envs()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is not alive
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _calculators() -> list[int]:
    """Live calculator servers this process started (other tests of this worker may leave other children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"mcp-server-calculator" in command:
                pids.append(int(entry.name))
    return pids


@needs_calculator
def test_the_pypi_calculator_plays_tool_arithmetic_token_for_token(micro_model_dir: Path) -> None:
    """The third-party server's `calculate`, offered as `calculator`: the rollout holds exactly the
    template's rendering of the conversation, the server's answer as the masked observation, and
    tool_arithmetic's verdict as the reward."""
    from hone.rollout.multiturn import EpisodeLimits, run_episodes
    from hone.training.policy import Policy
    from hone.types import SamplingParams
    from tests.helpers import Scripted

    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    make = make_env(
        "mcp",
        {"command": [str(CALCULATOR)], "tools": {"calculate": "calculator"}, "samples": "tool_arithmetic"},
    )
    env = make()
    assert isinstance(env, MCPEnv) and [t["function"]["name"] for t in env.tools or []] == ["calculator"]
    (sample,) = MCPEnv.make_samples(1, 0, "train", samples="tool_arithmetic")
    expression = f"{sample.meta['a']}{sample.meta['op']}{sample.meta['b']}"
    replies = [_call("calculator", expression=expression), sample.answer or ""]
    limits = EpisodeLimits(max_turns=4, max_tokens_per_turn=96, max_total_tokens=1024)
    (rollout,) = run_episodes(Scripted(tok, replies), tok, make, [sample], SamplingParams(n=1), limits)
    assert rollout.turn_rewards == [0.0, 1.0] and rollout.metrics["env/errors"] == 0.0
    assert rollout.metrics["env/tool_calls"] == 1.0 and rollout.metrics["env/tool_errors"] == 0.0
    # The micro model's template renders "role: content" turns; the server's answer is the tool turn.
    prompt = tok.apply_chat_template(
        ToolArithmetic().reset(sample), add_generation_prompt=True, tokenize=False
    )
    assert rollout.token_ids[: rollout.prompt_len] == tok.encode(prompt, add_special_tokens=False)
    first, last = ([*tok.encode(reply, add_special_tokens=False), tok.eos_token_id] for reply in replies)
    observation = tok.encode(f"\ntool: {sample.answer}\nassistant: ", add_special_tokens=False)
    assert rollout.response_ids == first + observation + last
    assert rollout.loss_mask == [1] * len(first) + [0] * len(observation) + [1] * len(last)
    assert rollout.sampler_logprobs == [0.0] * len(rollout.response_ids)  # Scripted's; observations 0


def test_tools_are_listed_kept_renamed_and_a_bad_spec_is_one_line() -> None:
    env = make_env("mcp", {"command": OURS, "tools": ["echo", "count"]})()
    assert [t["function"]["name"] for t in env.tools or []] == ["echo", "count"]
    echo = (env.tools or [])[0]["function"]
    assert echo["parameters"]["required"] == ["text"] and echo["description"] == "Say the text back."
    renamed = make_env("mcp", {"command": OURS, "tools": {"echo": "say"}})()
    assert [t["function"]["name"] for t in renamed.tools or []] == ["say"]
    assert len(_CONNECTIONS) == 1  # one server for every instance with this command
    with pytest.raises(
        ValueError, match=r"env.args.tools names \['shout'\].*it has \['count', 'crash', 'echo'"
    ):
        make_env("mcp", {"command": OURS, "tools": ["shout"]})
    with pytest.raises(ValueError, match="exactly one of command"):
        make_env("mcp", {})
    with pytest.raises(ValueError, match=r"command: '/no/such/server' is not an executable"):
        make_env("mcp", {"command": ["/no/such/server"]})
    not_mcp = [sys.executable, "-c", "import sys; print('not MCP'); sys.exit('bad token')"]
    with pytest.raises(
        ValueError, match=r"did not start: MCPError: Connection closed; its last stderr: bad token"
    ):
        make_env("mcp", {"command": not_mcp, "start_timeout_s": 20})
    assert len(_CONNECTIONS) == 1 and not [t for t in threading.enumerate() if t.name == "hone-mcp"][1:]


def test_errors_timeouts_images_and_the_episode_budget_are_counted_observations() -> None:
    env = make_env("mcp", {"command": OURS, "timeout_s": 1.0, "max_calls": 5})()
    env.reset(Sample("s", prompt="go"))

    async def play() -> list[object]:
        return [
            await env.step(_call("echo", text="hi")),
            await env.step(_call("wait", seconds=5)),
            await env.step(_call("picture") + _call("echo", text=3)),
            await env.step(_call("echo", text="over") + _call("echo", text="budget")),
            await env.step("done"),
        ]

    echo, slow, mixed, over, final = asyncio.run(play())
    assert echo.messages == [{"role": "tool", "name": "echo", "content": "hi"}] and not echo.done
    assert slow.messages[0]["content"] == "Error: wait timed out after 1 s"
    assert slow.info == {"tool_calls": 1.0, "tool_errors": 0.0, "tool_timeouts": 1.0}
    assert next(m["content"] for m in mixed.messages) == "[image omitted]"
    assert "echo: argument text must be of type string" in mixed.messages[1]["content"]
    assert mixed.info["tool_errors"] == 1.0
    # 5 calls per episode: the fourth turn's first call is the fifth; its second is refused, counted.
    assert over.messages[0]["content"] == "over"
    assert over.messages[1]["content"] == "Error: the episode's 5 tool calls are spent; 1 not run"
    assert over.info["tool_errors"] == 1.0
    assert final.done and final.reward == 0.0  # no lent game: the recipe's reward scores the answer


def test_a_crashed_server_is_restarted_and_its_call_is_an_error(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    make = make_env("mcp", {"command": OURS, "env": {"HONE_TEST_MCP_PIDS": str(pids)}, "timeout_s": 30})
    env = make()
    env.reset(Sample("s", prompt="go"))

    async def play() -> list[object]:
        return [await env.step(_call(name)) for name in ("count", "crash", "count")]

    counted, crashed, again = asyncio.run(play())
    assert counted.messages[0]["content"] == "1"
    assert crashed.messages[0]["content"].startswith("Error: crash: the MCP server failed")
    assert crashed.info["tool_errors"] == 1.0
    assert again.messages[0]["content"] == "1" and again.info["tool_errors"] == 0.0  # a new process
    first, second = (int(p) for p in pids.read_text().split())
    assert not _alive(first) and _alive(second)
    release_envs()
    assert wait_for(lambda: not _alive(second), 15), "release_envs left the MCP server running"
    assert not [t for t in threading.enumerate() if t.name == "hone-mcp"]


def test_a_stdio_server_dies_with_a_killed_trainer(tmp_path: Path) -> None:
    """SIGKILL leaves Python no time to clean up: the parent-death signal the shim sets stops the server."""
    pids = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        from hone.envs import make_env
        make_env("mcp", {{"command": {OURS!r}, "env": {{"HONE_TEST_MCP_PIDS": {str(pids)!r}}}}})
        print("up", flush=True)
        import time; time.sleep(120)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert trainer.stdout is not None and trainer.stdout.readline().strip() == "up"
        server = int(pids.read_text())
        assert _alive(server)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        assert wait_for(lambda: not _alive(server), 15), "the MCP server outlived the killed trainer by 15 s"
    finally:
        trainer.kill()
        trainer.wait()


def test_a_streamable_http_server_by_url(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [*OURS, "http", str(port)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:

        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        assert wait_for(up, 30), "the streamable-HTTP test server did not listen within 30 s"
        env = make_env("mcp", {"url": f"http://127.0.0.1:{port}/mcp", "tools": ["echo"]})()
        env.reset(Sample("s", prompt="go"))
        result = asyncio.run(env.step(_call("echo", text="over http")))
        assert result.messages == [{"role": "tool", "name": "echo", "content": "over http"}]
    finally:
        release_envs()
        server.terminate()
        server.wait(timeout=10)


@needs_calculator
def test_the_recipe_lists_its_tools_in_a_dry_run_and_trains_leaving_no_server(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hone.cli import main
    from hone.config import load_config
    from hone.rl.loop import train
    from tests.helpers import tiny_overrides

    extra = {
        "env.args.command": f"[{CALCULATOR}]",
        "env.max_tokens_per_turn": 8,
        "data.eval_size": 4,
        "run.steps": 2,
        "run.eval_every": 0,
        "sft.enabled": "true",
        "sft.max_steps": 2,
        "sft.examples": 16,
        "sft.val_size": 4,
        "sft.eval_every": 1,
    }
    overrides = tiny_overrides(tmp_path, micro_model_dir, "agent-mcp-calculator", **extra)
    assert main(["train", "agent-mcp-calculator", *overrides, "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert '"name": "calculator"' in shown and "Calculates/evaluates the given expression." in shown
    assert not _calculators()  # the dry run stopped the server it started
    result = train(load_config("agent-mcp-calculator", overrides))
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss/policy" in r]
    assert len(steps) == 2 and all(r["env/errors"] == 0.0 for r in steps)
    assert not _CONNECTIONS and not _calculators()


def test_the_sdks_own_request_timeout_is_a_timeout_not_a_lost_server() -> None:
    """The SDK's read timeout is a backstop past `timeout_s`; if it fires anyway, the call timed out: the
    server is not restarted (the race that made a slow call read as a lost server under load)."""
    from mcp.shared.exceptions import MCPError

    from hone.envs.mcp_tools import _SDK_TIMEOUT_GRACE_S, _is_request_timeout

    assert _is_request_timeout(MCPError(code=-32001, message="Request 'tools/call' timed out"))
    assert not _is_request_timeout(MCPError(code=-32603, message="internal error"))
    assert not _is_request_timeout(ConnectionError("closed"))
    assert _SDK_TIMEOUT_GRACE_S > 0


@needs_calculator
def test_the_packaged_recipes_server_is_found_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51: `hone train agent-mcp-calculator` away from the clone's root looked for `.venv-mcp` in the
    current folder; a packaged recipe works from any folder."""
    from hone.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        assert main(["train", "agent-mcp-calculator", "--dry-run"]) == 0
    finally:
        release_envs()
    assert "tools the policy can call: calculator" in capsys.readouterr().out  # the server's, renamed


def test_a_missing_server_is_one_short_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = {"command": [".venv-mcp/bin/no-such-server"], "samples": "tool_arithmetic", "timeout_s": 10}
    with pytest.raises(ValueError) as e:
        make_env("mcp", args)
    line = str(e.value)
    assert "make setup-mcp" in line and "samples" not in line and "\n" not in line and len(line) < 200
