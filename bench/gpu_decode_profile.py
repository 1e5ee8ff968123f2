"""What bounds generation on a GPU: Hone's HF sampler and transformers' `generate` (TRL's path) on the
`qwen05b` workload's shape (128 rows x 128 new tokens, bf16 weights), timed and profiled.

    python3 bench/gpu_decode_profile.py          # on the GPU machine, from bench/gpu_check.sh's setup

Prints per framework: wall time per decode step, the GPU's busy time (sum of kernel times from
`torch.profiler`) as a share of the wall time, kernel launches per step, and the weight bytes a decode step
reads against the copy bandwidth. A share far below 1 means the host (Python, launches) bounds decoding.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from vs_trl import WORKLOADS, model_path

from hone.rollout.base import GenerationRequest
from hone.rollout.engines.hf import HFSampler
from hone.types import SamplingParams

ROWS_PER_PROMPT, PROMPTS, NEW = 8, 16, 128


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    new = NEW if device == "cuda" else 8
    path = model_path(WORKLOADS["qwen05b"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    prompt = tokenizer("Tom has 3 apples and buys 4 more. How many apples does he have now?")["input_ids"]
    requests = [GenerationRequest(sample_id=str(i), group_id=i, prompt_ids=prompt) for i in range(PROMPTS)]
    # min_new_tokens keeps both at exactly `new` tokens (a random model's EOS is rare, but equal work).
    params = SamplingParams(n=ROWS_PER_PROMPT, temperature=1.0, max_new_tokens=new, seed=0)
    sampler = HFSampler(model, tokenizer, max_batch_size=512, prefix_cache=False)
    ids = torch.tensor([prompt] * (PROMPTS * ROWS_PER_PROMPT), device=device)

    def hone() -> None:
        sampler.generate(requests, params)

    def hf() -> None:
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=new,
                min_new_tokens=new,
                top_k=0,
                top_p=1.0,
                pad_token_id=tokenizer.pad_token_id,
            )

    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for name, fn in (("hone HFSampler", hone), ("transformers generate", hf)):
        fn()  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
        events = prof.key_averages()
        # Kernel events only: an aten op's self device time is its kernels' time again.
        kernel_us = sum(
            e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
        )
        launches = sum(e.count for e in events if e.key.startswith("cudaLaunchKernel"))
        print(
            f"{name:>22}: {wall:.2f} s for {new} tokens x {PROMPTS * ROWS_PER_PROMPT} rows = "
            f"{wall / new * 1e3:.1f} ms/step; GPU busy {kernel_us / 1e6:.2f} s "
            f"({kernel_us / 1e6 / wall:.0%} of the unprofiled wall time); {launches / new:.0f} kernel "
            f"launches/step; weights {weight_bytes / 1e9:.2f} GB a step = "
            f"{weight_bytes / 4.3e12 * 1e3:.2f} ms at 4.3 TB/s"
        )
        print(events.table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=40))


if __name__ == "__main__":
    main()
