"""The `openenv` adapter against real OpenEnv servers built with openenv-core's server API: the port of
`guess_number` (`hone.envs.openenv_games`) served in this process by uvicorn, or started by Hone as a
process. Episodes through the adapter equal the built-in game's; started servers never outlive a run."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
import yaml

from hone.envs import Environment, GuessNumber, OpenEnv, StepResult, make_env
from hone.envs.openenv_servers import _SERVERS
from hone.types import Sample, SamplingParams
from tests.helpers import Scripted, wait_for

APP = "hone.envs.openenv_games:app"
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(app: object) -> Iterator[str]:
    """`app` served by uvicorn on a thread of this process; its URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: server.started, 30), "the in-process OpenEnv server did not start within 30 s"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """The guess_number server (`hone.envs.openenv_games`)."""
    from hone.envs.openenv_games import app

    with _serving(app) as served:
        yield served


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _transcript(env: Environment, sample: Sample, moves: list[str]) -> list[object]:
    """What `env` says to `moves` (sync or async, one event loop as in the rollout loop): the initial
    messages, then (messages, reward, done, solved, invalid) per move until done; then closed."""

    async def play() -> list[object]:
        async def call(value: object) -> object:
            return await value if asyncio.iscoroutine(value) else value

        out: list[object] = [await call(env.reset(sample))]
        for move in moves:
            r = await call(env.step(move))
            assert isinstance(r, StepResult)
            info = (r.info.get("solved", 0.0), r.info.get("invalid", 0.0))
            out.append((r.messages, round(r.reward, 12), r.done, info))
            if r.done:
                break
        await call(env.close())
        return out

    return asyncio.run(play())


GAME_ARGS = {"high": 64, "demo_spread": 0.5}


def _adapter_args(url: str, **extra: object) -> dict[str, object]:
    return {
        "url": url,
        "samples": "guess_number",
        "samples_args": GAME_ARGS,
        "info_fields": ["solved", "invalid"],
        **extra,
    }


@pytest.mark.parametrize("shaping", [0.0, 0.5])
def test_episodes_through_the_adapter_equal_the_builtin_games(url: str, shaping: float) -> None:
    args = _adapter_args(url, reset_args={"shaping": shaping})
    make = make_env("openenv", args)
    samples = OpenEnv.make_samples(4, 0, "train", **args)  # as a run calls it: with the env's args
    assert samples == GuessNumber.make_samples(4, 0, "train", **GAME_ARGS)  # the game's own samples
    builtin = GuessNumber(**GAME_ARGS, shaping=shaping)
    assert make().max_turns == builtin.max_turns == 8
    for sample in samples:
        solution = [m["content"] for m in builtin.demonstration(sample) if m["role"] == "assistant"]
        # the scripted solution; a game of mistakes (no number, out of range, repeats) that runs out of turns
        for moves in (solution, ["abc", "0", "70", "32", "32", "I say 5", "-3", "64", "1"]):
            ours = _transcript(make(), sample, moves)
            assert ours == _transcript(GuessNumber(**GAME_ARGS, shaping=shaping), sample, moves)
        assert ours[-1][2] is True  # the game ended it (solved or out of turns), not the test's moves
    # The demonstration the adapter lends SFT is the conversation the server plays.
    sample = samples[0]
    demo = make().demonstration(sample)
    played = _transcript(make(), sample, [m["content"] for m in demo if m["role"] == "assistant"])
    conversation = list(played[0])
    for (messages, *_), move in zip(played[1:], [m for m in demo if m["role"] == "assistant"], strict=True):
        conversation += [move, *messages]
    assert conversation == demo


