"""The machine's ceiling for Hone's RL step, and how close the step runs to it.

    .venv/bin/python bench/limits.py                       # SmolLM2 workload, fp32 and bf16 (~6 minutes)
    .venv/bin/python bench/limits.py --workload tiny --dtype fp32

1. Ceiling: measured matmul FLOP/s on these cores (2 threads) at the model's shapes (attention
   projections, MLP, LM head; rows = the step's training tokens), fp32 and bf16; and memory bandwidth
   (a large copy), which bounds decoding.
2. Achieved: a few Hone RL steps of `bench/vs_trl.py`'s workload. Training: model FLOPs (Kaplan's 6 N T for
   the blocks over every real token, plus the LM head over response tokens only, as Hone computes it;
   attention's T² term and padding not counted, as MFU is usually reported) over `time/train_s`, against
   the ceiling in the dtype the step computes in. Generation: 2 N FLOPs per new token over
   `time/sample_s`, and the weight bytes a decode step must read against the bandwidth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from vs_trl import THREADS, WORKLOADS, Workload, hone_config, ordered_prompts


def matmul_flops(m: int, k: int, n: int, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """FLOP/s of [m, k] @ [k, n] in `dtype`, best of repeated timings over ~`seconds`."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best, spent = float("inf"), 0.0
    while spent < seconds:
        t0 = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return 2 * m * k * n / best


def bandwidth_gb_s(megabytes: int = 512) -> float:
    """Copy bandwidth (read + write) of a `megabytes` fp32 tensor, best of 5."""
    x = torch.empty(megabytes * 2**20 // 4)
    y = torch.empty_like(x)
    best = min(_timed(lambda: y.copy_(x)) for _ in range(5))
    return 2 * x.numel() * 4 / best / 1e9


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def model_shapes(config: object) -> dict[str, tuple[int, int, int]]:
    """(k, n, count per layer) of the model's matmuls: [tokens, k] @ [k, n]."""
    h = config.hidden_size  # type: ignore[attr-defined]
    heads = config.num_attention_heads  # type: ignore[attr-defined]
    kv = getattr(config, "num_key_value_heads", heads)
    head_dim = getattr(config, "head_dim", None) or h // heads
    inter = config.intermediate_size  # type: ignore[attr-defined]
    return {
        "q, o projections": (h, heads * head_dim, 2),
        "k, v projections": (h, kv * head_dim, 2),
        "MLP up, gate": (h, inter, 2),
        "MLP down": (inter, h, 1),
        "LM head": (h, config.vocab_size, 0),  # type: ignore[attr-defined]
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="smollm2", choices=sorted(WORKLOADS))
    parser.add_argument("--dtype", default="fp32,bf16")
    ns = parser.parse_args()
    torch.set_num_threads(THREADS)
    w: Workload = WORKLOADS[ns.workload]

    from transformers import AutoConfig, AutoTokenizer

    from hone.config import load_config
    from hone.models.resolve import resolve_model
    from hone.rl import loop

    path = resolve_model(w.model)
    config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    shapes = model_shapes(config)
    layers = config.num_hidden_layers
    block_params = layers * sum(k * n * c for k, n, c in shapes.values())
    head_params = config.hidden_size * config.vocab_size

    out: dict[str, object] = {"workload": ns.workload, "threads": THREADS}
    print(f"== {ns.workload} ({path}), {THREADS} threads")
    print(f"   bandwidth {bandwidth_gb_s():.1f} GB/s (copy)")
    for dtype in ns.dtype.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            prompts = ordered_prompts(w, tmp, dtype)
            cfg = load_config(None, hone_config(w, tmp, dtype))
            loop.train(cfg)
            rows = [json.loads(x) for x in (Path(tmp) / "hone" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "time/step_s" in r][w.warmup :]

        def prompt_len(text: str) -> int:
            if w.chat_template:  # rendered to text, then tokenized, as Hone's prompts are
                messages = [{"role": "user", "content": text}]
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                return len(tokenizer(text, add_special_tokens=False)["input_ids"])
            return len(tokenizer(text)["input_ids"])

        per_step = w.prompts_per_step
        prompt_tokens = statistics.fmean(
            sum(prompt_len(p["prompt"]) for p in prompts[s * per_step : (s + 1) * per_step]) * w.n
            for s in range(w.warmup, w.steps)
        )
        response_tokens = statistics.fmean(r["response_length/mean"] * per_step * w.n for r in steps)
        tokens = prompt_tokens + response_tokens
        train_flops = 6 * block_params * tokens + 6 * head_params * response_tokens
        # What the step computes with trainer.shared_prompts: each group's prompt once.
        done_flops = (
            6 * block_params * (prompt_tokens / w.n + response_tokens) + 6 * head_params * response_tokens
        )
        train_s = statistics.median(r["time/train_s"] for r in steps)
        sample_s = statistics.median(r["time/sample_s"] for r in steps)
        compute = torch.bfloat16 if dtype == "bf16" else torch.float32
        rows_m = int(tokens)
        ceilings = {
            name: matmul_flops(rows_m if count else int(response_tokens), k, n, compute)
            for name, (k, n, count) in shapes.items()
        }
        weights = {name: k * n * (count * layers or 1) for name, (k, n, count) in shapes.items()}
        ceiling = sum(weights.values()) / sum(weights[n] / f for n, f in ceilings.items())  # FLOP-weighted
        achieved = train_flops / train_s
        computed = done_flops / train_s
        decode_flops = 2 * (block_params + head_params) * response_tokens / sample_s
        print(f"-- {dtype}: {tokens:.0f} training tokens a step ({response_tokens:.0f} response)")
        for name, f in ceilings.items():
            print(f"   ceiling {name:<18} {f / 1e9:>8.0f} GFLOP/s")
        print(f"   ceiling (FLOP-weighted)    {ceiling / 1e9:>8.0f} GFLOP/s")
        print(
            f"   training: {train_flops / 1e9:.0f} GFLOP in {train_s:.2f} s = {achieved / 1e9:.0f} GFLOP/s, "
            f"MFU {achieved / ceiling:.0%}"
        )
        print(
            f"   training, FLOPs computed (each group's prompt once): {done_flops / 1e9:.0f} GFLOP = "
            f"{computed / 1e9:.0f} GFLOP/s, {computed / ceiling:.0%} of the ceiling"
        )
        print(
            f"   generation: {decode_flops / 1e9:.0f} GFLOP/s in {sample_s:.2f} s "
            f"({response_tokens / sample_s:.0f} tok/s)"
        )
        out[dtype] = {
            "ceilings_gflops": {k: v / 1e9 for k, v in ceilings.items()},
            "ceiling_gflops": ceiling / 1e9,
            "train_gflops": achieved / 1e9,
            "mfu": achieved / ceiling,
            "computed_fraction_of_ceiling": computed / ceiling,
            "train_s": train_s,
            "sample_s": sample_s,
            "generation_gflops": decode_flops / 1e9,
            "tokens": tokens,
            "response_tokens": response_tokens,
        }
    (Path(__file__).parent / "results" / f"limits_{ns.workload}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
