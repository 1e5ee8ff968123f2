"""Helpers shared by several test modules: run overrides and runners, weight comparisons, stand-in samplers
and trainers, the HFSampler tests' tiny model. Fixtures live in conftest.py; a helper one module alone
uses stays in that module. A flat module: add to it, one function (or constant, or small class) each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from hone.config import HoneConfig, load_config
from hone.data import Task
from hone.data.splits import load_data, validation_samples
from hone.rl.components import RunComponents, setup_components
from hone.rl.loop import Setup, train
from hone.rl.placement.executors import InlineExecutor
from hone.rl.placement.source import Rollouts
from hone.rollout import GenerationRequest, HFSampler
from hone.training.collate import collate
from hone.training.policy import Policy
from hone.types import Batch, Rollout, Sample, SamplingParams, TrainBatch
from tests.conftest import LETTERS, tiny_qwen2

REPO = Path(__file__).parents[1]
TOKEN_REWARD = {"reward.fn": "tests.rewards_for_tests:token_id_reward"}  # a gradient at every step


def wait_for(condition: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passes (False): the one bounded wait for a
    state another thread or process reaches (the caller asserts, with its own message)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def tiny_overrides(run_dir: Path, model_dir: Path, name: str, **extra: object) -> list[str]:
    base = {
        "run.dir": str(run_dir),
        "run.name": name,
        "run.threads": 1,
        "run.time_limit_s": "null",
        "model.path": str(model_dir),
        "data.eval_size": 16,
        "data.train_size": 64,
        "data.prompts_per_step": 4,
        "rollout.n": 4,
        "rollout.max_new_tokens": 5,
        "sft.enabled": "false",
        "logging.progress": "false",
        "logging.plot": "[]",
        "trainer.lr": 1e-3,
        "algorithm.skip_zero_variance_groups": "false",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def tiny_run(root: Path, model_dir: Path, name: str = "r", **extra: object) -> list[str]:
    """Overrides for a run of a few seconds: micro model, 2 prompts x 2 samples, no SFT, no TensorBoard."""
    base = {
        "run.dir": root,
        "run.name": name,
        "run.threads": 1,
        "run.time_limit_s": "null",
        "run.steps": 2,
        "run.save_every": 1,
        "run.eval_every": 0,
        "model.path": model_dir,
        "data.train_size": 16,
        "data.eval_size": 4,
        "data.prompts_per_step": 2,
        "rollout.n": 2,
        "rollout.max_new_tokens": 4,
        "sft.enabled": "false",
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "logging.plot": "[]",
    }
    return [f"{k}={v}" for k, v in (base | extra).items()]


def train_tiny(
    tmp_path: Path, model_dir: Path, name: str, setup: Setup | None = None, **extra: object
) -> Path:
    """A 3-step run in this process (`tiny_overrides`, a gradient at every step), saved at step 3; its
    run directory (see `final_weights`). `setup`: as `train`'s (`recording_setup`)."""
    settings = {"run.steps": 3, "run.save_every": 3, "run.eval_every": 0, **TOKEN_REWARD, **extra}
    train(load_config(None, tiny_overrides(tmp_path, model_dir, name, **settings)), setup=setup)
    return tmp_path / name


def recording_setup(*, reuse_model: bool = False) -> tuple[Setup, list[RunComponents]]:
    """A `train(setup=...)` that builds each run's parts as a run does (`setup_components`), and the list
    it records them in."""
    built: list[RunComponents] = []

    def setup(cfg: HoneConfig) -> RunComponents:
        built.append(setup_components(cfg, reuse_model=reuse_model))
        return built[-1]

    return setup, built


def final_weights(run_dir: Path, step: int = 3) -> dict[str, torch.Tensor]:
    """Every tensor of a `train_tiny` run's step-3 checkpoint (or `step`'s), keyed `file/name`."""
    (checkpoint,) = [p for p in (run_dir / "checkpoints").iterdir() if p.name == f"step-{step}"]
    out: dict[str, torch.Tensor] = {}
    for file in sorted((checkpoint / "model").rglob("*.safetensors")):
        out |= {f"{file.name}/{k}": v for k, v in load_file(str(file)).items()}
    return out


def logged_steps(metrics: Path) -> list[int]:
    """The steps of the complete rows of a metrics.jsonl that a running process may be writing: text after
    the last newline is a row still being written (a reader can see part of a write), not a row yet."""
    if not metrics.exists():
        return []
    text = metrics.read_text()
    return [json.loads(line)["step"] for line in text[: text.rfind("\n") + 1].splitlines() if line]


