"""Throughput of HFSampler vs `model.generate` on a ~1M-parameter model on CPU.

Why: the hand-written decode loop in hone/rollout/engines/hf.py is worth keeping if it is at least as fast as
transformers' own; it wins when responses end early (finished rows are dropped from the batch and the KV
cache, while `generate` keeps decoding them) and when a prompt is sampled n times, as GRPO does (each
prompt is prefilled once and its cache copied; `generate(num_return_sequences=n)` prefills n copies).
Counted tokens are the ones a rollout keeps (up to and including eos), so padding that `generate` keeps
decoding for finished rows is not counted as throughput.

The second table is multi-turn traffic (what `hone/rollout/multiturn.py` sends): each turn's prompts are
the last turn's whole sequences plus an observation. The peer is the same sampler with `prefix_cache`
off, which re-encodes every context each turn as `generate` would.

The third part (`--vllm`, needs `make setup-smollm2 setup-vllm`) is the vLLM engine (`rollout.engine:
vllm`, hone/rollout/engines/vllm.py) against `HFSampler` on SmolLM2-135M-Instruct, fp32: a GRPO-shaped batch
(8 word problems x 8 samples x 64 new tokens, temperature 1) and multi-turn traffic (8 prompts x 4
samples, 4 turns of 16 tokens, a 20-token observation between turns), each engine with its prefix cache;
and the time of a weight sync (the full state dict written to /dev/shm and loaded into the running
engine), over 5 updates.

    .venv/bin/python bench/sampler_bench.py           # the HF sampler's tables (~2 minutes)
    .venv/bin/python bench/sampler_bench.py --vllm    # the vLLM rows (~4 minutes with the engine start)
"""

from __future__ import annotations

import random
import sys
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
# (prompts, samples per prompt, prompt length range, new tokens)
WORKLOADS = [(256, 1, (4, 16), 8), (64, 1, (4, 16), 64), (16, 8, (96, 160), 16)]
# (prompts, samples per prompt, prompt length range, new tokens per turn, turns, observation tokens)
CONVERSATIONS = [(32, 8, (24, 32), 8, 3, 20), (16, 4, (48, 64), 16, 6, 40)]
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


def best_rates(runs: list[Callable[[], int]], repeats: int = REPEATS) -> list[float]:
    """New tokens/s of each run, best of REPEATS after a warm-up.

    Runs are interleaved so that load from other processes on the shared CPU hits them alike.
    """
    rates: list[list[float]] = [[] for _ in runs]
    for repeat in range(repeats + 1):
        for run, rate in zip(runs, rates, strict=True):
            start = time.perf_counter()
            tokens = run()
            if repeat:
                rate.append(tokens / (time.perf_counter() - start))
    return [max(rate) for rate in rates]


def hone_run(sampler: HFSampler, requests: list[GenerationRequest], n: int, new_tokens: int) -> int:
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=new_tokens, seed=0)
    return sum(r.response_len for r in sampler.generate(requests, params))


def conversation_run(
    sampler: HFSampler, requests: list[GenerationRequest], n: int, new_tokens: int, turns: int, obs: list[int]
) -> int:
    """`turns` calls, each continuing every sequence of the last with the same observation tokens."""
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=new_tokens, seed=0)
    rollouts = sampler.generate(requests, params)
    tokens = sum(r.response_len for r in rollouts)
    for turn in range(1, turns):
        params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens, seed=turn)
        continued = [GenerationRequest(r.sample_id, r.group_id, r.token_ids + obs) for r in rollouts]
        rollouts = sampler.generate(continued, params)
        tokens += sum(r.response_len for r in rollouts)
    return tokens


def hf_run(
    model: Qwen2ForCausalLM, requests: list[GenerationRequest], n: int, new_tokens: int, eos: bool
) -> int:
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
            num_return_sequences=n,
            pad_token_id=PAD,
            eos_token_id=EOS if eos else None,
        )
    rows = out[:, width:].tolist()
    return sum(row.index(EOS) + 1 if eos and EOS in row else len(row) for row in rows)


def random_requests(rng: random.Random, count: int, lengths: tuple[int, int]) -> list[GenerationRequest]:
    """Prompts of random characters and lengths, so the batch needs left padding."""
    ids = range(2, len(CHARS) + 2)
    return [GenerationRequest(str(i), i, rng.choices(ids, k=rng.randint(*lengths))) for i in range(count)]


def _rate_row(ours: float, theirs: float) -> str:
    return f"{ours:>11,.0f} {theirs:>16,.0f} {ours / theirs:>5.1f}x"


