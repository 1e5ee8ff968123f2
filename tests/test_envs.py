"""Environments: the built-in games, the registry and `make_env`, and the documented example."""

from __future__ import annotations

import asyncio
import inspect
import re

import pytest

import hone.envs
from hone.envs import ENVIRONMENTS, Environment, FrozenLake, GuessNumber, StepResult, make_env, register_env
from hone.types import Sample

GAMES = ["tool_arithmetic", "guess_number", "frozen_lake"]


def play(env: Environment, sample: Sample, replies: list[str]) -> tuple[list[dict], list[StepResult]]:
    """Drive `env` like the rollout loop does; returns the conversation and each step's result."""
    messages = list(_resolve(env.reset(sample)))
    results = []
    for reply in replies:
        result = _resolve(env.step(reply))
        messages.append({"role": "assistant", "content": reply})
        results.append(result)
        if result.done:
            break
        messages += result.messages
    return messages, results


def _resolve(value):
    return asyncio.run(value) if inspect.isawaitable(value) else value


def _assistant_turns(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


# --- every game ---


@pytest.mark.parametrize("name", GAMES)
def test_registered(name):
    assert name in ENVIRONMENTS
    assert isinstance(make_env(name, {})(), Environment)


@pytest.mark.parametrize("name", GAMES)
def test_samples_deterministic_and_splits_disjoint(name):
    cls = ENVIRONMENTS[name]
    train = cls.make_samples(200, seed=0, split="train")
    assert [s.meta for s in train] == [s.meta for s in cls.make_samples(200, seed=0, split="train")]
    assert [s.meta for s in train] != [s.meta for s in cls.make_samples(200, seed=1, split="train")]
    evals = cls.make_samples(50, seed=0, split="eval") + cls.make_samples(50, seed=7, split="eval")
    key = repr  # the whole problem: meta holds everything that defines it
    if name != "guess_number":  # one prompt, hidden secret: nothing to hold out (its own test below)
        assert not {key(s.meta) for s in train} & {key(s.meta) for s in evals}
    assert len({s.id for s in train}) == 200
    with pytest.raises(ValueError, match="split"):
        cls.make_samples(1, seed=0, split="test")


@pytest.mark.parametrize("name", GAMES)
def test_demonstrations_solve_every_sample(name):
    factory = make_env(name, {})
    for sample in ENVIRONMENTS[name].make_samples(50, seed=3, split="train"):
        demo = factory().demonstration(sample)
        env = factory()  # a fresh instance replays it, as a rollout would
        messages, results = play(env, sample, _assistant_turns(demo))
        assert results[-1].done and results[-1].reward == 1.0, (sample, demo)
        assert sum(r.reward for r in results) == 1.0
        assert messages == demo  # every observation is what the demonstration scripted
        assert len(results) <= env.max_turns


@pytest.mark.parametrize("name", GAMES)
def test_nonsense_replies_never_raise(name):
    env = make_env(name, {})()
    (sample,) = ENVIRONMENTS[name].make_samples(1, seed=0, split="eval")
    replies = ["", "???", "<tool_call>{bad", "-99999999999999999999999", "9" * 5000, "upside down"] * 3
    _, results = play(env, sample, replies)
    assert all(isinstance(r, StepResult) for r in results)


# --- guess_number ---


def _guess(secret: int = 11, **args) -> GuessNumber:
    env = GuessNumber(**args)
    env.reset(Sample(id="g", meta={"secret": secret}))
    return env


def test_guess_number_replies():
    env = _guess(11)
    assert env.reset(Sample(id="g", meta={"secret": 11})) == [
        {"role": "user", "content": "Guess my number (1-32)."}
    ]
    assert env.step("16").messages == [{"role": "user", "content": "lower"}]
    assert env.step("I think 5, or maybe 6").messages == [{"role": "user", "content": "higher"}]
    invalid = env.step("no idea")
    assert invalid.messages == [{"role": "user", "content": "Reply with a number."}]
    assert invalid.reward == 0.0 and not invalid.done and invalid.info == {"invalid": 1.0}
    win = env.step("11")
    assert win.done and win.reward == 1.0


def test_guess_number_runs_out_of_turns():
    env = _guess(20)
    assert env.max_turns == 7  # binary search needs at most 6 for 1..32
    results = [env.step("1") for _ in range(7)]
    assert [r.done for r in results] == [False] * 6 + [True]
    assert all(r.reward == 0.0 for r in results)


def test_guess_number_high_shapes_samples_and_turns():
    samples = GuessNumber.make_samples(100, seed=0, split="train", high=1000)
    assert max(s.meta["secret"] for s in samples) > 32
    env = GuessNumber(high=1000)
    env.reset(samples[0])
    assert env.max_turns == 11
    assert env.reset(samples[0])[0]["content"] == "Guess my number (1-1000)."


def test_guess_number_binary_search_is_short():
    env = GuessNumber()
    for secret in range(1, 33):
        demo = env.demonstration(Sample(id="s", meta={"secret": secret}))
        assert len(_assistant_turns(demo)) <= 6
        assert all(len(m["content"]) <= 6 for m in demo[1:])  # "16", "higher", "lower": a few tokens


def _consistent_guesses(demo: list[dict], high: int) -> bool:
    low, top = 1, high
    for message, reply in zip(demo[1::2], [*demo[2::2], None], strict=True):
        guess = int(message["content"])
        if not low <= guess <= top:
            return False
        if reply is not None:
            low, top = (guess + 1, top) if reply["content"] == "higher" else (low, guess - 1)
    return True


def test_guess_number_splits_play_every_secret_equally_in_different_orders():
    """The policy never sees the secret, so a split that held secrets out would hold out answers (RL on
    the rest learns never to name them): both splits play every secret, once per cycle of `high` games."""
    high = 64
    for split in ("train", "eval"):
        samples = GuessNumber.make_samples(2 * high, seed=0, split=split, high=high)
        for cycle in (samples[:high], samples[high:]):
            assert sorted(s.meta["secret"] for s in cycle) == list(range(1, high + 1))
    train, held = (GuessNumber.make_samples(high, seed=0, split=x, high=high) for x in ("train", "eval"))
    assert [s.meta["secret"] for s in train] != [s.meta["secret"] for s in held]
    assert {s.id for s in train}.isdisjoint(s.id for s in held)


def test_guess_number_spread_demonstrations_search_every_interval():
    """With `demo_spread`, demonstrations pick within the middle of the interval still possible, so they
    stay consistent with every reply and still end at the secret — and they visit far more intervals than
    the nodes of bisection's one search tree."""
    high = 64
    train = GuessNumber.make_samples(2000, seed=0, split="train", high=high)
    intervals: dict[float, set[tuple[int, int]]] = {}
    for spread in (0.0, 0.5):
        env = GuessNumber(high=high, demo_spread=spread)
        intervals[spread] = set()
        for sample in train[:300]:
            demo = env.demonstration(sample)
            assert demo[-1]["content"] == str(sample.meta["secret"]) and _consistent_guesses(demo, high)
            low, top = 1, high
            for guess, reply in zip(demo[1::2], [*demo[2::2], None], strict=True):
                intervals[spread].add((low, top))
                if reply is not None:
                    g = int(guess["content"])
                    low, top = (g + 1, top) if reply["content"] == "higher" else (low, g - 1)
    assert len(intervals[0.0]) <= high  # one tree: at most one interval per secret it can end at
    assert len(intervals[0.5]) > 3 * high
    with pytest.raises(ValueError, match="demo_spread"):
        GuessNumber(demo_spread=1.5)


def test_guess_number_shaping_pays_for_information_and_keeps_solved_at_one_or_more():
    """Hand-computed: in 1..64, 32 -> "higher" leaves 33..64 (log2(64/32) = 1 bit of log2(64) = 6)."""
    env = _guess(37, high=64, shaping=0.6)
    first = env.step("32")
    assert first.reward == pytest.approx(0.6 * 1 / 6)
    assert env.step("32").reward == 0.0  # a repeated guess narrows nothing
    assert env.step("20").reward == 0.0  # nor does one outside the interval still possible
    rewards = [first.reward] + [env.step(g).reward for g in ("48", "40", "36", "38", "37")]
    assert env.turns == 8 and sum(rewards) == pytest.approx(1.0 + 0.6)  # solved: 1 + all the shaping
    unsolved = _guess(37, high=64, shaping=0.6)
    total = sum(unsolved.step(g).reward for g in ("32", "48", "40", "36", "38", "36", "36", "36"))
    assert total == pytest.approx(0.6) and total < 1.0  # narrowed to one number but never said it
    assert _guess(37, high=64).step("32").reward == 0.0  # off by default
    with pytest.raises(ValueError, match="shaping"):
        GuessNumber(shaping=1.0)


# --- frozen_lake ---

LAKE = ["SFFF", "FHFH", "FFFH", "HFFG"]


def _lake(grid=LAKE) -> FrozenLake:
    env = FrozenLake()
    env.reset(Sample(id="lake", meta={"grid": grid}))
    return env


def test_frozen_lake_render_and_moves():
    env = FrozenLake()
    (prompt,) = env.reset(Sample(id="lake", meta={"grid": LAKE}))
    assert prompt["content"].splitlines()[1:] == ["PFFF", "FHFH", "FFFH", "HFFG"]
    assert env.step("right").messages[0]["content"] == "SPFF\nFHFH\nFFFH\nHFFG"
    assert env.step("I will go l").messages[0]["content"].startswith("Invalid move.")
    assert env.step("L").messages[0]["content"] == "PFFF\nFHFH\nFFFH\nHFFG"
    assert env.step("up").messages[0]["content"] == "PFFF\nFHFH\nFFFH\nHFFG"  # wall: stays put
    assert env.step("Move: DOWN.").messages[0]["content"] == "SFFF\nPHFH\nFFFH\nHFFG"


def test_frozen_lake_hole_ends_with_zero():
    env = _lake()
    env.step("right")
    fell = env.step("down")
    assert fell.done and fell.reward == 0.0 and fell.info == {"fell": 1.0}


def test_frozen_lake_invalid_moves_and_turn_limit():
    env = _lake()
    results = [env.step("jump") for _ in range(env.max_turns)]
    assert all(r.info == {"invalid": 1.0} and r.reward == 0.0 for r in results)
    assert [r.done for r in results] == [False] * (env.max_turns - 1) + [True]


def test_frozen_lake_maps_are_solvable_and_varied():
    samples = FrozenLake.make_samples(100, seed=0, split="train")
    assert len({tuple(s.meta["grid"]) for s in samples}) > 90
    starts = {next(i for i, c in enumerate("".join(s.meta["grid"])) if c == "S") for s in samples}
    assert len(starts) > 4  # S is not always in the corner
    for s in samples:
        assert len(s.answer.split()) <= FrozenLake.max_turns


def test_frozen_lake_bad_grid_rejected():
    with pytest.raises(ValueError, match="bad grid"):
        FrozenLake().reset(Sample(id="x", meta={"grid": ["SFX", "FFG"]}))


# --- tool_arithmetic ---


def test_tool_arithmetic_prompt_tools_and_reward():
    env = make_env("tool_arithmetic", {})()
    (sample,) = env.make_samples(1, seed=0, split="train")
    (user,) = env.reset(sample)
    assert re.fullmatch(
        r"What is \d{3,4}[+*]\d{3,4}\? Use the calculator tool, then reply with the answer\.", user["content"]
    )
    assert env.tools[0]["function"]["name"] == "calculator"
    wrong = asyncio.run(env.step("It is 12."))
    assert wrong.done and wrong.reward == 0.0
    env.reset(sample)
    assert asyncio.run(env.step(f"The answer is {sample.answer}.")).reward == 1.0
    env.reset(sample)  # the sum left for the verifier to evaluate: the tool would be optional
    expression = f"{sample.meta['a']}{sample.meta['op']}{sample.meta['b']}"
    assert asyncio.run(env.step(f"The answer is {expression}.")).reward == 0.0


# --- registry and make_env ---


def test_make_env_returns_fresh_instances():
    factory = make_env("guess_number", {"high": 64})
    one, two = factory(), factory()
    assert one is not two and one.high == two.high == 64
    one.reset(Sample(id="a", meta={"secret": 5}))
    two.reset(Sample(id="b", meta={"secret": 60}))
    assert one.step("10").messages[0]["content"] == "lower"
    assert two.step("10").messages[0]["content"] == "higher"


@pytest.mark.parametrize(
    ("spec", "args", "fragment"),
    [
        ("guess_number", {"high": 1}, "'guess_number'.*high must be >= 2"),
        ("guess_number", {"hgh": 40}, "'guess_number'.*hgh"),
        ("frozen_lake", {"size": 99}, "'frozen_lake'.*size"),
        ("no_such_env", {}, "unknown environment 'no_such_env'; registered: .*frozen_lake"),
        ("hone.envs.games:Missing", {}, "'hone.envs.games:Missing'.*cannot import"),
        ("no_such_pkg.mod:Env", {}, "no_such_pkg"),
        ("hone.envs.games.lake:_MOVES", {}, "not a class"),
        ("hone.types:Sample", {"id": "x"}, "not an Environment"),
    ],
)
def test_make_env_fails_at_setup_naming_the_env(spec, args, fragment):
    with pytest.raises(ValueError, match=fragment):
        make_env(spec, args)


def test_make_env_by_dotted_path():
    assert isinstance(make_env("hone.envs.games:FrozenLake", {"size": 5})(), FrozenLake)
    assert isinstance(make_env("hone.envs.games.GuessNumber", {})(), GuessNumber)


def test_register_env_rejects_duplicates_and_default_hooks_explain():
    @register_env("test_envs_dummy")
    class Dummy(Environment):
        def reset(self, sample):
            return []

        def step(self, assistant_message):
            return StepResult([], done=True)

    try:
        with pytest.raises(ValueError, match="already registered"):
            register_env("test_envs_dummy")(Dummy)
        with pytest.raises(NotImplementedError, match="Dummy does not generate its own samples"):
            Dummy.make_samples(1, 0, "train")
        with pytest.raises(NotImplementedError, match="demonstration"):
            Dummy().demonstration(Sample(id="x"))
        assert Dummy().tools is None and Dummy.max_turns == 8
    finally:
        del ENVIRONMENTS["test_envs_dummy"]


# --- the example in hone/envs/__init__.py ---


def test_module_docstring_example_runs():
    (code,) = re.findall(r"```python\n(.*?)```", hone.envs.__doc__ or "", re.DOTALL)
    namespace: dict = {}
    exec(compile(code, "hone/envs/__init__.py:example", "exec"), namespace)
    assert namespace["final"].reward == 1.0
    env = namespace["UnitsEnv"]()
    assert env.tools[0]["function"]["parameters"]["required"] == ["value", "unit"]
    assert len(code.splitlines()) <= 45


def test_arithmetic_retry_gives_feedback_and_a_limited_number_of_tries() -> None:
    from hone.envs.games import ArithmeticRetry

    args = {"min_digits": 2, "max_digits": 3, "ops": "+", "pad": True}
    train = ArithmeticRetry.make_samples(200, 0, "train", **args)
    held_out = ArithmeticRetry.make_samples(100, 0, "eval", **args)
    assert len({s.prompt for s in held_out}) == 100  # distinct evaluation problems
    assert not {s.prompt for s in train} & {s.prompt for s in held_out}
    env = ArithmeticRetry(tries=2, **args)
    sample = held_out[0]
    assert env.reset(sample) == [{"role": "user", "content": sample.prompt}]
    first = env.step("0")
    assert first.messages == [{"role": "user", "content": "wrong"}] and not first.done and first.reward == 0
    right = env.step(str(int(sample.answer or "0")))  # unpadded value counts
    assert right.done and right.reward == 1.0
    env.reset(sample)
    undone = env.step(f"The answer is {sample.meta['a']}+{sample.meta['b']}")  # computing is the point
    assert undone.reward == 0.0 and not undone.done
    env.reset(sample)
    env.step("0")
    assert env.step("1").done  # out of tries
    demo = env.demonstration(sample)
    assert demo[-1] == {"role": "assistant", "content": sample.answer}


def test_arithmetic_retry_demonstrations_recover_from_near_misses_that_are_not_trained_on() -> None:
    from hone.envs.games import ArithmeticRetry

    args = {"min_digits": 2, "max_digits": 3, "ops": "+", "pad": True}
    misses_seen = set()
    for sample in ArithmeticRetry.make_samples(200, 0, "train", **args):
        demo = ArithmeticRetry(tries=3, **args).demonstration(sample)
        # replayed against a fresh environment: each miss is told "wrong", the last turn solves it
        messages, results = play(ArithmeticRetry(tries=3, **args), sample, _assistant_turns(demo))
        assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]
        assert messages == [{k: v for k, v in m.items() if k != "weight"} for m in demo]
        *misses, final = [m for m in demo if m["role"] == "assistant"]
        assert final == {"role": "assistant", "content": sample.answer}  # trained on (no weight 0)
        assert all(m["weight"] == 0 for m in misses)
        tried = [m["content"] for m in misses]
        assert len(set(tried)) == len(tried) and sample.answer not in tried
        for miss in tried:  # one digit off, same width
            assert len(miss) == len(sample.answer or "")
            assert sum(a != b for a, b in zip(miss, sample.answer or "", strict=True)) == 1
        misses_seen.add(len(misses))
    assert misses_seen == {0, 1, 2}
    assert (
        max(
            len(ArithmeticRetry(tries=2, **args).demonstration(s))
            for s in ArithmeticRetry.make_samples(50, 0, "train", **args)
        )
        <= 4
    )