def run_cli(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    """`hone train ARGS` in a child process (stdout dropped, stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "hone.cli", "train", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def killed_and_resumed(tmp_path: Path, model_dir: Path, **extra: object) -> tuple[Path, Path]:
    """Run `straight` for 8 steps, and `killed` SIGKILLed by its own `run.callbacks` right after step 5
    (between its checkpoints 4 and 8), then resumed with a plain `--resume`; return both final
    checkpoints' `model/` directories."""
    common = {
        "run.steps": 8,
        "run.save_every": 4,
        "run.eval_every": 0,
        "reward.fn": "tests.rewards_for_tests:token_id_reward",  # a gradient at every step
        **extra,
    }
    straight = run_cli(tiny_overrides(tmp_path, model_dir, "straight", **common), tmp_path)
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err.decode()

    kill = {"run.callbacks": '["tests.callbacks_for_tests:sigkill_once_after_step_5"]'}
    killed = run_cli(tiny_overrides(tmp_path, model_dir, "killed", **common, **kill), tmp_path)
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err.decode()
    metrics = tmp_path / "killed" / "metrics.jsonl"
    checkpoints = sorted(
        p.name for p in (tmp_path / "killed" / "checkpoints").iterdir() if p.name.startswith("step-")
    )
    assert checkpoints == ["step-4"] and logged_steps(metrics)[-1] == 5

    resumed = subprocess.run(
        [sys.executable, "-m", "hone.cli", "train", "--resume", str(tmp_path / "killed")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert logged_steps(metrics) == list(range(9))  # no duplicate or missing rows after resume
    saved = [
        tmp_path / "killed" / "checkpoints" / f"step-{s}" / "model" / "model.safetensors" for s in (4, 8)
    ]
    before, after = (load_file(str(file)) for file in saved)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # steps 5-8 trained something
    final = [tmp_path / run / "checkpoints" / "step-8" / "model" for run in ("straight", "killed")]
    return final[0], final[1]


def assert_same_weights(a: Path, b: Path) -> None:
    """Each safetensors file under `a` (merged weights, a LoRA adapter) equals its twin under `b`, bitwise."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    assert files and files == sorted(p.relative_to(b) for p in b.rglob("*.safetensors"))
    for file in files:
        x, y = load_file(str(a / file)), load_file(str(b / file))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), file


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class RecordingTrainer:
    """Stands in for `RLTrainer`: keeps the batches it is handed and takes no time."""

    def __init__(self) -> None:
        self.batches: list[TrainBatch] = []

    def update(self, batch: TrainBatch, step: int, *, entropy_coef: float | None = None) -> dict[str, float]:
        self.batches.append(batch)
        return {}


def make_batch(policy: Policy) -> TrainBatch:
    """Six rollouts of uneven lengths in two groups, with `policy`'s old log-probs and fixed advantages."""
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for i in range(6):
        prompt = torch.randint(2, 60, (3 + i % 2,), generator=g).tolist()
        response = torch.randint(2, 60, (1 + (5 * i) % 7,), generator=g).tolist()  # uneven lengths
        rollouts.append(
            Rollout("s", i // 3, prompt + response, len(prompt), [1] * len(response), [0.0] * len(response))
        )
    seqs = collate(rollouts, pad_id=0)
    with torch.no_grad():
        old, _ = policy.token_log_probs(seqs.input_ids, seqs.attention_mask)
    return train_batch(
        seqs, old_logp=old, advantages=torch.linspace(-1, 1, 6).unsqueeze(-1) * seqs.response_mask
    )


def record_generations(sampler: Any) -> list[tuple[list[int], Rollout]]:
    """Wrap `sampler.generate` so that each (prompt ids, rollout) it returns is recorded in the list."""
    seen: list[tuple[list[int], Rollout]] = []
    generate = sampler.generate

    def recording(requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        outs = generate(requests, params)
        seen.extend((r.prompt_ids, o) for r, o in zip(requests, outs, strict=True))
        return outs

    sampler.generate = recording
    return seen


class Scripted:
    """A sampler that answers turn k of every episode with `replies[k]` and `end` (default: the eos): the
    k-th generate call, or with `by_turn` each episode's own k-th turn (counted in its prompt's
    "assistant:" headers, the micro model's template), for episodes a step samples in more than one call."""

    policy_version = 0

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        replies: list[str],
        end: int | None = None,
        eos_ids: frozenset[int] | None = None,
        by_turn: bool = False,
    ) -> None:
        self.tokenizer, self.replies, self.calls, self.by_turn = tokenizer, replies, 0, by_turn
        self.end = tokenizer.eos_token_id if end is None else end
        self.eos_token_ids = frozenset([tokenizer.eos_token_id]) if eos_ids is None else eos_ids

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        call, self.calls = self.calls, self.calls + 1
        return [self._reply(r, self._turn(r) if self.by_turn else call) for r in requests]

    def _turn(self, request: GenerationRequest) -> int:
        return self.tokenizer.decode(request.prompt_ids).count("assistant:") - 1

    def _reply(self, request: GenerationRequest, k: int) -> Rollout:
        text = self.replies[k]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end]
        prompt = request.prompt_ids
        return Rollout(
            request.sample_id,
            request.group_id,
            prompt + ids,
            len(prompt),
            [1] * len(ids),
            [0.0] * len(ids),
            text,
        )

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        raise NotImplementedError

    def close(self) -> None: ...


# The HFSampler tests' tiny model and prompts (test_sampler.py, test_weights.py, test_vllm.py).
CHARS = "abcdefghijklmnopqrstuvwxyz .!?"
PAD, EOS = 0, 1
PROMPTS = ["ab", "hello world", "x", "the quick brown", "zz top"]
# Log-prob agreement between two ways of computing the same thing (cached decode vs one full forward, a
# reused prefix vs a fresh prefill), compared in float64: the paths differ only in summation order, ~1e-16
# relative per operation, so ~1e-14 at most after two layers over logits of magnitude ~10 (measured: under
# 1e-15), while a real bug (a wrong position, an attended pad, a stale KV cache) moves log-probs by >= 1e-3.
# In fp32 the same reordering gives ~1e-5 here, more or less with another CPU's kernels: not portable.
ATOL = 1e-10


def make_model(seed: int, dtype: torch.dtype = torch.float64) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    # A large init range: with the default one a tied tiny model just repeats its last input token, which
    # would hide position and padding bugs.
    return tiny_qwen2(initializer_range=0.3, pad_token_id=PAD, eos_token_id=EOS).to(dtype)


def requests(tokenizer: PreTrainedTokenizerBase, prompts: list[str] = PROMPTS) -> list[GenerationRequest]:
    return [GenerationRequest(f"s{i}", 10 + i, tokenizer(p)["input_ids"]) for i, p in enumerate(prompts)]


def greedy(max_new_tokens: int = 12, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, **kwargs)


def full_forward_logprobs(model: Qwen2ForCausalLM, rollout: Rollout, temperature: float) -> torch.Tensor:
    """What the trainer computes: one unpadded forward over prompt + response."""
    with torch.no_grad():
        logits = model(torch.tensor([rollout.token_ids])).logits[0, rollout.prompt_len - 1 : -1]
    if temperature > 0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, -1)
    return logprobs.gather(-1, torch.tensor(rollout.response_ids)[:, None]).squeeze(-1)


def prefill_shapes(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (rows, new tokens per row) of each prefill the model runs: the forward passes that keep
    only the last position's logits (`logits_to_keep`), which decoding steps do not ask for."""
    shapes: list[tuple[int, int]] = []
    forward = model.forward

    def spy(*args: object, **kwargs: Any) -> Any:
        if "logits_to_keep" in kwargs:
            rows, width = kwargs["input_ids"].shape
            shapes.append((rows, width))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    return shapes


def prefill_widths(sampler: HFSampler, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the number of new tokens each prefill of `sampler` feeds per row (`prefill_shapes`)."""
    widths: list[int] = []
    forward = sampler.model.forward

    def spy(*args: object, **kwargs: Any) -> Any:
        if "logits_to_keep" in kwargs:
            widths.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    monkeypatch.setattr(sampler.model, "forward", spy)
    return widths


def next_turn(
    tokenizer: PreTrainedTokenizerBase, rollouts: list[Rollout], reply: str
) -> list[GenerationRequest]:
    """Each rollout's whole sequence plus an observation, as the multi-turn loop sends it."""
    obs = tokenizer(reply)["input_ids"]
    return [GenerationRequest(r.sample_id, r.group_id, r.token_ids + obs) for r in rollouts]


def run_splits(
    cfg: HoneConfig, make_env: Callable[[], Any] | None = None
) -> tuple[Task | None, list[Sample], list[Sample]]:
    """`load_data` with the values a run passes it from its config (as `build_components` does)."""
    return load_data(
        cfg.data, eval_size=cfg.eval.size, seed=cfg.run.seed, make_env=make_env, env_args=cfg.env.args
    )


def run_validation(
    cfg: HoneConfig,
    task: Task | None,
    make_env: Callable[[], Any] | None,
    train: list[Sample],
    eval_set: list[Sample],
) -> list[Sample]:
    """`validation_samples` with the values a run's SFT warm start passes it from its config."""
    return validation_samples(
        cfg.data, task, train, eval_set, val_size=cfg.sft.val_size, make_env=make_env, env_args=cfg.env.args
    )


class OneStep:
    """A prompt plan that is one step's prompts (`samples` at `step`), learning nothing from outcomes."""

    def __init__(self, step: int, samples: list[Sample]) -> None:
        self.step, self.samples = step, samples

    def batch(self, step: int) -> list[Sample]:
        assert step == self.step
        return self.samples

    def observe(self, step: int, outcomes: Any) -> dict[str, float]:
        return {}


def sync_source(
    producer: Any, weights: Any, step: int, samples: list[Sample], *, retries: int = 0
) -> Rollouts:
    """The synchronous rollout source of a run, for the one step `step` with the prompts `samples`."""
    executor = InlineExecutor(producer, weights, retries=retries)
    return Rollouts(executor, OneStep(step, samples), start=step, steps=step + 1, ahead=0, version=0)


def train_batch(
    seqs: Batch, *, old_logp: torch.Tensor, advantages: torch.Tensor, **fields: Any
) -> TrainBatch:
    """A `TrainBatch` over collated `seqs` (`hone.training.collate.collate`), as the learner makes one:
    the loss mask is the response mask, the behaviour log-probs are `old_logp` (the sampler was the
    policy) and the returns the advantages, unless `fields` says otherwise."""
    base: dict[str, Any] = {
        "input_ids": seqs.input_ids,
        "attention_mask": seqs.attention_mask,
        "loss_mask": seqs.response_mask,
        "behaviour_logp": old_logp,
        "old_logp": old_logp,
        "advantages": advantages,
        "returns": advantages,
        "group_ids": seqs.group_ids,
        "prompt_lens": seqs.prompt_lens,
    }
    return TrainBatch(**(base | fields))


class FixedSampler:
    """A `Sampler` whose rollouts are a function of each request (`respond(request, params)` gives that
    request's `params.n` rollouts): the producer's episodes, batcher and scoring run for real around it."""

    policy_version = 0
    eos_token_ids: frozenset[int] = frozenset()

    def __init__(self, respond: Callable[[GenerationRequest, SamplingParams], list[Rollout]]) -> None:
        self.respond = respond
        self.calls: list[tuple[list[GenerationRequest], SamplingParams]] = []

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        self.calls.append((requests, params))
        return [r for request in requests for r in self.respond(request, params)]

    def load_weights(self, state_dict: Any, version: int) -> None:
        self.policy_version = version

    def close(self) -> None: ...


class PlainTokenizer:
    """Encodes every plain-text prompt as [1, 2]: enough for single-turn producers over fixed rollouts."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [1, 2]}


def write_pairs(path: Path) -> Path:
    """Six preference pairs over the test alphabet, as `hone dpo` reads them."""
    rows = [
        {"prompt": f"{c}=", "chosen": LETTERS[i + 1] * 2, "rejected": "zz"} for i, c in enumerate(LETTERS[:6])
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dpo_args(tmp_path: Path, model_dir: Path, name: str, *extra: str) -> list[str]:
    """`hone dpo` on `write_pairs`' pairs, 6 steps, the recipe's eval before and after."""
    return [
        "dpo",
        "dpo",
        f"run.dir={tmp_path}",
        f"run.name={name}",
        "run.threads=1",
        "run.time_limit_s=null",
        f"model.path={model_dir}",
        f"dpo.data={write_pairs(tmp_path / 'pairs.jsonl')}",
        "dpo.steps=6",
        "dpo.batch_size=6",
        "dpo.lr=3e-3",
        "data.eval_size=4",
        "rollout.max_new_tokens=4",
        "logging.progress=false",
        "logging.tensorboard=false",
        *extra,
    ]


def shapes(n: int, color: str = "red", size: tuple[int, int] = (56, 56)) -> Image.Image:
    """A test image: `n` small squares of `color` on white (images that differ by count, colour or size)."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for k in range(n):
        draw.rectangle((4 + 12 * k, 4 + 6 * k, 12 + 12 * k, 12 + 6 * k), fill=color)
    return image