def vllm_rows() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hone.data import get_task
    from hone.models import resolve_model
    from hone.rollout import eos_token_ids
    from hone.rollout.engines.vllm import VLLMSampler

    path = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = eos_token_ids(model, tokenizer)
    problems = get_task("word_problems").train_samples(8, seed=0)
    requests = [
        GenerationRequest(
            p.id,
            i,
            tokenizer.encode(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": p.prompt}], add_generation_prompt=True, tokenize=False
                ),
                add_special_tokens=False,
            ),
        )
        for i, p in enumerate(problems)
    ]
    obs = tokenizer.encode(" The tool says: 17 apples and 25 pears were counted here today.")[:20]
    started = time.perf_counter()
    engine = VLLMSampler(path, tokenizer, eos)
    start_s = time.perf_counter() - started
    print(f"\nvLLM {engine.vllm_version} engine start: {start_s:.1f} s (SmolLM2-135M, fp32)")
    try:
        hf = HFSampler(model, tokenizer)
        print(f"{'workload':>44} {'vLLM tok/s':>11} {'HFSampler tok/s':>16} {'ratio':>6}")
        grpo = [partial(hone_run, engine, requests, 8, 64), partial(hone_run, hf, requests, 8, 64)]
        ours, theirs = best_rates(grpo, repeats=3)
        print(f"{'GRPO: 8 prompts x 8 samples x 64 new':>44} {_rate_row(ours, theirs)}")
        turns = [
            partial(conversation_run, engine, requests, 4, 16, 4, obs),
            partial(conversation_run, hf, requests, 4, 16, 4, obs),
        ]
        ours, theirs = best_rates(turns, repeats=3)
        print(f"{'multi-turn: 8 x 4 x 16 new x 4 turns, obs 20':>44} {_rate_row(ours, theirs)}")
        syncs, loads = [], []
        for version in range(1, 6):
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)
            state = {k: v.detach() for k, v in model.state_dict().items()}
            t0 = time.perf_counter()
            engine.load_weights(state, version)
            syncs.append(time.perf_counter() - t0)
            loads.append(engine.last_load_s)
        print(
            f"weight sync, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters: "
            f"{sum(syncs) / len(syncs):.2f} s a sync (engine load {sum(loads) / len(loads):.2f} s), "
            f"mean of {len(syncs)}; max {max(syncs):.2f} s"
        )
    finally:
        engine.close()


def main() -> None:
    if "--vllm" in sys.argv[1:]:
        torch.set_num_threads(2)
        vllm_rows()
        return
    torch.set_num_threads(2)
    model, tokenizer = build()
    rng = random.Random(0)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, vocab {len(tokenizer)}")
    header = (
        f"{'prompts x n x new (prompt len)':>31} {'eos':>4} {'HFSampler tok/s':>16} {'generate tok/s':>15}"
    )
    print(f"{header} {'ratio':>6}")
    for prompts, n, lengths, new_tokens in WORKLOADS:
        requests = random_requests(rng, prompts, lengths)
        for eos in (False, True):
            # Without eos every row runs the full budget: this isolates the per-step cost of the loops.
            # With it rows finish at random times, as RL responses do.
            model.generation_config.eos_token_id = EOS if eos else []
            sampler = HFSampler(model, tokenizer)
            ours, theirs = best_rates(
                [
                    partial(hone_run, sampler, requests, n, new_tokens),
                    partial(hf_run, model, requests, n, new_tokens, eos),
                ]
            )
            shape = f"{prompts} x {n} x {new_tokens} ({lengths[0]}-{lengths[1]})"
            row = f"{shape:>31} {'on' if eos else 'off':>4} {ours:>16,.0f} {theirs:>15,.0f}"
            print(f"{row} {ours / theirs:>5.1f}x")

    model.generation_config.eos_token_id = EOS
    header = f"{'prompts x n x new x turns (prompt len, obs)':>44} {'cache tok/s':>12} {'no cache tok/s':>15}"
    print(f"\n{header} {'ratio':>6}")
    for prompts, n, lengths, new_tokens, turns, obs_len in CONVERSATIONS:
        requests = random_requests(rng, prompts, lengths)
        obs = random_requests(rng, 1, (obs_len, obs_len))[0].prompt_ids
        cached, fresh = best_rates(
            [
                partial(conversation_run, HFSampler(model, tokenizer), requests, n, new_tokens, turns, obs),
                partial(
                    conversation_run,
                    HFSampler(model, tokenizer, prefix_cache=False),
                    requests,
                    n,
                    new_tokens,
                    turns,
                    obs,
                ),
            ]
        )
        shape = f"{prompts} x {n} x {new_tokens} x {turns} ({lengths[0]}-{lengths[1]}, {obs_len})"
        print(f"{shape:>44} {cached:>12,.0f} {fresh:>15,.0f} {cached / fresh:>5.1f}x")


if __name__ == "__main__":
    main()
