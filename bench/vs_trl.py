"""Hone against TRL's `GRPOTrainer` on equal work, each framework in its own subprocess, alternating.

    .venv/bin/pip install -e ".[bench]"           # trl
    .venv/bin/python bench/vs_trl.py              # both workloads, 2 rounds (~25 minutes)
    .venv/bin/python bench/vs_trl.py --workloads tiny --rounds 3 --dtype bf16
    python3 bench/vs_trl.py --device cuda --workloads qwen05b --dtype bf16   # on a GPU (bench/gpu_check.sh)

Equal work: the same weights, tokenizer, prompts in the same order (Hone's `PromptStream` order, given
to TRL unshuffled), group size, prompts per step, max new tokens, temperature, lr (constant), no KL,
one optimizer step per batch (no mini-batches, one PPO epoch, no recomputed old log-probs), clip 0.2,
token-mean loss over the batch (TRL's `dapo`), group-std advantages, grad-norm clip 1.0, fused AdamW
(β 0.9/0.999, no weight decay; TRL `adamw_torch_fused`, transformers' default), the same reward
function (Hone's math verifier), 2 threads each; no dynamic filtering (Hone's
`skip_zero_variance_groups` off: TRL trains on every group). `--dtype` picks fp32 for both or each
framework's bf16 mode (Hone: `trainer.autocast: bfloat16` and a bf16 copy of the weights for sampling,
`rollout.dtype: bfloat16`; TRL: `bf16=True`, accelerate's autocast); the trained weights and the
optimizer stay fp32 either way.

A third arm, `hone-trl`, is Hone with the same reward written TRL's way (`fn(completions, answer,
**kwargs)`, one call per batch: `reward.contract` trl), so the TRL contract's own cost is measured beside
the native arm in the same rounds.

Per framework: median/min/max step time after the warm-up steps, the generation share of the step,
new tokens/s, peak RSS of its process (and peak GPU memory), and the mean reward over the timed steps;
then TRL/Hone ratios. Writes `bench/results/vs_trl_<dtype>[_cuda].json`.

On a GPU (`--device cuda`) the `qwen05b` workload is a randomly initialised model of Qwen2.5-0.5B's
widths with 32 layers and SmolLM2's tokenizer (0.52 B parameters): the GPU machine reaches no hub, and its
64 MiB upload cannot carry real weights. Its rewards are all 0 (a random model never answers), so it
measures speed only; both frameworks still run the full loss and backward. Both sample with Hugging Face
code (Hone's HF sampler, TRL's `generate`): vLLM, each one's fastest sampler, is not installable there.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

THREADS = 2
SEED = 0
# `random:` models are built by `random_model_dir` (the GPU machine has no hub and no room for weights).
RANDOM_MODELS: dict[str, dict[str, Any]] = {
    # Qwen2.5-0.5B's widths (hidden 896, MLP 4864, 14 query / 2 KV heads), 32 layers instead of 24 and
    # SmolLM2's 49k vocabulary instead of 152k, so the parameter count stays ~0.5 B with a tokenizer we ship.
    "random:qwen2.5-0.5b-shape": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 32,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    }
}


@dataclass(frozen=True)
class Workload:
    model: str  # a Hone model reference (alias or directory)
    task: str
    task_args: dict[str, Any]
    chat_template: bool
    prompts_per_step: int
    n: int
    max_new_tokens: int
    temperature: float
    lr: float
    steps: int  # timed steps + warm-up
    warmup: int
    # "math" (Hone's verifier, against the task's answer) or "crc" (`crc_reward`, for random models).
    reward: str = "math"


WORKLOADS = {
    # The demo's model (~1 M parameters) and task.
    "tiny": Workload(
        model="tiny",
        task="arithmetic",
        task_args={"min_digits": 2, "max_digits": 3, "ops": "+", "pad": True},
        chat_template=False,
        prompts_per_step=16,
        n=8,
        max_new_tokens=8,
        temperature=1.0,
        lr=1e-4,
        steps=14,
        warmup=2,
    ),
    # SmolLM2-135M-Instruct on the smollm2-math recipe's word problems (`make setup-smollm2`).
    "smollm2": Workload(
        model="smollm2-135m-instruct",
        task="word_problems",
        task_args={},
        chat_template=True,
        prompts_per_step=4,
        n=8,
        max_new_tokens=48,
        temperature=0.7,
        lr=2e-5,
        steps=3,
        warmup=1,
    ),
    # GPU only (`--device cuda`): see the module docstring.
    "qwen05b": Workload(
        model="random:qwen2.5-0.5b-shape",
        task="word_problems",
        task_args={},
        chat_template=True,
        prompts_per_step=16,
        n=8,
        max_new_tokens=128,
        temperature=1.0,
        lr=1e-6,
        steps=6,
        warmup=2,
        reward="crc",
    ),
}


def crc_reward(text: str) -> float:
    """0 or 1 from a checksum of the text: a random model never answers a task, and all-zero rewards
    leave no advantage, so nothing would reach the loss. This varies within groups, as real rewards do."""
    return float(zlib.crc32(text.encode()) % 2)


def hone_crc_reward(rollout: Any, sample: Any) -> float:
    return crc_reward(rollout.response_text)


# The `hone-trl` arm: Hone with the same rewards written TRL's way (one call per batch, TRL's keyword
# arguments), as a TRL user brings them, to measure what the contract's adapter costs.
REQUIRE_EVALUATED = False  # the task's math-reward setting, set by the child


def trl_math_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    from hone.verifiers.math import math_reward

    return [
        math_reward(c, a, require_evaluated=REQUIRE_EVALUATED)
        for c, a in zip(completions, answer, strict=True)
    ]


def trl_crc_reward(completions: list[str], **_: Any) -> list[float]:
    return [crc_reward(c) for c in completions]


def random_model_dir(name: str) -> Path:
    """Build (once, cached in the temp dir) the random model `name` with SmolLM2's tokenizer.

    The tokenizer comes from `HONE_BENCH_TOKENIZER` (a directory) or the `smollm2-135m-instruct` alias.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    fields = dict(RANDOM_MODELS[name])
    digest = zlib.crc32(json.dumps(fields, sort_keys=True).encode())  # an edited shape is a new build
    out = Path(tempfile.gettempdir()) / f"hone-bench-{name.partition(':')[2]}-{digest:08x}"
    if (out / "config.json").exists():
        return out
    source = os.environ.get("HONE_BENCH_TOKENIZER")
    if source is None:
        from hone.models.resolve import resolve_model

        source = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.for_model(
        fields.pop("model_type"),
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **fields,
    )
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_suffix(".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)  # whole or absent: a killed build is not mistaken for a model
    return out


def model_path(w: Workload) -> str:
    if w.model.startswith("random:"):
        return str(random_model_dir(w.model))
    from hone.models.resolve import resolve_model

    return resolve_model(w.model)


def on_gpu(device: str) -> bool:
    return device.startswith("cuda")


def settings(w: Workload, dtype: str) -> dict[str, dict[str, Any]]:
    """The two configurations side by side, in each framework's own names."""
    hone = {
        "completions per step": f"data.prompts_per_step={w.prompts_per_step} x rollout.n={w.n}",
        "optimizer steps per step": "trainer.mini_batches=1, ppo_epochs=1",
        "max new tokens": f"rollout.max_new_tokens={w.max_new_tokens}",
        "temperature": f"rollout.temperature={w.temperature}",
        "dtype": f"model.dtype=float32, trainer.autocast={'bfloat16' if dtype == 'bf16' else 'none'}, "
        f"rollout.dtype={'bfloat16' if dtype == 'bf16' else 'model'}",
        "KL": "algorithm.kl.coef=0 (no reference model)",
        "clip": "algorithm.policy_loss=ppo (0.2)",
        "aggregation": "token-mean over the batch",
        "advantage": "grpo, norm_by_std (eps 1e-6)",
        "old log-probs": "sampler's (no extra forward)",
        "lr": f"{w.lr} constant",
        "optimizer": "torch AdamW (fused), grad clip 1.0, no gradient checkpointing",
        "filtering": "skip_zero_variance_groups=false",
    }
    trl = {
        "completions per step": f"per_device_train_batch_size={w.prompts_per_step * w.n}, "
        f"num_generations={w.n}",
        "optimizer steps per step": "gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1",
        "max new tokens": f"max_completion_length={w.max_new_tokens}",
        "temperature": f"temperature={w.temperature}, top_p=1.0, top_k=0",
        "dtype": f"fp32 weights, bf16={dtype == 'bf16'}",
        "KL": "beta=0.0 (no reference model)",
        "clip": "epsilon=0.2",
        "aggregation": "loss_type=dapo (token-mean over the batch)",
        "advantage": "scale_rewards=group (std eps 1e-4)",
        "old log-probs": "the step's own, detached (no extra forward)",
        "lr": f"{w.lr} lr_scheduler_type=constant",
        "optimizer": "optim=adamw_torch_fused, max_grad_norm=1.0, gradient_checkpointing=False",
        "filtering": "none",
    }
    return {"hone": hone, "trl": trl}


def hone_config(
    w: Workload, run_dir: str, dtype: str, device: str = "cpu", trl_rewards: bool = False
) -> list[str]:
    overrides: dict[str, Any] = {
        "run.dir": run_dir,
        "run.name": "hone",
        "run.seed": SEED,
        "run.steps": w.steps,
        "run.threads": "null" if on_gpu(device) else THREADS,
        "run.time_limit_s": "null",
        "run.eval_every": 0,
        "run.save_every": 0,
        "model.path": model_path(w),
        "model.device": device,
        "model.dtype": "float32",
        "data.task": w.task,
        "data.task_args": json.dumps(w.task_args),
        "data.chat_template": w.chat_template,
        "data.eval_size": 1,
        "data.prompts_per_step": w.prompts_per_step,
        "rollout.n": w.n,
        "rollout.temperature": w.temperature,
        "rollout.max_new_tokens": w.max_new_tokens,
        "reward.fn": _reward_fn(w, trl_rewards),
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "ppo",
        "algorithm.old_log_probs": "sampler",
        "algorithm.skip_zero_variance_groups": False,
        "algorithm.kl.coef": 0.0,
        "trainer.lr": w.lr,
        "trainer.schedule": "constant",
        "trainer.grad_clip": 1.0,
        "trainer.autocast": "bfloat16" if dtype == "bf16" else "none",
        "rollout.dtype": "bfloat16" if dtype == "bf16" else "model",
        "sft.enabled": False,
        "eval.n": 1,
        "eval.k": "[1]",
        "logging.progress": False,
        "logging.tensorboard": False,
    }
    if on_gpu(device):  # the step's whole batch in one forward, as TRL's per_device_train_batch_size does
        overrides["trainer.micro_batch_tokens"] = 1 << 17
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]