def test_the_docs_server_trains_through_its_recipe(tmp_path: Path) -> None:
    """docs/how-to/agents.md "OpenEnv environments": its server, written with openenv-core's API alone,
    plays the games its recipe names (bisection wins in the same turns as on the built-in game)."""
    page = (ROOT / "docs" / "how-to" / "agents.md").read_text()
    section = page[page.index("## OpenEnv environments") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    recipe = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "readme_server.py").write_text(code)
    spec = importlib.util.spec_from_file_location("readme_server", tmp_path / "readme_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = yaml.safe_load(recipe)["env"]["args"]
    assert args.pop("app") == "mygame.server:app"
    with _serving(module.app) as served:
        make = make_env("openenv", {"url": served, **args})
        sample = OpenEnv.make_samples(1, 0, "train", **args)[0]
        builtin = GuessNumber().demonstration(sample)  # samples_args default: high 32
        moves = [m["content"] for m in builtin if m["role"] == "assistant"]
        played = _transcript(make(), sample, moves)
    assert played[0] == [{"role": "user", "content": "Guess my number, 1 to 32."}]
    replies = [m for m in builtin[1:] if m["role"] == "user"]
    assert [m for messages, *_ in played[1:] for m in messages] == replies
    assert played[-1][1:3] == (1.0, True)


def spelled_out(text: str) -> dict[str, str]:
    """An action builder: the server wants digits, the policy writes words."""
    words = {"one": "1", "thirty-two": "32"}
    return {"message": " ".join(words.get(w, w) for w in text.split())}


def bracketed(observation: dict[str, object]) -> str:
    return f"[{observation['message']}]"


def test_an_action_builder_and_a_renderer_replace_the_fields(url: str) -> None:
    args = {"url": url, "action": "tests.test_openenv:spelled_out", "render": "tests.test_openenv:bracketed"}
    sample = Sample(id="s", meta={"secret": 1, "high": 64})
    played = _transcript(make_env("openenv", args)(), sample, ["thirty-two", "one"])
    assert played[1] == ([{"role": "user", "content": "[lower]"}], 0.0, False, (0.0, 0.0))
    assert played[2][1:3] == (1.0, True)


def test_every_trajectory_has_its_own_session(url: str) -> None:
    make = make_env("openenv", _adapter_args(url))
    a, b = make(), make()
    low, high = (Sample(id=s, meta={"secret": v, "high": 64}) for s, v in (("low", 3), ("high", 60)))

    async def both() -> tuple[StepResult, StepResult]:
        await asyncio.gather(a.reset(low), b.reset(high))
        replies = await asyncio.gather(a.step("32"), b.step("32"))
        await asyncio.gather(a.close(), b.close())
        return replies

    ra, rb = asyncio.run(both())
    assert ra.messages[0]["content"] == "lower" and rb.messages[0]["content"] == "higher"


def test_a_server_of_one_session_plays_a_batch_one_episode_at_a_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """OpenEnv's default (`max_concurrent_envs=1`): probed at set-up and said in one line; four episodes
    started at once all finish, each waiting for the session (unlimited, three would be refused)."""
    from openenv.core.env_server import create_app

    from hone.envs import openenv_servers as adapter
    from hone.envs.openenv_games import GuessAction, GuessNumberEnvironment, GuessObservation

    one = create_app(GuessNumberEnvironment, GuessAction, GuessObservation, env_name="guess_number")
    with _serving(one) as single, caplog.at_level(logging.INFO, logger="hone"):
        make = make_env("openenv", _adapter_args(single))
        envs = [make() for _ in range(4)]
        samples = [Sample(id=str(k), meta={"secret": 10 + k, "high": 64}) for k in range(4)]

        async def play(env: Environment, sample: Sample) -> StepResult:
            await env.reset(sample)  # type: ignore[misc]
            result = await env.step(str(10 + int(sample.id)))  # type: ignore[misc]
            await env.close()  # type: ignore[misc]
            return result

        async def all_four() -> list[StepResult]:
            return list(await asyncio.gather(*(play(e, s) for e, s in zip(envs, samples, strict=True))))

        results = asyncio.run(all_four())
        adapter.stop_servers()
    assert all(r.done and r.info.get("solved") == 1.0 for r in results)
    assert "serves 1 session(s) at once (probed)" in caplog.text


def test_a_pool_of_started_one_session_servers_plays_episodes_side_by_side(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`env.args.servers: 2` of a one-session app: Hone starts both, says so in one line, and four episodes
    started at once share the two sessions; every server stops with the run."""
    from hone.envs import openenv_servers as adapter

    args = {"app": "tests.openenv_apps_for_tests:one_session", "servers": 2, "info_fields": ["solved"]}
    with caplog.at_level(logging.INFO, logger="hone"):
        make = make_env("openenv", args)
        envs = [make() for _ in range(4)]
    samples = [Sample(id=str(k), meta={"secret": 10 + k, "high": 64}) for k in range(4)]
    used: list[str] = []
    two_in_sessions = asyncio.Event()  # bound to asyncio.run's loop at its first wait

    async def play(env: Environment, sample: Sample) -> StepResult:
        await env.reset(sample)  # type: ignore[misc]
        used.append(id(env._slots))  # type: ignore[attr-defined]  # the session semaphore of its server
        if len(used) == 2:
            two_in_sessions.set()
        # hold the session until a second episode has one: one session a server, so both servers play
        await asyncio.wait_for(two_in_sessions.wait(), 120)
        result = await env.step(str(10 + int(sample.id)))  # type: ignore[misc]
        await env.close()  # type: ignore[misc]
        return result

    async def all_four() -> list[StepResult]:
        return list(await asyncio.gather(*(play(e, s) for e, s in zip(envs, samples, strict=True))))

    servers = list(adapter._SERVERS.values())
    try:
        results = asyncio.run(all_four())
    finally:
        adapter.stop_servers()
    assert all(r.done and r.info.get("solved") == 1.0 for r in results)
    assert len(servers) == 2 and len(set(used)) == 2  # both servers played
    assert "serves 1 session(s) at once (probed)" in caplog.text
    assert re.search(
        r"openenv: 2 servers of `.*tests.openenv_apps_for_tests:one_session.*` started", caplog.text
    )
    assert all(s.process.poll() is not None for s in servers)
    with pytest.raises(ValueError, match="more than 1 only for a server Hone starts"):
        make_env("openenv", {"url": "http://127.0.0.1:1", "servers": 2})


def test_the_app_openenv_init_generates_plays_token_for_token(tmp_path: Path, micro_model_dir: Path) -> None:
    """Held out: the environment `openenv init` writes (openenv-core's own echo app, one session by default,
    code nobody here wrote), started by Hone as a pool of two servers. Each reply is echoed back with reward
    0.1 per character; the trajectory is exactly the template's rendering of the conversation."""
    from hone.envs import openenv_servers as adapter
    from hone.rollout.multiturn import EpisodeLimits, run_episodes
    from hone.training.policy import Policy

    init = [
        str(Path(sys.executable).with_name("openenv")),
        "init",
        "echo_probe",
        "--output-dir",
        str(tmp_path),
    ]
    subprocess.run(init, check=True, capture_output=True, timeout=120)
    app_dir = tmp_path / "echo_probe"
    serve = [sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), "server.app:app"]
    args = {
        "command": [*serve, "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"],
        "servers": 2,
        "observation_field": "echoed_message",
        "info_fields": ["message_length"],
    }
    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    make = make_env("openenv", args)
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_total_tokens=256)
    samples = [Sample("a", prompt="unused"), Sample("b", prompt="unused")]
    try:
        rollouts = run_episodes(
            Scripted(tok, ["hello", "hi"], by_turn=True), tok, make, samples, SamplingParams(n=2), limits
        )
    finally:
        adapter.stop_servers()
    assert len(rollouts) == 4
    opening = tok.apply_chat_template(
        [{"role": "user", "content": "Echo Probe environment ready!"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    hello, hi = ([*tok.encode(text, add_special_tokens=False), tok.eos_token_id] for text in ("hello", "hi"))
    echo = tok.encode("\nuser: hello\nassistant: ", add_special_tokens=False)
    for r in rollouts:
        assert r.metrics["env/errors"] == 0.0 and r.metrics["env/message_length"] == 7.0
        assert r.turn_rewards == pytest.approx([0.5, 0.2])  # the app's reward: 0.1 per character
        assert r.token_ids[: r.prompt_len] == tok.encode(opening, add_special_tokens=False)
        assert r.response_ids == hello + echo + hi
        assert r.loss_mask == [1] * len(hello) + [0] * len(echo) + [1] * len(hi)


def test_bad_args_and_an_unreachable_server_fail_at_set_up_in_one_line(url: str) -> None:
    closed = f"http://127.0.0.1:{_free_port()}"
    cases = {
        "exactly one of url": {},
        "got \\['url', 'app'\\]": {"url": url, "app": APP},
        f"server at {closed} is unreachable: GET {closed}/health": {"url": closed},
        "action field 'guess', but the server at .* has action fields \\['message'\\]": {
            "url": url,
            "action_field": "guess",
        },
        "observation field 'score'": {"url": url, "info_fields": ["score"]},
        "must contain '\\{port\\}'": {"command": ["python", "-m", "my_env"]},
        "unknown environment 'no_such_game'": {"url": url, "samples": "no_such_game"},
        "env.args.action: cannot import 'fn' from 'nowhere'": {"url": url, "action": "nowhere:fn"},
    }
    for message, args in cases.items():
        with pytest.raises(ValueError, match=message) as info:
            make_env("openenv", args)
        assert "\n" not in str(info.value)


def test_a_started_server_that_exits_or_never_answers_is_reported_with_its_last_lines(tmp_path: Path) -> None:
    exits = [sys.executable, "-c", "import sys; print('no such environment: x'); sys.exit(3)", "{port}"]
    with pytest.raises(ValueError, match=r"exited with code 3 .*its last lines: no such environment: x"):
        make_env("openenv", {"command": exits})
    pid_file = tmp_path / "pid"
    script = (
        "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
        "print('loading', flush=True); time.sleep(60)"
    )
    hangs = [sys.executable, "-c", script, str(pid_file), "{port}"]
    with pytest.raises(
        ValueError, match=r"did not answer .*/health within 1 s .*its last lines: loading"
    ) as info:
        make_env("openenv", {"command": hangs, "start_timeout_s": 1})
    assert "\n" not in str(info.value)
    assert not _alive(int(pid_file.read_text()))  # stopped, not left running
    assert not _SERVERS


@pytest.fixture
def stand_in(tmp_path: Path) -> list[str]:
    """A command that serves `/health` and `/schema` as the guess_number server does, and nothing else: a
    process that starts in milliseconds, for the tests of how Hone starts and stops servers."""
    from hone.envs.openenv_games import GuessAction, GuessObservation

    (tmp_path / "health").write_text('{"status": "healthy"}')
    schemas = {"action": GuessAction.model_json_schema(), "observation": GuessObservation.model_json_schema()}
    (tmp_path / "schema").write_text(json.dumps(schemas))
    return [
        sys.executable,
        "-m",
        "http.server",
        "{port}",
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp_path),
    ]


def test_a_server_hone_started_is_stopped_when_set_up_fails_after_it(
    stand_in: list[str], tmp_path: Path
) -> None:
    from hone.config import load_config
    from hone.rl.loop import SetupError, train

    cfg = load_config("agent-guess-openenv", [f"run.dir={tmp_path}", f"model.path={tmp_path}/no-model"])
    cfg.env.args = {"command": stand_in, "samples": "guess_number"}
    started = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("hone.envs.openenv_servers._SERVERS", _Recording(started))
        with pytest.raises(SetupError, match="no-model"):
            train(cfg)
    (server,) = started
    assert server.process.poll() is not None and not _alive(server.process.pid)


class _Recording(dict):
    """`_SERVERS`, keeping a list of every server put in it."""

    def __init__(self, log: list[object]) -> None:
        super().__init__()
        self.log = log

    def __setitem__(self, key: str, server: object) -> None:
        self.log.append(server)
        super().__setitem__(key, server)


def test_a_started_server_dies_with_a_killed_trainer(stand_in: list[str]) -> None:
    """SIGKILL leaves Python no time to clean up: the kernel's parent-death signal stops the server."""
    script = textwrap.dedent(
        f"""
        from hone.envs import make_env
        from hone.envs.openenv_servers import _SERVERS
        make_env("openenv", {{"command": {stand_in!r}}})
        print(next(iter(_SERVERS.values())).process.pid, flush=True)
        import time; time.sleep(120)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert trainer.stdout is not None
        server_pid = int(trainer.stdout.readline())
        assert _alive(server_pid)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        assert wait_for(lambda: not _alive(server_pid), 15), "the server outlived the killed trainer by 15 s"
    finally:
        trainer.kill()
        trainer.wait()


class FailsOn(Environment):
    """Fails in reset for the sample "broken", and in step on the reply "boom" (but for "steady")."""

    max_turns = 3

    def reset(self, sample: Sample) -> list[dict[str, str]]:
        if sample.id == "broken":
            raise ConnectionError("server gone")
        self.steady = sample.id == "steady"
        return [{"role": "user", "content": "go"}]

    async def step(self, assistant_message: str) -> StepResult:
        if assistant_message == "boom" and not self.steady:
            raise RuntimeError("step failed")
        return StepResult([{"role": "user", "content": "again"}])


def test_an_environment_error_ends_that_episode_only_and_is_counted(micro_model_dir: Path, url: str) -> None:
    from hone.rollout.multiturn import EpisodeLimits, run_episodes
    from hone.training.policy import Policy

    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    samples = [Sample("ok", prompt="p"), Sample("broken", prompt="p"), Sample("steady", prompt="p")]
    limits = EpisodeLimits(max_turns=3, max_tokens_per_turn=8, max_total_tokens=256)
    replies = ["fine", "boom", "fine"]
    rollouts = run_episodes(Scripted(tok, replies), tok, FailsOn, samples, SamplingParams(n=1), limits)
    ok, broken, steady = rollouts
    assert broken.metrics["env/errors"] == 1.0 and broken.response_len == 0 and broken.turns == []
    assert ok.metrics["env/errors"] == 1.0 and len(ok.turns) == 2  # "fine", then "boom" failed: ended
    assert not ok.metrics["episode/truncated"]
    assert steady.metrics["env/errors"] == 0.0 and len(steady.turns) == 3
    # Every episode failing is no run to go on with (a server down for good): the batch raises.
    with pytest.raises(RuntimeError, match="every one of 2 episodes ended on an environment error"):
        run_episodes(Scripted(tok, replies), tok, FailsOn, samples[:2], SamplingParams(n=1), limits)
    rollouts = run_episodes(
        Scripted(tok, ["fine"] * 3), tok, FailsOn, samples[:1], SamplingParams(n=1), limits
    )
    assert rollouts[0].metrics["env/errors"] == 0.0 and len(rollouts[0].turns) == 3
    # The same through a real server: its reset raises for an unknown argument, the client says so.
    make = make_env("openenv", {"url": url})
    games = [Sample("ok", meta={"secret": 9, "high": 64}), Sample("odd", meta={"secret": 9, "colour": 1})]
    ok, odd = run_episodes(Scripted(tok, ["9"]), tok, make, games, SamplingParams(n=1), limits)
    assert (ok.metrics["env/errors"], ok.turn_rewards) == (0.0, [1.0])
    assert odd.metrics["env/errors"] == 1.0 and odd.response_len == 0


def test_a_run_most_of_whose_episodes_fail_stops_and_one_that_loses_a_few_goes_on(
    micro_model_dir: Path,
) -> None:
    """An OpenEnv app of one session used to lose 7 of 8 episodes of every batch while `hone train` went
    on: once a batch and the run so far both lost more than half (after 16 episodes), the run stops."""
    from hone.rollout.episodes import play_sync
    from hone.rollout.multiturn import EpisodeLimits, Episodes, MostEpisodesFailedError
    from hone.training.policy import Policy

    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    limits = EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_total_tokens=64)
    mostly = [Sample("ok", prompt="p"), *(Sample("broken", prompt="p") for _ in range(3))]
    few = [Sample("ok", prompt="p"), Sample("ok", prompt="p"), Sample("ok", prompt="p"), mostly[1]]

    def batches(samples: list[Sample], n: int) -> int:
        episodes = Episodes(FailsOn, limits)
        for played in range(n):
            try:
                play_sync(Scripted(tok, ["fine"]), tok, episodes, samples, SamplingParams(n=1))
            except MostEpisodesFailedError as stop:
                assert str(stop).startswith("12 of the run's 16 episodes ended on an environment error (3 of")
                assert "server gone" in str(stop)
                return played + 1
        return n

    assert batches(mostly, 10) == 4  # 3 of 4 lost each batch: stopped at the 16th episode
    assert batches(few, 10) == 10  # 1 of 4 lost: counted in env/errors, the run goes on


def test_training_through_the_adapter_equals_training_on_the_builtin_game(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """The two recipes differ only in `env`: with the same seed the runs are the same, step for step
    (the same games, demonstrations, sampled tokens and replies), except for the time they took."""
    from hone.config import load_config
    from hone.rl.loop import train
    from tests.helpers import tiny_overrides

    def run(recipe: str, game_args: str) -> list[dict[str, float]]:
        extra = {
            game_args: "{high: 8, demo_spread: 0.5}",
            "env.max_tokens_per_turn": 3,
            "data.eval_size": 8,
            "run.steps": 2,
            "run.eval_every": 1,
            "sft.enabled": "true",
            "sft.max_steps": 2,
            "sft.examples": 16,
            "sft.val_size": 4,
            "sft.eval_every": 1,
        }
        result = train(load_config(recipe, tiny_overrides(tmp_path, micro_model_dir, recipe, **extra)))
        rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows]

    started: list[object] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("hone.envs.openenv_servers._SERVERS", _Recording(started))
        ours = run("agent-guess-openenv", "env.args.samples_args")
    (server,) = started  # one server for every episode of the run and its evaluations
    assert server.process.poll() is not None and not _alive(server.process.pid)  # stopped at the end
    steps = [r for r in ours if "loss/policy" in r]
    assert len(steps) == 2 and all(r["env/errors"] == 0.0 and r["episode/turns"] >= 1 for r in steps)
    assert ours == run("agent-guess", "env.args")
