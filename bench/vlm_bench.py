"""The cost of a `vlm-count` step, split: image processing, vision encoding, decoding, update.

    .venv/bin/python bench/vlm_bench.py [--model tiny-vl] [--prompts 32] [--n 8] [--repeats 3]

One step's shapes as the recipe runs them (32 prompts x 8 samples, 4 new tokens) on the HF engine:
- `encode_s`: the processor (resize, patchify, placeholders expanded) on the step's prompts;
- `sample_s`: `generate`, of which `sample_vision_s` in the vision tower (forward hooks time it) and the
  rest prefill and decode;
- `update_s`: one RL update's forward + backward + AdamW over the 256 rows, of which `update_vision_s` is
  the vision tower's forward;
- group sharing: the same `generate` with the rows ordered so no two neighbours share a prompt (the
  engine prefills each run of identical rows once), which encodes every image n times instead of once:
  `patches_encoded` and the times of both orders, measured in the same process.
Medians over `--repeats`. Writes bench/results/vlm_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import hone.data  # noqa: F401  (registers the vlm_count task)
from hone.data.tasks import get_task
from hone.models.resolve import resolve_model
from hone.rollout.base import GenerationRequest
from hone.rollout.engines.hf import HFSampler
from hone.rollout.engines.hf_engine import sampler_model
from hone.rollout.prompts import encode_prompt
from hone.training.collate import collate
from hone.training.policy import Policy
from hone.types import SamplingParams

RESULTS = Path(__file__).parent / "results" / "vlm_cost.json"


class VisionClock:
    """Wall time and patches of the vision tower's forward passes, by hooks on the module."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.tower = next(m for name, m in model.named_modules() if name.endswith("visual"))
        self.seconds, self.patches, self._start = 0.0, 0, 0.0

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.seconds, self.patches = 0.0, 0

        def before(_m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            pixels = args[0] if args else kwargs["hidden_states"]
            self.patches += int(pixels.shape[0])
            self._start = time.perf_counter()

        def after(*_: Any) -> None:
            self.seconds += time.perf_counter() - self._start

        handles = [
            self.tower.register_forward_pre_hook(before, with_kwargs=True),
            self.tower.register_forward_hook(after),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def one_step(
    policy: Policy,
    sampler: HFSampler,
    samples: list[Any],
    params: SamplingParams,
    optimizer: torch.optim.Optimizer,
    clocks: tuple[VisionClock, VisionClock],
    record: Callable[[str, float], None],
) -> None:
    sampler_clock, policy_clock = clocks
    encode_s, encoded = timed(
        lambda: [encode_prompt(s, policy.tokenizer, True, None, policy.processor) for s in samples]
    )
    requests = [
        GenerationRequest(s.id, k, ids, vision=v)
        for k, (s, (ids, v)) in enumerate(zip(samples, encoded, strict=True))
    ]
    with sampler_clock.counting():
        sample_s, rollouts = timed(lambda: sampler.generate(requests, params))
    record("encode_s", encode_s)
    record("sample_s", sample_s)
    record("sample_vision_s", sampler_clock.seconds)
    record("patches_encoded_grouped", sampler_clock.patches)
    # The same rows, no two neighbours alike: each image is encoded once per row.
    spread = [r for _ in range(params.n) for r in requests]
    one_each = SamplingParams(n=1, max_new_tokens=params.max_new_tokens, seed=0)
    with sampler_clock.counting():
        spread_s, _ = timed(lambda: sampler.generate(spread, one_each))
    record("sample_ungrouped_s", spread_s)
    record("sample_ungrouped_vision_s", sampler_clock.seconds)
    record("patches_encoded_ungrouped", sampler_clock.patches)
    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)

    def update() -> None:
        log_probs, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask, vision=batch.vision)
        loss = -(log_probs * batch.response_mask).sum() / batch.response_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    policy.model.train()
    with policy_clock.counting():
        update_s, _ = timed(update)
    record("update_s", update_s)
    record("update_vision_s", policy_clock.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-vl")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    policy = Policy.from_pretrained(resolve_model(args.model))
    sampler = HFSampler(sampler_model(policy), policy.tokenizer, prefix_cache=False)
    samples = get_task("vlm_count", kinds=["count"]).train_samples(args.prompts, seed=0)
    params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, seed=0)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
    sampler_clock, policy_clock = VisionClock(sampler.model), VisionClock(policy.model)
    rows: dict[str, list[float]] = {}

    def record(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    for _ in range(args.repeats):
        one_step(policy, sampler, samples, params, optimizer, (sampler_clock, policy_clock), record)
    summary: dict[str, Any] = {k: statistics.median(v) for k, v in rows.items()}
    summary["sample_decode_s"] = summary["sample_s"] - summary["sample_vision_s"]
    summary["update_language_s"] = summary["update_s"] - summary["update_vision_s"]
    summary["shape"] = {
        "prompts": args.prompts,
        "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "model": args.model,
    }
    summary["torch_threads"] = torch.get_num_threads()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    for key, value in summary.items():
        print(f"{key:28s} {value:.4f}" if isinstance(value, float) else f"{key:28s} {value}")


if __name__ == "__main__":
    main()