def _reward_fn(w: Workload, trl_rewards: bool) -> str:
    if trl_rewards:
        return "vs_trl:trl_math_reward" if w.reward == "math" else "vs_trl:trl_crc_reward"
    return "math" if w.reward == "math" else "vs_trl:hone_crc_reward"


def ordered_prompts(w: Workload, run_dir: str, dtype: str, device: str = "cpu") -> list[dict[str, str]]:
    """The prompts Hone's run draws, in its order (its `PromptStream`), with their answers."""
    from hone.config import load_config
    from hone.data.schedulers import PromptStream
    from hone.data.splits import load_data

    cfg = load_config(None, hone_config(w, run_dir, dtype, device))
    task, train, _ = load_data(cfg.data, eval_size=cfg.eval.size, seed=cfg.run.seed)
    stream = PromptStream(train, w.prompts_per_step, SEED)
    # The task's own setting of Hone's math reward (arithmetic: an unevaluated "12+7" is not an answer).
    require = bool(task.reward_args.get("math", {}).get("require_evaluated", False)) if task else False
    return [
        {"prompt": s.prompt, "answer": str(s.answer), "require_evaluated": require}
        for step in range(w.steps)
        for s in stream.batch(step)
    ]


def run_hone(w: Workload, dtype: str, work: Path, device: str, trl_rewards: bool = False) -> dict[str, Any]:
    import torch

    from hone.config import load_config
    from hone.data.splits import load_task
    from hone.rl import loop

    if not on_gpu(device):
        torch.set_num_threads(THREADS)
    cfg = load_config(None, hone_config(w, str(work), dtype, device, trl_rewards))
    task = load_task(cfg.data)
    global REQUIRE_EVALUATED
    REQUIRE_EVALUATED = (
        bool(task.reward_args.get("math", {}).get("require_evaluated", False)) if task else False
    )
    result = loop.train(cfg)
    rows = [json.loads(x) for x in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step_s" in r]
    return {
        "step_s": [r["time/step_s"] for r in steps],
        "generate_s": [r["time/sample_s"] for r in steps],
        "new_tokens": [r["throughput/tokens_per_s"] * r["time/step_s"] for r in steps],
        "reward": [r["reward/mean"] for r in steps],
        "mismatch": [r.get("mismatch/logprob_abs") for r in steps],
        "train_s": [r["time/train_s"] for r in steps],
        "response_tokens": [r["response_length/mean"] * w.prompts_per_step * w.n for r in steps],
    }


def run_trl(w: Workload, dtype: str, work: Path, device: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hone.verifiers.math import math_reward

    if not on_gpu(device):
        torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    rows = json.loads((work / "prompts.json").read_text())
    path = model_path(w)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def prompt(text: str) -> Any:
        return [{"role": "user", "content": text}] if w.chat_template else text

    dataset = Dataset.from_list([{"prompt": prompt(r["prompt"]), "answer": r["answer"]} for r in rows])
    require = rows[0]["require_evaluated"]

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        if w.reward == "crc":
            return [crc_reward(t) for t in texts]
        return [math_reward(t, a, require_evaluated=require) for t, a in zip(texts, answer, strict=True)]

    args = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=w.prompts_per_step * w.n,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=w.n,
        num_iterations=1,
        max_completion_length=w.max_new_tokens,
        temperature=w.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",  # transformers' default; Hone's trainer.fused_adamw
        gradient_checkpointing=False,  # TRL's GRPO default is on; Hone's model.gradient_checkpointing is off
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        max_steps=w.steps,
        shuffle_dataset=False,
        seed=SEED,
        bf16=dtype == "bf16",
        use_cpu=not on_gpu(device),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    times: dict[str, list[float]] = {"step_s": [], "generate_s": [], "new_tokens": [], "reward": []}
    began: list[float] = []

    def sync() -> None:
        if on_gpu(device):
            torch.cuda.synchronize()

    class Timer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            sync()
            began.append(time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync()  # the step's kernels, not the next step's, own their time
            times["step_s"].append(time.perf_counter() - began[-1])

        def on_log(
            self, _args: Any, _state: Any, _control: Any, logs: dict[str, float] | None = None, **__: Any
        ) -> None:
            if logs and "reward" in logs:
                times["reward"].append(logs["reward"])
                times["new_tokens"].append(logs["completions/mean_length"] * w.prompts_per_step * w.n)

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.add_callback(Timer())
    generate = trainer._generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        sync()
        t0 = time.perf_counter()
        out = generate(*a, **k)
        sync()
        times["generate_s"].append(time.perf_counter() - t0)
        return out

    trainer._generate = timed_generate  # type: ignore[method-assign]
    trainer.train()
    return times


def child(framework: str, workload: str, dtype: str, device: str, work: Path) -> None:
    w = WORKLOADS[workload]
    if framework == "trl":
        result = run_trl(w, dtype, work, device)
    else:
        result = run_hone(w, dtype, work, device, trl_rewards=framework == "hone-trl")
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if on_gpu(device):
        import torch

        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    (work / f"{framework}.json").write_text(json.dumps(result))


def summary(runs: list[dict[str, Any]], w: Workload) -> dict[str, float]:
    timed = [(r, k) for r in runs for k in range(w.warmup, len(r["step_s"]))]
    steps = [r["step_s"][k] for r, k in timed]
    generate = sum(r["generate_s"][k] for r, k in timed)
    return {
        "median_s": statistics.median(steps),
        "min_s": min(steps),
        "max_s": max(steps),
        "generate_share": generate / sum(steps),
        "tokens_per_s": sum(r["new_tokens"][k] for r, k in timed) / sum(steps),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "peak_gpu_mb": max(r.get("peak_gpu_mb", 0.0) for r in runs),
        "reward": statistics.fmean(r["reward"][k] for r, k in timed),
    }


def gpu_utilisation(w: Workload, hone_runs: list[dict[str, Any]], device: str = "cuda") -> dict[str, float]:
    """Hone's training-step MFU on the GPU against a measured bf16 matmul peak and the datasheet's 989.

    FLOPs as `limits.py` counts them: 6 N T for the blocks over every token of every row (prompt and
    response) plus the LM head over response tokens, over `time/train_s` (forward, backward, optimizer).
    """
    import torch
    from transformers import AutoConfig, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).parent))
    from limits import model_shapes

    path = model_path(w)
    config, tokenizer = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    block = config.num_hidden_layers * sum(k * n * c for k, n, c in model_shapes(config).values())
    head = config.hidden_size * config.vocab_size
    prompts = json.loads(Path(tempfile.gettempdir(), "hone-bench-prompts.json").read_text())
    messages = [[{"role": "user", "content": p["prompt"]}] for p in prompts]
    prompt_len = statistics.fmean(  # rendered to text, then tokenized, as Hone's prompts are
        len(
            tokenizer(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False))[
                "input_ids"
            ]
        )
        for m in messages
    )
    flops, seconds = 0.0, 0.0
    for run in hone_runs:
        for k in range(w.warmup, len(run["train_s"])):
            response = run["response_tokens"][k]
            tokens = prompt_len * w.prompts_per_step * w.n + response
            flops += 6 * block * tokens + 6 * head * response
            seconds += run["train_s"][k]
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize(device)
    peak = 2 * 8192**3 * 20 / (time.perf_counter() - t0)
    achieved = flops / seconds
    return {
        "train_tflops": achieved / 1e12,
        "peak_tflops_measured": peak / 1e12,
        "mfu_measured": achieved / peak,
        "mfu_datasheet": achieved / 989e12,
        "params_b": (block + head) / 1e9,
        "prompt_tokens_mean": prompt_len,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", default="tiny,smollm2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU workload")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--child",
        nargs=5,
        metavar=("FRAMEWORK", "WORKLOAD", "DTYPE", "DEVICE", "DIR"),
        help=argparse.SUPPRESS,
    )
    ns = parser.parse_args()
    if ns.child:
        framework, workload, dtype, device, work = ns.child
        child(framework, workload, dtype, device, Path(work))
        return
    results: dict[str, Any] = {}
    ns.out.mkdir(parents=True, exist_ok=True)
    out = ns.out / f"vs_trl_{ns.dtype}{'_cuda' if on_gpu(ns.device) else ''}.json"
    for name in ns.workloads.split(","):
        w = WORKLOADS[name]
        print(
            f"\n== {name}: {w.prompts_per_step} prompts x {w.n} samples x {w.max_new_tokens} new tokens, "
            f"{ns.dtype}"
        )
        side = settings(w, ns.dtype)
        for key in side["hone"]:
            print(f"  {key:>26}  hone: {side['hone'][key]:<52} trl: {side['trl'][key]}")
        runs: dict[str, list[dict[str, Any]]] = {"hone": [], "hone-trl": [], "trl": []}
        arms = list(runs)
        for round_ in range(ns.rounds):
            order = arms[round_ % 3 :] + arms[: round_ % 3]  # each arm first, middle and last in turn
            for framework in order:
                with tempfile.TemporaryDirectory() as tmp:
                    work = Path(tmp)
                    prompts = json.dumps(ordered_prompts(w, tmp, ns.dtype, ns.device))
                    (work / "prompts.json").write_text(prompts)
                    Path(tempfile.gettempdir(), "hone-bench-prompts.json").write_text(prompts)
                    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
                    if not on_gpu(ns.device):
                        env["OMP_NUM_THREADS"] = str(THREADS)
                    cmd = [sys.executable, __file__, "--child", framework, name, ns.dtype, ns.device, tmp]
                    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
                    runs[framework].append(json.loads((work / f"{framework}.json").read_text()))
                    last = runs[framework][-1]["step_s"][w.warmup :]
                    print(
                        f"  round {round_ + 1} {framework}: median step {statistics.median(last):.3f} s",
                        flush=True,
                    )
                    results[name] = {
                        "workload": asdict(w),
                        "dtype": ns.dtype,
                        "device": ns.device,
                        "settings": side,
                        "runs": runs,
                    }
                    out.write_text(json.dumps(results, indent=1))  # a run cut short keeps its rounds
        table = {fw: summary(r, w) for fw, r in runs.items()}
        results[name]["summary"] = table
        if on_gpu(ns.device):
            results[name]["gpu"] = gpu_utilisation(w, runs["hone"])
        print(
            f"  {'':>6} {'median s':>9} {'min':>7} {'max':>7} {'gen share':>9} {'tok/s':>8} {'RSS MB':>8} "
            f"{'reward':>7}"
        )
        for fw, s in table.items():
            print(
                f"  {fw:>6} {s['median_s']:>9.3f} {s['min_s']:>7.3f} {s['max_s']:>7.3f} "
                f"{s['generate_share']:>9.0%} {s['tokens_per_s']:>8.0f} {s['peak_rss_mb']:>8.0f} "
                f"{s['reward']:>7.3f}"
            )
        h, t = table["hone"], table["trl"]
        print(
            f"  TRL/Hone step time {t['median_s'] / h['median_s']:.2f}x; "
            f"RSS Hone/TRL {h['peak_rss_mb']:.0f}/{t['peak_rss_mb']:.0f} MB"
        )
        a = table["hone-trl"]
        print(
            f"  Hone with TRL-style rewards / native: step time {a['median_s'] / h['median_s']:.3f}x, "
            f"reward {a['reward']:.3f} / {h['reward']:.3f}; "
            f"TRL/Hone-with-TRL-rewards {t['median_s'] / a['median_s']:.2f}x"
        )
        if on_gpu(ns.device):
            g = results[name]["gpu"]
            print(
                f"  peak GPU memory Hone/TRL {h['peak_gpu_mb']:.0f}/{t['peak_gpu_mb']:.0f} MB; Hone training "
                f"{g['train_tflops']:.1f} TFLOP/s = MFU {g['mfu_measured']:.1%} of the measured bf16 matmul "
                f"{g['peak_tflops_measured']:.0f} TFLOP/s ({g['mfu_datasheet']:.1%} of the datasheet's 989)"
            )
        out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
