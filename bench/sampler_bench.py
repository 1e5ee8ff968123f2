"""Throughput of HFSampler vs `model.generate` on a ~1M-parameter model on CPU.

Why: the hand-written decode loop in hone/rollout/hf.py is only worth keeping if it is at least as fast as
transformers' own; it wins mainly when responses end early (finished rows are dropped from the batch and
the KV cache, while `generate` keeps decoding them).
Counted tokens are the ones a rollout keeps (up to and including eos), so padding that `generate` keeps
decoding for finished rows is not counted as throughput.

    .venv/bin/python bench/sampler_bench.py
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from hone.rollout import GenerationRequest, HFSampler
from hone.types import SamplingParams

CHARS = "abcdefghijklmnopqr"  # + <pad>, <eos> = vocab 20
PAD, EOS = 0, 1
WORKLOADS = [(256, 8), (64, 64)]  # (prompts, new tokens)
REPEATS = 5


def build() -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    vocab = {"<pad>": PAD, "<eos>": EOS, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(["<pad>", "<eos>"])
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=512,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    return Qwen2ForCausalLM(config).eval(), tokenizer


def best_rates(runs: list[Callable[[], int]]) -> list[float]:
    """New tokens/s of each run, best of REPEATS after a warm-up.

    Runs are interleaved so that load from other processes on the shared CPU hits them alike.
    """
    rates: list[list[float]] = [[] for _ in runs]
    for repeat in range(REPEATS + 1):
        for run, rate in zip(runs, rates, strict=True):
            start = time.perf_counter()
            tokens = run()
            if repeat:
                rate.append(tokens / (time.perf_counter() - start))
    return [max(rate) for rate in rates]


def hone_run(sampler: HFSampler, requests: list[GenerationRequest], new_tokens: int) -> int:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    return sum(r.response_len for r in sampler.generate(requests, params))


def hf_run(model: Qwen2ForCausalLM, requests: list[GenerationRequest], new_tokens: int, eos: bool) -> int:
    width = max(len(r.prompt_ids) for r in requests)
    input_ids = torch.tensor([[PAD] * (width - len(r.prompt_ids)) + r.prompt_ids for r in requests])
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=(input_ids != PAD).long(),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            pad_token_id=PAD,
            eos_token_id=EOS if eos else None,
        )
    rows = out[:, width:].tolist()
    return sum(row.index(EOS) + 1 if eos and EOS in row else len(row) for row in rows)


def random_requests(rng: random.Random, count: int) -> list[GenerationRequest]:
    """Prompts of 4..16 random characters, so the batch needs left padding."""
    ids = range(2, len(CHARS) + 2)
    return [GenerationRequest(str(i), i, rng.choices(ids, k=rng.randint(4, 16))) for i in range(count)]


def main() -> None:
    torch.set_num_threads(2)
    model, tokenizer = build()
    rng = random.Random(0)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, vocab {len(tokenizer)}")
    print(f"{'prompts x new':>14} {'eos':>4} {'HFSampler tok/s':>16} {'generate tok/s':>15} {'ratio':>6}")
    for prompts, new_tokens in WORKLOADS:
        requests = random_requests(rng, prompts)
        for eos in (False, True):
            # Without eos every row runs the full budget: this isolates the per-step cost of the loops.
            # With it rows finish at random times, as RL responses do.
            model.generation_config.eos_token_id = EOS if eos else []
            sampler = HFSampler(model, tokenizer)
            ours, theirs = best_rates(
                [
                    partial(hone_run, sampler, requests, new_tokens),
                    partial(hf_run, model, requests, new_tokens, eos),
                ]
            )
            row = f"{prompts} x {new_tokens:<3} {'on' if eos else 'off':>4} {ours:>16,.0f} {theirs:>15,.0f}"
            print(f"{row} {ours / theirs:>5.1f}x")


if __name__ == "__main__":
    main()
